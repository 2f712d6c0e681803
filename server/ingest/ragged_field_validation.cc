#include "server/ingest/ragged_field_validation.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/store/names.h"
#include "server/store/ndarray.h"

namespace rollpack {
namespace {

template <typename T>
T Load(absl::string_view bytes, int64_t i) {
  T v;
  std::memcpy(&v, bytes.data() + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

class RaggedFieldConverter {
 public:
  RaggedFieldConverter(const std::string& name, const v1::RaggedArray& array, int64_t n,
                       const ModelSpec& model, std::string what)
      : name_(name), array_(array), n_(n), model_(model), what_(std::move(what)) {}

  absl::StatusOr<StoredRagged> Run(v1::Sample* owned, int64_t* growth_budget) {
    RETURN_IF_ERROR(ReadOffsets());
    RETURN_IF_ERROR(ViewValues());
    StoredRagged field;
    field.dtype = model_.ragged_id_bytes() == 2 ? v1::UINT16 : v1::INT32;
    // What storing adds beyond the message's bytes: bounded per message
    // like a token field's widening conversion, before the allocation.
    const int64_t stored = ids_ * DTypeSize(field.dtype) + (n_ + 1) * 8;
    const int64_t sent = static_cast<int64_t>(values_.data.size() + offsets_bytes_);
    const int64_t growth = stored - sent;
    if (growth_budget != nullptr && growth > 0) {
      if (growth > *growth_budget) {
        return Invalid(absl::StrCat(
            " takes ", stored, " bytes as stored (", DTypeName(field.dtype),
            " ids, int64 offsets), ", growth, " more than sent, past what this message's "
            "conversions may add (", *growth_budget, " bytes left of as many as the message has); "
            "send smaller messages"));
      }
      *growth_budget -= growth;
    }
    // Ids already in the stored dtype are kept as they came (moved out of
    // the request when it is ours); others are converted as they are checked.
    const bool kept = values_.dtype == field.dtype || ids_ == 0;
    if (!kept) field.values.resize(static_cast<size_t>(ids_ * DTypeSize(field.dtype)));
    char* converted = kept ? nullptr : field.values.data();
    switch (values_.dtype) {
      case v1::UINT16: RETURN_IF_ERROR(CheckIdsInto<uint16_t>(field.dtype, converted)); break;
      case v1::INT32: RETURN_IF_ERROR(CheckIdsInto<int32_t>(field.dtype, converted)); break;
      default: RETURN_IF_ERROR(CheckIdsInto<int64_t>(field.dtype, converted)); break;
    }
    if (kept) {
      if (owned != nullptr && ids_ > 0) {
        field.values = std::move(
            *owned->mutable_ragged_token_fields()->at(name_).mutable_values()->mutable_data());
      } else {
        field.values.assign(values_.data.data(), values_.data.size());
      }
    }
    field.offsets = std::move(offsets_);
    return field;
  }

 private:
  absl::Status Invalid(absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(what_, message));
  }

  absl::Status ReadOffsets() {
    if (n_ == 0 && IsEmptyArray(array_.offsets()) && IsEmptyArray(array_.values())) {
      // A later piece without tokens: no lists.
      offsets_.assign(1, 0);
      return absl::OkStatus();
    }
    if (IsEmptyArray(array_.offsets())) {
      return Invalid(absl::StrCat(".offsets is missing (n + 1 = ", n_ + 1, " entries, one list "
                                  "per token)"));
    }
    ASSIGN_OR_RETURN(ArrayView view, ViewArray(array_.offsets(), what_ + ".offsets"));
    if (view.dtype != v1::INT32 && view.dtype != v1::INT64) {
      return Invalid(absl::StrCat(".offsets has dtype ", DTypeName(view.dtype),
                                  ", must be int32 or int64"));
    }
    if (view.rank() != 1) {
      return Invalid(absl::StrCat(".offsets has rank ", view.rank(), ", must be 1"));
    }
    if (view.dim(0) != n_ + 1) {
      return Invalid(absl::StrCat(".offsets has ", view.dim(0), " entries, must be n + 1 = ",
                                  n_ + 1, " (one list per token)"));
    }
    offsets_bytes_ = static_cast<int64_t>(view.data.size());
    offsets_.resize(static_cast<size_t>(n_ + 1));
    if (view.dtype == v1::INT32) {
      for (int64_t i = 0; i <= n_; ++i) offsets_[i] = Load<int32_t>(view.data, i);
    } else {
      std::memcpy(offsets_.data(), view.data.data(), view.data.size());
    }
    if (offsets_[0] != 0) {
      return Invalid(absl::StrCat(".offsets[0] is ", offsets_[0], ", must be 0"));
    }
    for (int64_t t = 0; t < n_; ++t) {
      if (offsets_[t + 1] < offsets_[t]) {
        return Invalid(absl::StrCat(".offsets decreases at token ", t, ": offsets[", t + 1,
                                    "] = ", offsets_[t + 1], " < offsets[", t, "] = ",
                                    offsets_[t], " (offsets never decrease)"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ViewValues() {
    if (IsEmptyArray(array_.values())) {
      values_ = ArrayView{v1::INT32, {0}, absl::string_view()};
    } else {
      ASSIGN_OR_RETURN(values_, ViewArray(array_.values(), what_ + ".values"));
      if (values_.dtype != v1::INT32 && values_.dtype != v1::INT64 &&
          values_.dtype != v1::UINT16) {
        return Invalid(absl::StrCat(".values has dtype ", DTypeName(values_.dtype),
                                    ", must be int32, int64 or uint16"));
      }
      if (values_.rank() != 1) {
        return Invalid(absl::StrCat(".values has rank ", values_.rank(), ", must be 1"));
      }
    }
    ids_ = values_.num_elements();
    if (offsets_.back() != ids_) {
      return Invalid(absl::StrCat(".offsets ends at ", offsets_.back(),
                                  ", must end at len(values) = ", ids_));
    }
    return absl::OkStatus();
  }

  // CheckIds of `In` ids, written as `stored` ids into `converted` (null:
  // checked only).
  template <typename In>
  absl::Status CheckIdsInto(v1::DType stored, char* converted) const {
    if (converted == nullptr) return CheckIds<In, In>(nullptr);
    if (stored == v1::UINT16) return CheckIds<In, uint16_t>(reinterpret_cast<uint16_t*>(converted));
    return CheckIds<In, int32_t>(reinterpret_cast<int32_t*>(converted));
  }

  // Every id in [0, V) (V > 0), else in [0, 2^31) (kept as int32), named by
  // its token and element on the first that is not; each also written to
  // `out` (non-null: the stored dtype differs from the input's).
  template <typename In, typename Out>
  absl::Status CheckIds(Out* out) const {
    const int64_t vocab = model_.vocab_size;
    const int64_t limit = vocab > 0 ? vocab : int64_t{std::numeric_limits<int32_t>::max()} + 1;
    const char* ids = values_.data.data();
    auto load = [ids](int64_t i) {
      In raw;
      std::memcpy(&raw, ids + i * static_cast<int64_t>(sizeof(In)), sizeof(In));
      return raw;
    };
    // The smallest and largest id in one branch-free pass (it vectorizes);
    // the first bad id is looked for only when there is one.
    In lo = std::numeric_limits<In>::max();
    In hi = std::numeric_limits<In>::min();
    if (out == nullptr) {
      for (int64_t i = 0; i < ids_; ++i) {
        lo = std::min(lo, load(i));
        hi = std::max(hi, load(i));
      }
    } else {
      for (int64_t i = 0; i < ids_; ++i) {
        const In id = load(i);
        lo = std::min(lo, id);
        hi = std::max(hi, id);
        out[i] = static_cast<Out>(id);
      }
    }
    if (ids_ == 0 || (static_cast<int64_t>(lo) >= 0 && static_cast<int64_t>(hi) < limit)) {
      return absl::OkStatus();
    }
    for (int64_t i = 0;; ++i) {
      if (const int64_t id = load(i); id < 0 || id >= limit) return BadId(i, id, limit);
    }
  }

  // The refusal of id `id`, element `i`, named by its token.
  absl::Status BadId(int64_t i, int64_t id, int64_t limit) const {
    // The token whose list holds element i: the last t with offsets[t] <= i.
    const int64_t token =
        std::upper_bound(offsets_.begin(), offsets_.end(), i) - offsets_.begin() - 1;
    return Invalid(absl::StrCat(
        " has id ", id, " at token ", token, " (element ", i, "), must be in [0, ", limit, ")",
        model_.vocab_size > 0
            ? " (ModelSpec.vocab_size)"
            : " (ids; the model declares no vocab_size, so they are kept as int32)"));
  }

  const std::string& name_;
  const v1::RaggedArray& array_;
  const int64_t n_;
  const ModelSpec& model_;
  const std::string what_;
  std::vector<int64_t> offsets_;
  int64_t offsets_bytes_ = 0;
  ArrayView values_;
  int64_t ids_ = 0;
};

// A sampling mask is a set per token: each kept id once. A repeat is a
// broken producer, and the trainer's restricted softmax would count the
// id twice (kernels/masked_logprob.h does not look). Lists arrive sorted
// from the engines, checked in one pass; others are sorted in a copy.
template <typename Id>
absl::Status CheckDistinctIds(const StoredRagged& field, absl::string_view what) {
  std::vector<Id> sorted;
  for (size_t t = 0; t + 1 < field.offsets.size(); ++t) {
    const int64_t begin = field.offsets[t];
    const int64_t end = field.offsets[t + 1];
    bool ascending = true;
    for (int64_t i = begin + 1; i < end && ascending; ++i) {
      ascending = Load<Id>(field.values, i - 1) < Load<Id>(field.values, i);
    }
    if (ascending) continue;
    sorted.resize(static_cast<size_t>(end - begin));
    for (int64_t i = begin; i < end; ++i) sorted[i - begin] = Load<Id>(field.values, i);
    std::sort(sorted.begin(), sorted.end());
    const auto repeat = std::adjacent_find(sorted.begin(), sorted.end());
    if (repeat != sorted.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " repeats id ", static_cast<int64_t>(*repeat), " in the list of token ", t,
          ": a sampling mask holds each kept id once"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ConvertRaggedFields(const v1::Sample& sample, int64_t num_tokens,
                                 const ModelSpec& model,
                                 absl::Span<const DeclaredTokenField> declared,
                                 absl::string_view who, v1::Sample* owned,
                                 int64_t* growth_budget,
                                 std::map<std::string, StoredRagged>* out) {
  // By name: a protobuf map's iteration order differs between copies of a
  // message, and with two bad fields the error must not depend on it.
  std::map<std::string, const v1::RaggedArray*> by_name;
  for (const auto& [name, array] : sample.ragged_token_fields()) by_name.emplace(name, &array);
  for (const auto& [name, array] : by_name) {
    if (name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(who, "ragged_token_fields has an empty name"));
    }
    if (absl::Status bad = ValidateName("ragged token field name", name, kMaxTokenFieldNameBytes);
        !bad.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(who, bad.message()));
    }
    const std::string what = absl::StrCat(who, "ragged_token_fields[\"", name, "\"]");
    if (sample.token_fields().count(name) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " is also in token_fields: a field is dense or ragged, not both"));
    }
    for (const DeclaredTokenField& f : declared) {
      if (f.name == name) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " is a dense token field of the pool (PoolOptions.token_fields): a field is "
            "dense or ragged, not both"));
      }
    }
    ASSIGN_OR_RETURN(StoredRagged field,
                     RaggedFieldConverter(name, *array, num_tokens, model, what)
                         .Run(owned, growth_budget));
    if (name == kSamplingMaskField) {
      RETURN_IF_ERROR(field.dtype == v1::UINT16 ? CheckDistinctIds<uint16_t>(field, what)
                                                : CheckDistinctIds<int32_t>(field, what));
    }
    out->emplace(name, std::move(field));
  }
  return absl::OkStatus();
}

}  // namespace rollpack
