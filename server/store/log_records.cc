#include "server/store/log_records.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "rollpack/v1/member.pb.h"
#include "rollpack/v1/rollouts.pb.h"
#include "rollpack/v1/scheduler.pb.h"
#include "server/store/convert.h"
#include "server/store/little_endian.h"
#include "server/store/ndarray.h"

namespace rollpack {
namespace {

class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  void U32(uint32_t v) { PutU32(out_, v); }
  void U64(uint64_t v) {
    U32(static_cast<uint32_t>(v));
    U32(static_cast<uint32_t>(v >> 32));
  }
  void Bytes(absl::string_view s) {
    U64(s.size());
    out_->append(s.data(), s.size());
  }

 private:
  std::string* out_;
};

class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  bool U32(uint32_t* v) {
    if (in_.size() < 4) return false;
    *v = GetU32(in_.data());
    in_.remove_prefix(4);
    return true;
  }
  bool U64(uint64_t* v) {
    uint32_t lo, hi;
    if (!U32(&lo) || !U32(&hi)) return false;
    *v = (static_cast<uint64_t>(hi) << 32) | lo;
    return true;
  }
  bool Bytes(std::string* s) {
    uint64_t n;
    if (!U64(&n) || n > in_.size()) return false;
    s->assign(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }
  bool done() const { return in_.empty(); }
  size_t remaining() const { return in_.size(); }

 private:
  absl::string_view in_;
};

// The record types whose samples end with group_size and the piece trailer.
bool HasPieceTrailer(RecordType type) {
  return type == RecordType::kPieceSamples || type == RecordType::kRaggedSamples;
}

// `as_put`: without its later scalars (those go in kAnnotations records).
void EncodeSample(const StoredSample& s, RecordType type, bool as_put, Writer* w) {
  w->Bytes(s.sample_id);
  w->Bytes(s.group_id);
  w->U64(static_cast<uint64_t>(s.policy_version));
  w->Bytes(absl::string_view(reinterpret_cast<const char*>(s.tokens.data()),
                             s.tokens.size() * sizeof(int32_t)));
  w->Bytes(s.experts);
  w->Bytes(absl::string_view(reinterpret_cast<const char*>(s.row_valid.data()), s.row_valid.size()));
  w->U32(static_cast<uint32_t>(s.token_fields.size()));
  for (const auto& [name, field] : s.token_fields) {
    w->Bytes(name);
    w->U32(static_cast<uint32_t>(field.dtype));
    w->U32(static_cast<uint32_t>(field.trailing_shape.size()));
    for (int64_t d : field.trailing_shape) w->U64(static_cast<uint64_t>(d));
    w->Bytes(field.data);
  }
  const size_t later = as_put ? s.later_scalars.size() : 0;
  w->U32(static_cast<uint32_t>(s.scalars.size() - later));
  for (const auto& [name, value] : s.scalars) {
    if (later > 0 &&
        std::binary_search(s.later_scalars.begin(), s.later_scalars.end(), name)) {
      continue;
    }
    w->Bytes(name);
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    w->U64(bits);
  }
  if (type == RecordType::kPutGroupedSamples || HasPieceTrailer(type)) {
    w->U32(static_cast<uint32_t>(s.group_size));
  }
  if (!HasPieceTrailer(type)) return;
  w->U32(s.piece_message.has_value() ? 1 : 0);
  if (s.piece_message.has_value()) {
    w->U32(static_cast<uint32_t>(s.piece_message->index));
    w->U32((s.piece_message->partial ? 1u : 0u) | (s.piece_message->rows_sent ? 2u : 0u));
    w->U64(static_cast<uint64_t>(s.piece_message->rows_begin));
  }
  w->U32(static_cast<uint32_t>(s.pieces.size()));
  for (const PieceBounds& b : s.pieces) {
    w->U64(static_cast<uint64_t>(b.token_end));
    w->U64(static_cast<uint64_t>(b.rows_begin));
    w->U64(static_cast<uint64_t>(b.rows_end));
    w->U64(static_cast<uint64_t>(b.policy_version));
    w->U32((b.partial ? 1u : 0u) | (b.rows_sent ? 2u : 0u));
  }
  if (type != RecordType::kRaggedSamples) return;
  w->U32(static_cast<uint32_t>(s.ragged_fields.size()));
  for (const auto& [name, field] : s.ragged_fields) {
    w->Bytes(name);
    w->U32(static_cast<uint32_t>(field.dtype));
    w->Bytes(absl::string_view(reinterpret_cast<const char*>(field.offsets.data()),
                               field.offsets.size() * sizeof(int64_t)));
    w->Bytes(field.values);
  }
}

// One ragged field as EncodeSample wrote it: one list per token of `s`
// (decoded up to its tokens), offsets from 0, never decreasing, ending at
// the ids held (nothing else can be delivered).
bool DecodeRagged(Reader* r, StoredSample* s) {
  std::string name, offsets;
  StoredRagged field;
  uint32_t dtype;
  if (!r->Bytes(&name) || !r->U32(&dtype) || !r->Bytes(&offsets) || !r->Bytes(&field.values)) {
    return false;
  }
  field.dtype = static_cast<v1::DType>(dtype);
  if (field.dtype != v1::UINT16 && field.dtype != v1::INT32) return false;
  if (offsets.size() != (s->tokens.size() + 1) * sizeof(int64_t)) return false;
  field.offsets.resize(s->tokens.size() + 1);
  std::memcpy(field.offsets.data(), offsets.data(), offsets.size());
  const size_t id_bytes = static_cast<size_t>(DTypeSize(field.dtype));
  if (field.offsets.front() != 0 ||
      !std::is_sorted(field.offsets.begin(), field.offsets.end()) ||
      field.values.size() % id_bytes != 0 ||
      static_cast<uint64_t>(field.offsets.back()) != field.values.size() / id_bytes) {
    return false;
  }
  return s->ragged_fields.emplace(std::move(name), std::move(field)).second;
}

bool DecodeSample(Reader* r, RecordType type, StoredSample* s) {
  uint64_t u64;
  uint32_t count;
  std::string bytes;
  if (!r->Bytes(&s->sample_id) || !r->Bytes(&s->group_id) || !r->U64(&u64)) return false;
  s->policy_version = static_cast<int64_t>(u64);
  if (!r->Bytes(&bytes) || bytes.size() % sizeof(int32_t) != 0) return false;
  s->tokens.resize(bytes.size() / sizeof(int32_t));
  if (!bytes.empty()) std::memcpy(s->tokens.data(), bytes.data(), bytes.size());
  if (!r->Bytes(&s->experts) || !r->Bytes(&bytes)) return false;
  s->row_valid.assign(bytes.begin(), bytes.end());
  if (!r->U32(&count)) return false;
  for (uint32_t i = 0; i < count; ++i) {
    std::string name;
    StoredField field;
    uint32_t dtype, ndims;
    if (!r->Bytes(&name) || !r->U32(&dtype) || !r->U32(&ndims) || ndims > 16) return false;
    field.dtype = static_cast<v1::DType>(dtype);
    for (uint32_t d = 0; d < ndims; ++d) {
      if (!r->U64(&u64)) return false;
      field.trailing_shape.push_back(static_cast<int64_t>(u64));
    }
    if (!r->Bytes(&field.data)) return false;
    s->token_fields.emplace(std::move(name), std::move(field));
  }
  if (!r->U32(&count)) return false;
  for (uint32_t i = 0; i < count; ++i) {
    std::string name;
    double value;
    if (!r->Bytes(&name) || !r->U64(&u64)) return false;
    std::memcpy(&value, &u64, sizeof(value));
    s->scalars.emplace(std::move(name), value);
  }
  if (type == RecordType::kPutGroupedSamples || HasPieceTrailer(type)) {
    uint32_t group_size;
    if (!r->U32(&group_size) || group_size > 0x7fffffffu) return false;
    s->group_size = static_cast<int32_t>(group_size);
  }
  if (!HasPieceTrailer(type)) return true;
  uint32_t has_message;
  if (!r->U32(&has_message) || has_message > 1) return false;
  if (has_message == 1) {
    uint32_t index, flags;
    if (!r->U32(&index) || index > 0x7fffffffu || !r->U32(&flags) || flags > 3 ||
        !r->U64(&u64)) {
      return false;
    }
    s->piece_message = PieceMessage{static_cast<int32_t>(index), (flags & 1) != 0,
                                    static_cast<int64_t>(u64), (flags & 2) != 0};
  }
  // Each bound takes 36 bytes: a count past what is left is corrupt.
  if (!r->U32(&count) || count > r->remaining() / 36) return false;
  for (uint32_t i = 0; i < count; ++i) {
    PieceBounds b;
    uint64_t token_end, rows_begin, rows_end, version;
    uint32_t flags;
    if (!r->U64(&token_end) || !r->U64(&rows_begin) || !r->U64(&rows_end) ||
        !r->U64(&version) || !r->U32(&flags) || flags > 3) {
      return false;
    }
    b.token_end = static_cast<int64_t>(token_end);
    b.rows_begin = static_cast<int64_t>(rows_begin);
    b.rows_end = static_cast<int64_t>(rows_end);
    b.policy_version = static_cast<int64_t>(version);
    b.partial = (flags & 1) != 0;
    b.rows_sent = (flags & 2) != 0;
    s->pieces.push_back(b);
  }
  if (type != RecordType::kRaggedSamples) return true;
  // Each field takes at least 36 bytes.
  if (!r->U32(&count) || count > r->remaining() / 36) return false;
  for (uint32_t i = 0; i < count; ++i) {
    if (!DecodeRagged(r, s)) return false;
  }
  return true;
}

}  // namespace

