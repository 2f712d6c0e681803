#include "server/delivery/microbatch_encoder.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
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

int64_t NumBytes(v1::DType dtype, absl::Span<const int64_t> shape) {
  int64_t bytes = DTypeSize(dtype);
  for (int64_t d : shape) bytes *= d;
  return bytes;
}

}  // namespace

absl::Status MicrobatchEncoder::Prepare(const Step& step, const MicrobatchRequest& request) {
  return Prepare(step, request, step.samples);
}

absl::Status MicrobatchEncoder::Prepare(
    const Step& step, const MicrobatchRequest& request,
    absl::Span<const std::shared_ptr<const StoredSample>> samples) {
  step_ = nullptr;
  samples_ = samples;
  encoded_size_ = 0;
  arrays_.clear();
  head_.Clear();
  tail_.Clear();
  RETURN_IF_ERROR(step.layout.Describe(request.rank, request.index, &rank_));
  const GroupLayout& group = *rank_.group;
  head_.set_step_id(step.step_id);
  head_.set_index(request.index);
  head_.set_num_microbatches(rank_.num_microbatches);
  head_.set_local_cp_size(rank_.local_cp_size);
  head_.set_max_seqlen(group.max_seqlen);
  for (int seq : group.sequences) {
    if (static_cast<size_t>(seq) >= samples.size() || samples[seq] == nullptr) {
      return absl::InternalError(absl::StrCat("step \"", step.step_id, "\": sample \"",
                                              step.sample_ids[seq], "\" is not at hand"));
    }
    head_.add_sample_ids(step.sample_ids[seq]);
  }
  SetInt32Array(head_.mutable_cu_seqlens(), group.cu_seqlens);
  SetInt32Array(head_.mutable_cu_seqlens_padded(), group.cu_seqlens_padded);
  tail_.mutable_replay_layers()->Assign(rank_.replay_layers.begin(), rank_.replay_layers.end());
  tail_.set_workload(group.work_per_rank);
  tail_.set_local_cp_rank(rank_.local_cp_rank);

  auto add_array = [&](Payload payload, int field_number, std::string map_key, v1::DType dtype,
                       std::vector<int64_t> shape) {
    ArrayField field;
    field.payload = payload;
    field.field_number = field_number;
    field.map_key = std::move(map_key);
    field.array_head = SerializedArrayHead(dtype, shape);
    field.data_bytes = NumBytes(dtype, shape);
    arrays_.push_back(std::move(field));
  };
  if (rank_.first_pipeline_stage || request.all_fields) {
    add_array(Payload::kTokens, v1::Microbatch::kTokensFieldNumber, "", v1::INT32,
              {rank_.local_tokens});
  }
  if ((rank_.last_pipeline_stage || request.all_fields) && !group.sequences.empty()) {
    // Every sample of a pool has the same fields (the store enforces it); the
    // std::map's order is the deterministic serialization's key order.
    for (const auto& [name, field] : samples[group.sequences[0]]->token_fields) {
      std::vector<int64_t> shape = {rank_.local_tokens};
      shape.insert(shape.end(), field.trailing_shape.begin(), field.trailing_shape.end());
      add_array(Payload::kTokenField, v1::Microbatch::kTokenFieldsFieldNumber, name, field.dtype,
                std::move(shape));
    }
  }
  const ModelSpec& model = step.model;
  if (!model.is_dense()) {
    const int64_t layers = static_cast<int64_t>(rank_.replay_layers.size());
    add_array(Payload::kReplayExperts, v1::Microbatch::kReplayExpertsFieldNumber, "",
              model.stored_id_bytes() == 1 ? v1::UINT8 : v1::UINT16,
              {rank_.router_rows, layers, int64_t{model.topk}});
    add_array(Payload::kReplayMask, v1::Microbatch::kReplayMaskFieldNumber, "", v1::UINT8,
              {rank_.router_rows});
  }

  encoded_size_ = head_.ByteSizeLong() + tail_.ByteSizeLong();
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
  p = tail_.SerializeWithCachedSizesToArray(p);
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
  auto sample_of = [&](int ordinal) -> const StoredSample& {
    return *samples_[group.sequences[ordinal]];
  };
  switch (field.payload) {
    case Payload::kTokens:
      return GatherRows(
          rank_.token_runs, sizeof(int32_t),
          [&](int ordinal) -> const void* { return sample_of(ordinal).tokens.data(); }, out);
    case Payload::kTokenField: {
      const StoredField& first = sample_of(0).token_fields.at(field.map_key);
      return GatherRows(
          rank_.token_runs, static_cast<size_t>(first.row_bytes()),
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
      spec.payload_layers = static_cast<int>(step.layout.pipeline().moe_layers().size());
      spec.layer_indices = rank_.replay_positions;
      return GatherReplay(
          rank_.router_runs, spec,
          [&](int ordinal) {
            const StoredSample& sample = sample_of(ordinal);
            ReplaySource source;
            source.experts = sample.experts.data();
            source.row_offset = 0;
            source.num_rows = sample.num_tokens();
            source.valid = sample.row_valid.data();
            return source;
          },
          out, mask_out);
    }
    case Payload::kReplayMask:
      break;
  }
  return absl::OkStatus();
}

}  // namespace rollpack
