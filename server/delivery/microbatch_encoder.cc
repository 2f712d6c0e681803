#include "server/delivery/microbatch_encoder.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "proto/wire/wire_format.h"
#include "scheduler/layout_gather.h"
#include "server/store/ndarray.h"

namespace rollpack {
namespace {

constexpr int kNDArrayDataField = 3;  // NDArray.data
constexpr int kMapKeyField = 1;       // map entry key
constexpr int kMapValueField = 2;     // map entry value

using wire::LengthDelimitedSize;
using wire::WriteLengthDelimitedHeader;

std::string SerializedArrayHead(v1::DType dtype, absl::Span<const int64_t> shape) {
  v1::NDArray head;
  head.set_dtype(dtype);
  head.mutable_shape()->Assign(shape.begin(), shape.end());
  return head.SerializeAsString();
}

// `bytes` low bytes of `bits`, little endian (layout.md section 12).
char* PutLittleEndian(uint64_t bits, int bytes, char* p) {
  for (int i = 0; i < bytes; ++i) *p++ = static_cast<char>((bits >> (8 * i)) & 0xFF);
  return p;
}

// What the micro-batch says about each of its sequences (lifecycle.md
// section 6), in the order of sample_ids. Small (a few values per
// sequence), so protobuf serializes it with the header's other fields.
void SetSequenceMetadata(const StepMetadata& metadata, absl::Span<const int> sequences,
                         v1::Microbatch* out) {
  const int64_t n = static_cast<int64_t>(sequences.size());
  for (int seq : sequences) {
    out->add_group_ids(metadata.group_ids[seq]);
    out->add_policy_versions(metadata.policy_versions[seq]);
  }
  for (const auto& [name, values] : metadata.scalars) {
    char* p = ResizeArray(&(*out->mutable_scalars())[name], v1::FLOAT64, {n});
    for (int seq : sequences) {
      uint64_t bits;
      std::memcpy(&bits, &values[seq], sizeof(bits));
      p = PutLittleEndian(bits, 8, p);
    }
  }
  if (metadata.advantage.estimator != AdvantageEstimator::kNone) {
    char* p = ResizeArray(out->mutable_advantages(), v1::FLOAT32, {n});
    for (int seq : sequences) {
      uint32_t bits;
      std::memcpy(&bits, &metadata.advantages[seq], sizeof(bits));
      p = PutLittleEndian(bits, 4, p);
    }
  }
}

int64_t NumBytes(v1::DType dtype, absl::Span<const int64_t> shape) {
  int64_t bytes = DTypeSize(dtype);
  for (int64_t d : shape) bytes *= d;
  return bytes;
}

}  // namespace

absl::Status MicrobatchEncoder::CheckRouting(const Step& step, int seq,
                                             const StoredSample& sample) const {
  const ModelSpec& model = step.model;
  const int64_t row_bytes =
      model.is_dense() ? 0
                       : int64_t{model.stored_layers()} * model.topk * model.stored_id_bytes();
  const int64_t want = sample.num_tokens() * row_bytes;
  const bool recompute = step.replay.source == ReplaySourceKind::kRecompute;
  if (model.is_dense()) return absl::OkStatus();  // nothing is gathered
  const std::string* routing = recompute ? recompute_routing_[seq].get() : &sample.experts;
  const int64_t have = routing != nullptr ? static_cast<int64_t>(routing->size()) : -1;
  if (have != want ||
      (!recompute && static_cast<int64_t>(sample.row_valid.size()) != sample.num_tokens())) {
    return absl::DataLossError(absl::StrCat(
        "step \"", step.step_id, "\": sample \"", step.sample_ids[seq], "\" holds ", have,
        " bytes of ", recompute ? "recompute " : "", "routing, the step's model needs ", want));
  }
  return absl::OkStatus();
}

absl::Status MicrobatchEncoder::Prepare(const Step& step, const MicrobatchRequest& request) {
  return Prepare(step, request, step.samples);
}

absl::Status MicrobatchEncoder::Prepare(
    const Step& step, const MicrobatchRequest& request,
    absl::Span<const std::shared_ptr<const StoredSample>> samples) {
  step_ = nullptr;
  samples_ = samples;
  recompute_routing_ = request.recompute_routing.empty()
                           ? absl::MakeConstSpan(step.replay.recompute_routing)
                           : request.recompute_routing;
  if (step.replay.source == ReplaySourceKind::kRecompute &&
      recompute_routing_.size() != step.sample_ids.size()) {
    return absl::InternalError(absl::StrCat("step \"", step.step_id, "\": recompute routing for ",
                                            recompute_routing_.size(), " of ",
                                            step.sample_ids.size(), " sequences"));
  }
  encoded_size_ = 0;
  empty_piece_ = false;
  first_held_ = -1;
  arrays_.clear();
  ragged_.Clear();
  head_.Clear();
  tail_.Clear();
  RETURN_IF_ERROR(step.layout.Describe(request.rank, request.index, &rank_));
  const GroupLayout& group = *rank_.group;
  const PieceSelection* piece = request.piece;
  const bool header = piece == nullptr || piece->header;
  auto held_here = [&](int seq) {
    return piece == nullptr || piece->owner.empty() || piece->owner[seq] == piece->self;
  };
  for (size_t ordinal = 0; ordinal < group.sequences.size(); ++ordinal) {
    const int seq = group.sequences[ordinal];
    if (header) head_.add_sample_ids(step.sample_ids[seq]);
    if (!held_here(seq)) continue;
    if (static_cast<size_t>(seq) >= samples.size() || samples[seq] == nullptr) {
      return absl::InternalError(absl::StrCat("step \"", step.step_id, "\": sample \"",
                                              step.sample_ids[seq], "\" is not at hand"));
    }
    // The runs gather as many rows as the step's record says; a sample
    // shorter than that would serve whatever memory follows it (a forged
    // cluster record, docs/cluster.md "Threat model").
    const int64_t planned = step.layout.lengths()[seq];
    if (samples[seq]->num_tokens() != planned) {
      return absl::DataLossError(absl::StrCat(
          "step \"", step.step_id, "\": sample \"", step.sample_ids[seq], "\" holds ",
          samples[seq]->num_tokens(), " tokens, the step's record says ", planned));
    }
    // Its routing is gathered with the step's model (a record's, in a
    // cluster): rows of the width that model gives, or not at all.
    RETURN_IF_ERROR(CheckRouting(step, seq, *samples[seq]));
    if (first_held_ < 0) first_held_ = static_cast<int>(ordinal);
  }
  if (!header && first_held_ < 0) {
    empty_piece_ = true;
    step_ = &step;
    return absl::OkStatus();
  }
  head_.set_step_id(step.step_id);
  head_.set_index(request.index);
  head_.set_num_microbatches(rank_.num_microbatches);
  if (header) {
    head_.set_local_cp_size(rank_.local_cp_size);
    head_.set_max_seqlen(group.max_seqlen);
    SetInt32Array(head_.mutable_cu_seqlens(), group.cu_seqlens);
    SetInt32Array(head_.mutable_cu_seqlens_padded(), group.cu_seqlens_padded);
    tail_.mutable_replay_layers()->Assign(rank_.replay_layers.begin(), rank_.replay_layers.end());
    tail_.set_workload(group.work_per_rank);
    tail_.set_local_cp_rank(rank_.local_cp_rank);
    // Every rank, every pipeline stage; a piece stream's header piece alone.
    if (!step.metadata.empty()) SetSequenceMetadata(step.metadata, group.sequences, &tail_);
  }
  if (piece == nullptr) {
    token_runs_ = rank_.token_runs;
    router_runs_ = rank_.router_runs;
  } else {
    v1::PieceRows* rows = tail_.mutable_piece();
    SelectRuns(rank_.token_runs, *piece, group.sequences, &piece_token_runs_,
               rows->mutable_token_rows());
    SelectRuns(rank_.router_runs, *piece, group.sequences, &piece_router_runs_,
               rows->mutable_router_rows());
    token_runs_ = piece_token_runs_;
    router_runs_ = piece_router_runs_;
    rows->set_header(header);
    if (piece->self >= 0) rows->set_member(piece->members[piece->self]);
    if (header && !piece->owner.empty()) {
      std::vector<int32_t> others;
      for (int seq : group.sequences) {
        if (piece->owner[seq] != piece->self) others.push_back(piece->owner[seq]);
      }
      std::sort(others.begin(), others.end());
      others.erase(std::unique(others.begin(), others.end()), others.end());
      for (int32_t m : others) rows->add_members(piece->members[m]);
    }
  }
  const int64_t token_rows = TotalRows(token_runs_);
  const int64_t router_rows = TotalRows(router_runs_);

  // `rows` of the array's shape[0] travel (all of them but in a piece).
  auto add_array = [&](Payload payload, int field_number, std::string map_key, v1::DType dtype,
                       std::vector<int64_t> shape, int64_t rows) {
    ArrayField field;
    field.payload = payload;
    field.field_number = field_number;
    field.map_key = std::move(map_key);
    field.array_head = SerializedArrayHead(dtype, shape);
    field.data_bytes = NumBytes(dtype, absl::MakeConstSpan(shape).subspan(1)) * rows;
    arrays_.push_back(std::move(field));
  };
  if (rank_.first_pipeline_stage || request.all_fields) {
    add_array(Payload::kTokens, v1::Microbatch::kTokensFieldNumber, "", v1::INT32,
              {rank_.local_tokens}, token_rows);
  }
  if ((rank_.last_pipeline_stage || request.all_fields) && first_held_ >= 0) {
    // Every sample of a pool has the same fields (the store enforces it); the
    // std::map's order is the deterministic serialization's key order.
    for (const auto& [name, field] : samples[group.sequences[first_held_]]->token_fields) {
      std::vector<int64_t> shape = {rank_.local_tokens};
      shape.insert(shape.end(), field.trailing_shape.begin(), field.trailing_shape.end());
      add_array(Payload::kTokenField, v1::Microbatch::kTokenFieldsFieldNumber, name, field.dtype,
                std::move(shape), token_rows);
    }
    // Ragged fields travel with the token fields, over the same rows
    // (layout.md section 13).
    RETURN_IF_ERROR(ragged_.Prepare(step, samples, group.sequences, first_held_, token_runs_));
  }
  const ModelSpec& model = step.model;
  if (!model.is_dense()) {
    const int64_t layers = static_cast<int64_t>(rank_.replay_layers.size());
    add_array(Payload::kReplayExperts, v1::Microbatch::kReplayExpertsFieldNumber, "",
              model.stored_id_bytes() == 1 ? v1::UINT8 : v1::UINT16,
              {rank_.router_rows, layers, int64_t{model.topk}}, router_rows);
    add_array(Payload::kReplayMask, v1::Microbatch::kReplayMaskFieldNumber, "", v1::UINT8,
              {rank_.router_rows}, router_rows);
  }

  encoded_size_ = head_.ByteSizeLong() + tail_.ByteSizeLong() + ragged_.encoded_size();
  for (const ArrayField& field : arrays_) encoded_size_ += ArrayFieldSize(field);
  step_ = &step;
  return absl::OkStatus();
}

size_t MicrobatchEncoder::ArrayFieldSize(const ArrayField& field) const {
  // proto3 leaves an empty bytes field out; so do we, to stay canonical.
  const size_t data = static_cast<size_t>(field.data_bytes);
  const size_t array =
      field.array_head.size() + (data > 0 ? LengthDelimitedSize(kNDArrayDataField, data) : 0);
  if (field.payload != Payload::kTokenField) return LengthDelimitedSize(field.field_number, array);
  // A map field is a repeated entry message {key = 1, value = 2}; protobuf
  // writes both, even when default.
  const size_t entry = LengthDelimitedSize(kMapKeyField, field.map_key.size()) +
                       LengthDelimitedSize(kMapValueField, array);
  return LengthDelimitedSize(field.field_number, entry);
}

absl::Status MicrobatchEncoder::Encode(absl::Span<char> out) const {
  if (step_ == nullptr) {
    return absl::FailedPreconditionError("encode micro-batch: nothing prepared");
  }
  if (empty_piece_) {
    return absl::FailedPreconditionError(
        absl::StrCat("encode micro-batch ", rank_.microbatch, ": this member has no rows of it"));
  }
  if (out.size() != encoded_size_) {
    return absl::InvalidArgumentError(absl::StrCat("encode micro-batch ", head_.index(),
                                                   ": output has ", out.size(),
                                                   " bytes, the encoding needs ", encoded_size_));
  }
  // Pass 1 writes everything but the arrays' data and notes where each goes;
  // pass 2 gathers (replay experts and mask come from one gather).
  uint8_t* p = reinterpret_cast<uint8_t*>(out.data());
  p = head_.SerializeWithCachedSizesToArray(p);
  std::vector<absl::Span<uint8_t>> data(arrays_.size());
  for (size_t i = 0; i < arrays_.size(); ++i) {
    const ArrayField& field = arrays_[i];
    const size_t bytes = static_cast<size_t>(field.data_bytes);
    const size_t array =
        field.array_head.size() + (bytes > 0 ? LengthDelimitedSize(kNDArrayDataField, bytes) : 0);
    if (field.payload == Payload::kTokenField) {
      const size_t entry = LengthDelimitedSize(kMapKeyField, field.map_key.size()) +
                           LengthDelimitedSize(kMapValueField, array);
      p = WriteLengthDelimitedHeader(field.field_number, entry, p);
      p = WriteLengthDelimitedHeader(kMapKeyField, field.map_key.size(), p);
      std::memcpy(p, field.map_key.data(), field.map_key.size());
      p += field.map_key.size();
      p = WriteLengthDelimitedHeader(kMapValueField, array, p);
    } else {
      p = WriteLengthDelimitedHeader(field.field_number, array, p);
    }
    std::memcpy(p, field.array_head.data(), field.array_head.size());
    p += field.array_head.size();
    if (bytes > 0) p = WriteLengthDelimitedHeader(kNDArrayDataField, bytes, p);
    data[i] = absl::MakeSpan(p, bytes);
    p += bytes;
  }
  {
    // Deterministic: Microbatch.scalars is a map, whose default order is
    // not canonical (and every member must send the same bytes).
    const int tail_size = tail_.GetCachedSize();
    google::protobuf::io::ArrayOutputStream stream(p, tail_size);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    tail_.SerializeWithCachedSizes(&coded);
    coded.Trim();
    if (coded.HadError() || coded.ByteCount() != tail_size) {
      return absl::InternalError(absl::StrCat("encode micro-batch ", head_.index(), ": wrote ",
                                              coded.ByteCount(), " bytes of its last fields, sized ",
                                              tail_size));
    }
    p += tail_size;
  }
  // Field 21, after the tail: framed and gathered in one go.
  RETURN_IF_ERROR(ragged_.Encode(absl::MakeSpan(p, ragged_.encoded_size())));
  p += ragged_.encoded_size();
  if (p != reinterpret_cast<uint8_t*>(out.data()) + out.size()) {
    return absl::InternalError(absl::StrCat("encode micro-batch ", head_.index(), ": wrote ",
                                            p - reinterpret_cast<uint8_t*>(out.data()),
                                            " bytes, sized ", encoded_size_));
  }
  for (size_t i = 0; i < arrays_.size(); ++i) {
    if (arrays_[i].payload == Payload::kReplayMask) continue;  // with the experts
    absl::Span<uint8_t> mask;
    if (arrays_[i].payload == Payload::kReplayExperts) mask = data[i + 1];
    RETURN_IF_ERROR(GatherPayload(arrays_[i], data[i], mask));
  }
  return absl::OkStatus();
}

absl::Status MicrobatchEncoder::GatherPayload(const ArrayField& field, absl::Span<uint8_t> out,
                                              absl::Span<uint8_t> mask_out) const {
  const Step& step = *step_;
  const GroupLayout& group = *rank_.group;
  // Only called for ordinals of the runs kept, whose samples are here.
  auto sample_of = [&](int ordinal) -> const StoredSample& {
    return *samples_[group.sequences[ordinal]];
  };
  switch (field.payload) {
    case Payload::kTokens:
      return GatherRows(
          token_runs_, sizeof(int32_t),
          [&](int ordinal) -> const void* { return sample_of(ordinal).tokens.data(); }, out);
    case Payload::kTokenField: {
      const StoredField& first = sample_of(first_held_).token_fields.at(field.map_key);
      return GatherRows(
          token_runs_, static_cast<size_t>(first.row_bytes()),
          [&](int ordinal) -> const void* {
            return sample_of(ordinal).token_fields.at(field.map_key).data.data();
          },
          out);
    }
    case Payload::kReplayExperts: {
      ReplaySpec spec;
      spec.num_experts = step.model.num_experts;
      spec.topk = step.model.topk;
      spec.id_bytes = step.model.stored_id_bytes();
      spec.payload_layers = step.layout.pipeline().stored_layers();  // |M| + routed D
      spec.layer_indices = rank_.replay_positions;
      return GatherReplay(
          router_runs_, spec,
          [&](int ordinal) {
            const StoredSample& sample = sample_of(ordinal);
            ReplaySource source;
            source.row_offset = 0;
            source.num_rows = sample.num_tokens();
            if (step.replay.source == ReplaySourceKind::kRecompute) {
              // R2 (layout.md section 11): every real token is replayable.
              source.experts = recompute_routing_[group.sequences[ordinal]]->data();
              source.valid = nullptr;
            } else {
              source.experts = sample.experts.data();
              source.valid = sample.row_valid.data();
            }
            return source;
          },
          out, mask_out);
    }
    case Payload::kReplayMask:
      break;
  }
  return absl::OkStatus();
}

void MicrobatchEncoder::SelectRuns(absl::Span<const RowRun> runs, const PieceSelection& piece,
                                   absl::Span<const int> sequences, std::vector<RowRun>* kept,
                                   google::protobuf::RepeatedField<int64_t>* spans) {
  kept->clear();
  spans->Clear();
  int64_t row = 0;
  for (const RowRun& run : runs) {
    if (!piece.owner.empty() && piece.owner[sequences[run.ordinal]] != piece.self) continue;
    const int n = spans->size();
    if (n > 0 && spans->Get(n - 2) + spans->Get(n - 1) == run.output_row) {
      spans->Set(n - 1, spans->Get(n - 1) + run.length);
    } else {
      spans->Add(run.output_row);
      spans->Add(run.length);
    }
    RowRun& copy = kept->emplace_back(run);
    copy.output_row = row;
    row += run.length;
  }
}

}  // namespace rollpack