RecordType SamplesRecordType(absl::Span<const StoredSample* const> samples) {
  RecordType type = RecordType::kPutSamples;
  for (const StoredSample* s : samples) {
    if (!s->ragged_fields.empty()) return RecordType::kRaggedSamples;
    if (s->piece_message.has_value() || !s->pieces.empty()) type = RecordType::kPieceSamples;
    if (s->group_size != 0 && type == RecordType::kPutSamples) {
      type = RecordType::kPutGroupedSamples;
    }
  }
  return type;
}

RecordType SamplesRecordType(absl::Span<const StoredSample> samples) {
  std::vector<const StoredSample*> ptrs;
  ptrs.reserve(samples.size());
  for (const StoredSample& s : samples) ptrs.push_back(&s);
  return SamplesRecordType(absl::MakeConstSpan(ptrs));
}

std::string EncodeSamples(absl::string_view pool, absl::Span<const StoredSample* const> samples,
                          RecordType type, bool as_put) {
  std::string out;
  int64_t size = 16 + static_cast<int64_t>(pool.size());
  for (const StoredSample* s : samples) size += EncodedSampleBytes(*s) + 4;
  out.reserve(static_cast<size_t>(size));
  Writer w(&out);
  w.Bytes(pool);
  w.U32(static_cast<uint32_t>(samples.size()));
  for (const StoredSample* s : samples) EncodeSample(*s, type, as_put, &w);
  return out;
}

