#include "server/ingest/token_versions.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rollpack {
namespace {

// Element `i` of little-endian integer data of `dtype`.
int64_t IntegerAt(v1::DType dtype, const char* data, int64_t i) {
  switch (dtype) {
    case v1::UINT8:
      return static_cast<uint8_t>(data[i]);
    case v1::UINT16: {
      uint16_t v;
      std::memcpy(&v, data + 2 * i, 2);
      return v;
    }
    case v1::INT16: {
      int16_t v;
      std::memcpy(&v, data + 2 * i, 2);
      return v;
    }
    case v1::INT32: {
      int32_t v;
      std::memcpy(&v, data + 4 * i, 4);
      return v;
    }
    case v1::INT64:
    default: {
      int64_t v;
      std::memcpy(&v, data + 8 * i, 8);
      return v;
    }
  }
}

bool IsInteger(v1::DType dtype) {
  return dtype == v1::UINT8 || dtype == v1::UINT16 || dtype == v1::INT16 ||
         dtype == v1::INT32 || dtype == v1::INT64;
}

}  // namespace

absl::Status ApplyTokenVersions(absl::string_view who, StoredSample* sample) {
  auto it = sample->token_fields.find(std::string(kTokenVersionField));
  if (it == sample->token_fields.end()) return absl::OkStatus();
  const StoredField& field = it->second;
  if (!IsInteger(field.dtype) || !field.trailing_shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, "token_fields[\"", kTokenVersionField, "\"] is ", v1::DType_Name(field.dtype), " [n",
        field.trailing_shape.empty() ? "" : ", ", absl::StrJoin(field.trailing_shape, ", "),
        "]: per-token policy versions are one integer per token (int64 [n]; lifecycle.md "
        "section 3)"));
  }
  const int64_t n = sample->num_tokens();
  std::optional<int64_t> lowest;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t version = IntegerAt(field.dtype, field.data.data(), i);
    if (version < 0) continue;  // no policy generated it (a prompt token)
    if (!lowest.has_value() || version < *lowest) lowest = version;
  }
  if (lowest.has_value()) sample->policy_version = *lowest;
  return absl::OkStatus();
}

}  // namespace rollpack
