#include "client/cpp/ragged_field.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rollpack {
namespace {

std::string Describe(const v1::NDArray& a) {
  return absl::StrCat(v1::DType_Name(a.dtype()), " [", absl::StrJoin(a.shape(), ", "), "]");
}

absl::Status Refuse(absl::string_view where, absl::string_view field, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(where, ": ragged_token_fields[\"", field, "\"]: ", what));
}

}  // namespace

std::string RaggedValuesName(absl::string_view field) {
  return absl::StrCat(kRaggedValuesPrefix, field);
}
std::string RaggedOffsetsName(absl::string_view field) {
  return absl::StrCat(kRaggedOffsetsPrefix, field);
}

absl::StatusOr<RaggedShape> ReadRaggedShape(absl::string_view where, absl::string_view field,
                                            const v1::RaggedArray& heads) {
  const v1::NDArray& values = heads.values();
  const v1::NDArray& offsets = heads.offsets();
  if ((values.dtype() != v1::UINT16 && values.dtype() != v1::INT32) || values.shape_size() != 1 ||
      values.shape(0) < 0) {
    return Refuse(where, field,
                  absl::StrCat("values is ", Describe(values),
                               ": a ragged field's values are 1-D UINT16 or INT32"));
  }
  // rows + 1 <= INT64_MAX / 8, so every byte count of the field fits.
  constexpr int64_t kMaxEntries = INT64_MAX / 8;
  if (offsets.dtype() != v1::INT64 || offsets.shape_size() != 1 || offsets.shape(0) < 1 ||
      offsets.shape(0) > kMaxEntries || values.shape(0) > kMaxEntries) {
    return Refuse(where, field,
                  absl::StrCat("offsets is ", Describe(offsets), " with values ", Describe(values),
                               ": a ragged field's offsets are 1-D INT64 [rows + 1]"));
  }
  RaggedShape s;
  s.values_dtype = values.dtype();
  s.rows = offsets.shape(0) - 1;
  s.num_values = values.shape(0);
  return s;
}

void RaggedOffsetsCheck::Take(int64_t offset) {
  const int64_t entry = entries_++;
  if (bad_entry_ >= 0) return;
  const bool ok = entry == 0 ? offset == 0 : offset >= previous_ && offset <= num_values_;
  if (!ok) {
    bad_entry_ = entry;
    bad_value_ = offset;
  }
  previous_ = offset;
}

void RaggedOffsetsCheck::Feed(const char* data, int64_t size) {
  if (size <= 0) return;
  if (carried_ > 0) {
    const int64_t n = std::min<int64_t>(8 - carried_, size);
    std::memcpy(carry_ + carried_, data, static_cast<size_t>(n));
    carried_ += static_cast<int>(n);
    data += n;
    size -= n;
    if (carried_ < 8) return;
    int64_t v;
    std::memcpy(&v, carry_, 8);
    Take(v);
    carried_ = 0;
  }
  for (; size >= 8; data += 8, size -= 8) {
    int64_t v;
    std::memcpy(&v, data, 8);
    Take(v);
  }
  if (size > 0) std::memcpy(carry_, data, static_cast<size_t>(size));
  carried_ = static_cast<int>(size);
}

absl::Status RaggedOffsetsCheck::Finish(absl::string_view where, absl::string_view field) const {
  if (carried_ != 0 || entries_ != rows_ + 1) {
    return Refuse(where, field,
                  absl::StrCat("offsets holds ", entries_ * 8 + carried_, " bytes, its ", rows_ + 1,
                               " entries need ", (rows_ + 1) * 8));
  }
  if (bad_entry_ == 0) {
    return Refuse(where, field, absl::StrCat("offsets[0] is ", bad_value_, ", not 0"));
  }
  if (bad_entry_ > 0) {
    return Refuse(
        where, field,
        absl::StrCat("offsets[", bad_entry_, "] is ", bad_value_,
                     bad_value_ > num_values_
                         ? absl::StrCat(", past the ", num_values_, " values")
                         : absl::StrCat(", below offsets[", bad_entry_ - 1, "]: row ",
                                        bad_entry_ - 1, "'s list would end before it starts")));
  }
  if (previous_ != num_values_) {
    return Refuse(where, field,
                  absl::StrCat("offsets[", rows_, "] is ", previous_, ", but values holds ",
                               num_values_, ": the last offset is the number of values"));
  }
  return absl::OkStatus();
}

}  // namespace rollpack