std::string EncodeSamples(absl::string_view pool, absl::Span<const StoredSample> samples,
                          RecordType type, bool as_put) {
  std::vector<const StoredSample*> ptrs;
  ptrs.reserve(samples.size());
  for (const StoredSample& s : samples) ptrs.push_back(&s);
  return EncodeSamples(pool, absl::MakeConstSpan(ptrs), type, as_put);
}

int64_t EncodedSampleBytes(const StoredSample& s) {
  // A grouped sample carries 4 bytes more (kPutGroupedSamples), a piece or
  // pieced sample its piece trailer too (kPieceSamples): exact for a record
  // of this sample alone; within that trailer in a mixed batch.
  const bool ragged = !s.ragged_fields.empty();
  const bool pieced = s.piece_message.has_value() || !s.pieces.empty() || ragged;
  int64_t n = 8 * 6 + 8 + (s.group_size != 0 || pieced ? 4 : 0) +
              (pieced ? 4 + (s.piece_message.has_value() ? 16 : 0) + 4 +
                            36 * static_cast<int64_t>(s.pieces.size())
                      : 0) + static_cast<int64_t>(s.sample_id.size() + s.group_id.size() +
                                               s.tokens.size() * 4 + s.experts.size() +
                                               s.row_valid.size());
  for (const auto& [name, field] : s.token_fields) {
    n += 8 + name.size() + 8 + 8 * field.trailing_shape.size() + 8 + field.data.size();
  }
  for (const auto& [name, value] : s.scalars) n += 16 + name.size();
  // ... and its ragged fields (kRaggedSamples).
  if (ragged) n += 4;
  for (const auto& [name, field] : s.ragged_fields) {
    n += 8 + name.size() + 4 + 8 + 8 * field.offsets.size() + 8 + field.values.size();
  }
  return n;
}

