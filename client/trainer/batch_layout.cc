#include "client/trainer/batch_layout.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "client/cpp/ragged_field.h"
#include "client/cpp/sequence_metadata.h"

namespace rollpack::trainer_internal {
namespace {

ArrayRef RefOf(const v1::NDArray& a, void* data) {
  ArrayRef r;
  r.dtype = a.dtype();
  r.shape.assign(a.shape().begin(), a.shape().end());
  r.data = data;
  return r;
}

bool IsReplay3d(const v1::NDArray& a) { return a.shape_size() == 3; }

const v1::NDArray& ArrayOf(const v1::Microbatch& m, const std::string& name) {
  if (absl::StartsWith(name, kRaggedValuesPrefix)) {
    return m.ragged_token_fields().at(name.substr(kRaggedValuesPrefix.size())).values();
  }
  if (absl::StartsWith(name, kRaggedOffsetsPrefix)) {
    return m.ragged_token_fields().at(name.substr(kRaggedOffsetsPrefix.size())).offsets();
  }
  if (name == "tokens") return m.tokens();
  if (name == "cu_seqlens") return m.cu_seqlens();
  if (name == "cu_seqlens_padded") return m.cu_seqlens_padded();
  if (name == "replay_mask") return m.replay_mask();
  if (name == "replay_experts") return m.replay_experts();
  if (name == "advantages") return m.advantages();
  if (name.rfind(kScalarPrefix, 0) == 0) return m.scalars().at(name.substr(kScalarPrefix.size()));
  return m.token_fields().at(name.substr(6));
}

int64_t DataSize(const v1::Microbatch& m, const std::string& name) {
  return static_cast<int64_t>(ArrayOf(m, name).data().size());
}
int64_t DataSize(const ReceivedMicrobatch& m, const std::string& name) {
  // The per-sequence arrays are parsed with the metadata, not located.
  if (IsSequenceSlot(name)) return DataSize(m.meta(), name);
  return std::max<int64_t>(0, m.data_size(name));
}
const v1::Microbatch& MetaOf(const v1::Microbatch& m) { return m; }
const v1::Microbatch& MetaOf(const ReceivedMicrobatch& m) { return m.meta(); }

// The offsets' contents of every ragged field (their sizes are checked).
absl::Status CheckRaggedOffsets(const v1::Microbatch& m) {
  for (const auto& [field, ragged] : m.ragged_token_fields()) {
    const std::string where = absl::StrCat("micro-batch ", m.index());
    ASSIGN_OR_RETURN(RaggedShape shape, ReadRaggedShape(where, field, ragged));
    RaggedOffsetsCheck check(shape.rows, shape.num_values);
    check.Feed(ragged.offsets().data().data(),
               static_cast<int64_t>(ragged.offsets().data().size()));
    RETURN_IF_ERROR(check.Finish(where, field));
  }
  return absl::OkStatus();
}
absl::Status CheckRaggedOffsets(const ReceivedMicrobatch& m) {
  for (const auto& [field, ragged] : m.meta().ragged_token_fields()) {
    RETURN_IF_ERROR(m.CheckRagged(field).status());
  }
  return absl::OkStatus();
}

template <typename Message>
absl::Status CheckBytesOf(const Message& m, const Layout& l) {
  for (const Slot& s : l.slots) {
    const int64_t have = DataSize(m, s.name);
    if (have != s.wire_bytes) {
      return absl::DataLossError(absl::StrCat("micro-batch ", MetaOf(m).index(), ": ", s.name,
                                              " holds ", have, " bytes, its shape needs ",
                                              s.wire_bytes));
    }
  }
  return CheckRaggedOffsets(m);
}

// uint16 ids at out + 2 * n (where CopyData put them) to int32 at out, in
// place: element i is read before anything overwrites it, since element i's
// int32 ends at 4 * i + 4 <= 2 * n + 2 * i + 2 for every i < n.
void WidenInPlace(char* out, int64_t n) {
  const char* in = out + 2 * n;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, in + 2 * i, 2);
    const int32_t w = v;
    std::memcpy(out + 4 * i, &w, 4);
  }
}

template <typename Message>
void CopySlotOf(const Message& m, const Slot& s, void* out) {
  if (!s.widen_uint16) return CopyData(m, s.name, out);
  const int64_t n = s.wire_bytes / 2;
  CopyData(m, s.name, static_cast<char*>(out) + 2 * n);
  WidenInPlace(static_cast<char*>(out), n);
}