int64_t LoggedSampleBytes(const StoredSample& s) {
  return s.logged_bytes > 0 ? s.logged_bytes : EncodedSampleBytes(s);
}

absl::Status DecodeSamples(absl::string_view payload, std::string* pool,
                           std::vector<StoredSample>* samples, RecordType type) {
  Reader r(payload);
  uint32_t count;
  if (!r.Bytes(pool) || !r.U32(&count)) return absl::DataLossError("truncated samples record");
  for (uint32_t i = 0; i < count; ++i) {
    StoredSample s;
    if (!DecodeSample(&r, type, &s)) {
      return absl::DataLossError(absl::StrCat("samples record: sample ", i, " does not decode"));
    }
    samples->push_back(std::move(s));
  }
  if (!r.done()) return absl::DataLossError("samples record: trailing bytes");
  return absl::OkStatus();
}

std::string EncodeRegisterModel(const std::string& pool, const ModelSpec& model,
                                const PoolOptions& options) {
  v1::RegisterModelRequest request;
  request.set_pool(pool);
  *request.mutable_model() = ToProto(model);
  // Default options are left out: such a record is byte-identical to one
  // written before pools had options.
  if (options != PoolOptions{}) *request.mutable_options() = ToProto(options);
  return request.SerializeAsString();
}

std::string EncodeSetPolicyVersion(const std::string& pool, int64_t policy_version) {
  v1::SetPolicyVersionRequest request;
  request.set_pool(pool);
  request.set_policy_version(policy_version);
  return request.SerializeAsString();
}

std::string EncodeCreateStep(const Step& step) {
  v1::CreateStepRequest request;
  request.set_step_id(step.step_id);
  request.set_pool(step.pool);
  for (const std::string& id : step.sample_ids) request.add_sample_ids(id);
  *request.mutable_topology() = ToProto(step.topology);
  request.set_reuse_samples(step.reuse_samples);
  if (step.replay.source == ReplaySourceKind::kRecompute) {
    request.set_replay_source(v1::REPLAY_SOURCE_RECOMPUTE);
  }
  // Replay computes the same advantages again from the same samples.
  SetAdvantage(step.metadata.advantage, &request);
  return request.SerializeAsString();
}

std::string EncodeReleaseStep(const std::string& step_id) {
  v1::ReleaseStepRequest request;
  request.set_step_id(step_id);
  return request.SerializeAsString();
}

std::string EncodeHoldSamples(const std::string& step_id, const std::string& pool,
                              absl::Span<const std::string> sample_ids,
                              const std::string& coordinator, int64_t attempt,
                              bool reuse_samples, bool recompute) {
  v1::HoldSamplesRequest request;
  request.set_step_id(step_id);
  request.set_pool(pool);
  for (const std::string& id : sample_ids) request.add_sample_ids(id);
  request.set_coordinator(coordinator);
  request.set_attempt(attempt);
  request.set_reuse_samples(reuse_samples);
  if (recompute) request.set_replay_source(v1::REPLAY_SOURCE_RECOMPUTE);
  return request.SerializeAsString();
}

std::string EncodeAnnotations(absl::string_view pool,
                              absl::Span<const ScalarAnnotation> annotations) {
  v1::AnnotationsRecord record;
  record.set_pool(std::string(pool));
  for (const ScalarAnnotation& a : annotations) {
    v1::SampleAnnotation* out = record.add_annotations();
    out->set_sample_id(a.sample_id);
    out->mutable_scalars()->insert(a.scalars.begin(), a.scalars.end());
  }
  // Deterministic, so the same state compacts to the same bytes (map order
  // is otherwise unspecified).
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  record.SerializeToCodedStream(&coded);
  coded.Trim();
  return bytes;
}

std::string EncodeDropHold(const std::string& step_id) {
  v1::StepHoldRequest request;
  request.set_step_id(step_id);
  return request.SerializeAsString();
}

std::string EncodeDeletePool(const std::string& pool) {
  v1::DeletePoolRequest request;
  request.set_pool(pool);
  return request.SerializeAsString();
}

}  // namespace rollpack