// Ragged token fields, after every other array (the offsets before them
// stay as they were): values as int32, offsets int64.
absl::Status AddRaggedSlots(const v1::Microbatch& m, Layout* l) {
  if (m.ragged_token_fields().empty()) return absl::OkStatus();
  const std::string where = absl::StrCat("micro-batch ", m.index());
  // The rows every ragged field has: those of tokens, or of a token field.
  std::string rows_of;
  int64_t rows = -1;
  if (m.tokens().dtype() != v1::DTYPE_UNSPECIFIED && m.tokens().shape_size() == 1) {
    rows_of = "tokens";
    rows = m.tokens().shape(0);
  } else {
    std::map<std::string, const v1::NDArray*> fields;  // in name order
    for (const auto& [name, a] : m.token_fields()) fields[name] = &a;
    for (const auto& [name, a] : fields) {
      if (a->shape_size() >= 1) {
        rows_of = absl::StrCat("token_fields[\"", name, "\"]");
        rows = a->shape(0);
        break;
      }
    }
  }
  std::map<std::string, const v1::RaggedArray*> fields;
  for (const auto& [name, a] : m.ragged_token_fields()) fields[name] = &a;
  for (const auto& [name, a] : fields) {
    ASSIGN_OR_RETURN(RaggedShape shape, ReadRaggedShape(where, name, *a));
    if (rows >= 0 && shape.rows != rows) {
      return absl::DataLossError(absl::StrCat(where, ": ragged_token_fields[\"", name, "\"] has ",
                                              shape.rows, " rows, ", rows_of, " has ", rows));
    }
    Slot values;
    values.name = RaggedValuesName(name);
    values.ref.dtype = v1::INT32;
    values.ref.shape = {shape.num_values};
    values.bytes = shape.num_values * 4;
    values.wire_bytes = shape.values_bytes();
    values.widen_uint16 = shape.values_dtype == v1::UINT16;
    Slot offsets;
    offsets.name = RaggedOffsetsName(name);
    offsets.ref.dtype = v1::INT64;
    offsets.ref.shape = {shape.rows + 1};
    offsets.bytes = offsets.wire_bytes = shape.offsets_bytes();
    for (Slot* s : {&values, &offsets}) {
      s->offset = l->arrays_bytes;
      l->arrays_bytes += AlignUp(s->bytes);
      l->slots.push_back(std::move(*s));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool SameOnEveryTpRank(const std::string& name) {
  return name == "tokens" || name.rfind("field:", 0) == 0 ||
         absl::StartsWith(name, kRaggedValuesPrefix) ||
         absl::StartsWith(name, kRaggedOffsetsPrefix);
}

bool IsSequenceSlot(const std::string& name) {
  return name == "advantages" || name.rfind(kScalarPrefix, 0) == 0;
}

bool KeptInMeta(const std::string& name) {
  return name == "cu_seqlens" || name == "cu_seqlens_padded" || IsSequenceSlot(name);
}

absl::StatusOr<Layout> ComputeLayout(const v1::Microbatch& m, bool ids_int32, bool replay_ids) {
  // Checked before any of them gets a slot: what a trainer reads as its
  // rewards and advantages came from the network.
  RETURN_IF_ERROR(CheckSequenceMetadata(m));
  Layout l;
  auto add = [&](const std::string& name, const v1::NDArray& a) -> absl::Status {
    Slot s;
    s.name = name;
    s.ref = RefOf(a, nullptr);
    if (a.dtype() != v1::DTYPE_UNSPECIFIED && ElementSize(a.dtype()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": unknown dtype ", a.dtype()));
    }
    s.bytes = a.dtype() == v1::DTYPE_UNSPECIFIED ? 0 : s.ref.nbytes();
    if (s.bytes < 0) return absl::InvalidArgumentError(absl::StrCat(name, ": negative shape"));
    s.wire_bytes = s.bytes;
    s.offset = l.arrays_bytes;
    l.arrays_bytes += AlignUp(s.bytes);
    l.slots.push_back(std::move(s));
    return absl::OkStatus();
  };
  absl::Status st;
  if (!(st = add("tokens", m.tokens())).ok()) return st;
  if (!(st = add("cu_seqlens", m.cu_seqlens())).ok()) return st;
  if (!(st = add("cu_seqlens_padded", m.cu_seqlens_padded())).ok()) return st;
  if (!(st = add("replay_mask", m.replay_mask())).ok()) return st;
  if (!(st = add("replay_experts", m.replay_experts())).ok()) return st;
  std::vector<std::string> names;
  for (const auto& [name, a] : m.token_fields()) names.push_back(name);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    if (!(st = add("field:" + n, m.token_fields().at(n))).ok()) return st;
  }
  // After every array there was before them: the leading offsets stay as
  // they were. Absent advantages (no estimator) take a slot of 0 bytes.
  if (!(st = add("advantages", m.advantages())).ok()) return st;
  std::vector<std::string> scalars;
  for (const auto& [name, a] : m.scalars()) scalars.push_back(name);
  std::sort(scalars.begin(), scalars.end());
  for (const std::string& n : scalars) {
    if (!(st = add(std::string(kScalarPrefix) + n, m.scalars().at(n))).ok()) return st;
  }
  RETURN_IF_ERROR(AddRaggedSlots(m, &l));
  if (IsReplay3d(m.replay_experts())) {
    l.rows = m.replay_experts().shape(0);
    l.layers = m.replay_experts().shape(1);
    l.k = m.replay_experts().shape(2);
    if (m.replay_experts().dtype() != v1::UINT8 && m.replay_experts().dtype() != v1::UINT16) {
      return absl::InvalidArgumentError("replay_experts must be uint8 or uint16");
    }
  }
  l.ids_offset = l.arrays_bytes;
  l.unpacked_ids = replay_ids;
  l.ids_bytes = replay_ids ? l.rows * l.layers * l.k * (ids_int32 ? 4 : 8) : 0;
  l.total = l.ids_offset + AlignUp(l.ids_bytes);
  return l;
}

const Slot* FindSlot(const Layout& l, const std::string& name) {
  for (const Slot& s : l.slots) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

absl::Status CheckBytes(const v1::Microbatch& m, const Layout& l) { return CheckBytesOf(m, l); }
absl::Status CheckMetaBytes(const v1::Microbatch& m, const Layout& l) {
  for (const Slot& s : l.slots) {
    if (!KeptInMeta(s.name)) continue;
    const int64_t have = DataSize(m, s.name);
    if (have != s.bytes) {
      return absl::DataLossError(absl::StrCat("micro-batch ", m.index(), ": ", s.name, " holds ",
                                              have, " bytes, its shape needs ", s.bytes));
    }
  }
  return absl::OkStatus();
}
absl::Status CheckBytes(const ReceivedMicrobatch& m, const Layout& l) {
  return CheckBytesOf(m, l);
}

void CopyData(const v1::Microbatch& m, const std::string& name, void* out) {
  const std::string& data = ArrayOf(m, name).data();
  std::memcpy(out, data.data(), data.size());
}
void CopyData(const ReceivedMicrobatch& m, const std::string& name, void* out) {
  if (IsSequenceSlot(name)) return CopyData(m.meta(), name, out);
  m.CopyData(name, out);
}

void CopySlot(const v1::Microbatch& m, const Slot& s, void* out) { CopySlotOf(m, s, out); }
void CopySlot(const ReceivedMicrobatch& m, const Slot& s, void* out) { CopySlotOf(m, s, out); }

void AssignViews(const Layout& l, char* base, void* ids, bool ids_int32, BatchState* b) {
  for (const Slot& s : l.slots) {
    ArrayRef r = s.ref;
    r.data = base == nullptr ? nullptr : base + s.offset;
    if (s.name == "tokens") b->tokens = r;
    else if (s.name == "cu_seqlens") b->cu_seqlens = r;
    else if (s.name == "cu_seqlens_padded") b->cu_seqlens_padded = r;
    else if (s.name == "replay_mask") b->replay_mask = r;
    else if (s.name == "replay_experts") b->replay_experts = r;
    else if (s.name == "advantages") b->advantages = r;
    else if (s.name.rfind(kScalarPrefix, 0) == 0)
      b->scalars[s.name.substr(kScalarPrefix.size())] = r;
    else if (absl::StartsWith(s.name, kRaggedValuesPrefix))
      b->ragged_token_fields[s.name.substr(kRaggedValuesPrefix.size())].values = r;
    else if (absl::StartsWith(s.name, kRaggedOffsetsPrefix))
      b->ragged_token_fields[s.name.substr(kRaggedOffsetsPrefix.size())].offsets = r;
    else b->token_fields[s.name.substr(6)] = r;
  }
  if (!l.unpacked_ids) {
    b->replay_ids = ArrayRef();  // absent
    return;
  }
  b->replay_ids.dtype = ids_int32 ? v1::INT32 : v1::INT64;
  b->replay_ids.shape = {l.layers, l.rows, l.k};
  b->replay_ids.data = ids;
}

kernels::UnpackArgs MakeUnpack(const Layout& l, const ArrayRef& experts, const ArrayRef& mask,
                               void* out, bool ids_int32, bool masked_fill_minus_one) {
  kernels::UnpackArgs a;
  a.experts = experts.data;
  a.in_type = experts.dtype == v1::UINT16 ? kernels::IndexType::kU16 : kernels::IndexType::kU8;
  a.mask = mask.numel() == l.rows && mask.dtype == v1::UINT8
               ? static_cast<const uint8_t*>(mask.data) : nullptr;
  a.rows = l.rows;
  a.layers = l.layers;
  a.k = static_cast<int>(l.k);
  a.out = out;
  a.out_type = ids_int32 ? kernels::OutIndexType::kI32 : kernels::OutIndexType::kI64;
  a.masked_fill_minus_one = masked_fill_minus_one;
  return a;
}

void ClearData(v1::Microbatch* m) {
  m->mutable_tokens()->clear_data();
  m->mutable_replay_experts()->clear_data();
  m->mutable_replay_mask()->clear_data();
  for (auto& [name, a] : *m->mutable_token_fields()) a.clear_data();
  for (auto& [name, a] : *m->mutable_ragged_token_fields()) {
    a.mutable_values()->clear_data();
    a.mutable_offsets()->clear_data();
  }
}

}  // namespace rollpack::trainer_internal
