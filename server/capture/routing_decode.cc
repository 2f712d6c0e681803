#include "server/capture/routing_decode.h"

#include <cstring>
#include <optional>
#include <utility>

#include "base/status_macros.h"
#include "server/capture/base64.h"
#include "server/capture/npy_header.h"
#include "server/capture/routing_rows.h"
#include "server/capture/sglang_routing.h"

namespace rollpack {
namespace {

// Base64 characters of a .npy preamble: magic, version and header length
// (12 bytes in versions 2 and 3).
constexpr size_t kPreambleChars = 16;

// The whole file decoded into a buffer, parsed, and copied or converted
// out of it: the path of every payload the direct one does not take, and
// the one whose errors say what is wrong.
absl::StatusOr<v1::NDArray> NpyThroughBuffer(absl::string_view base64) {
  std::string file;
  RETURN_IF_ERROR(DecodeBase64Into(base64, file));
  ASSIGN_OR_RETURN(NpyArray npy, ParseNpy(file));
  return RoutingNdArray(npy);
}

// The .npy of `base64` decoded straight into an NDArray: the groups that
// hold the header apart (with the data's first bytes, where the header ends
// within a group), then the rest into the array's bytes. Nothing when the
// payload is not a well-formed .npy of a kept dtype.
std::optional<v1::NDArray> NpyDirect(absl::string_view base64) {
  if (base64.size() <= kPreambleChars) return std::nullopt;
  char preamble[kPreambleChars / 4 * 3];
  if (!DecodeBase64(base64.substr(0, kPreambleChars), absl::MakeSpan(preamble)).ok()) {
    return std::nullopt;
  }
  const absl::StatusOr<size_t> header_bytes =
      NpyHeaderBytes(absl::string_view(preamble, sizeof(preamble)));
  if (!header_bytes.ok()) return std::nullopt;
  const size_t head_chars = (*header_bytes + 2) / 3 * 4;
  // The data starts before the last group, the one that may be padded.
  if (head_chars >= base64.size()) return std::nullopt;
  std::string head(head_chars / 4 * 3, '\0');
  if (!DecodeBase64(base64.substr(0, head_chars), absl::MakeSpan(head)).ok()) {
    return std::nullopt;
  }
  const absl::StatusOr<NpyArray> npy =
      ParseNpyHeader(absl::string_view(head).substr(0, *header_bytes));
  if (!npy.ok()) return std::nullopt;
  const std::optional<v1::DType> dtype = KeptRoutingDtype(*npy);
  const size_t data_bytes = Base64DecodedSize(base64) - *header_bytes;
  const size_t lead = head.size() - *header_bytes;
  if (!dtype.has_value() || data_bytes < lead ||
      static_cast<int64_t>(data_bytes) != NpyDataBytes(*npy)) {
    return std::nullopt;
  }
  v1::NDArray array;
  array.set_dtype(*dtype);
  for (int64_t dim : npy->shape) array.add_shape(dim);
  std::string& data = *array.mutable_data();
  data.resize(data_bytes);
  std::memcpy(data.data(), head.data() + *header_bytes, lead);
  const absl::StatusOr<size_t> rest = DecodeBase64(
      base64.substr(head_chars), absl::MakeSpan(data.data() + lead, data_bytes - lead));
  if (!rest.ok() || *rest != data_bytes - lead) return std::nullopt;
  return array;
}

}  // namespace

absl::Status DecodeBase64Into(absl::string_view base64, std::string& out) {
  out.resize(Base64DecodedSize(base64));
  ASSIGN_OR_RETURN(size_t size, DecodeBase64(base64, absl::MakeSpan(out)));
  out.resize(size);
  return absl::OkStatus();
}

absl::StatusOr<v1::NDArray> DecodeNpyRouting(absl::string_view base64) {
  std::optional<v1::NDArray> direct = NpyDirect(base64);
  if (direct.has_value()) return *std::move(direct);
  return NpyThroughBuffer(base64);
}

absl::StatusOr<DecodedRouting> DecodeSglangRouting(absl::string_view base64,
                                                   absl::string_view dtype_name,
                                                   int64_t num_tokens, const ModelSpec& model,
                                                   int64_t start) {
  const absl::StatusOr<NpyArray> dtype = EngineDtype(dtype_name.empty() ? "int32" : dtype_name);
  const std::optional<v1::DType> kept =
      dtype.ok() ? KeptRoutingDtype(*dtype) : std::optional<v1::DType>();
  DecodedRouting out;
  std::string buffer;
  std::string& bytes = kept.has_value() ? *out.array.mutable_data() : buffer;
  RETURN_IF_ERROR(DecodeBase64Into(base64, bytes));
  ASSIGN_OR_RETURN(PlacedRouting placed,
                   PlaceSglangRouting(bytes, dtype_name, num_tokens, model, start));
  out.row_offset = placed.row_offset;
  if (!kept.has_value()) {
    ASSIGN_OR_RETURN(out.array, RoutingNdArray(placed.array));
    return out;
  }
  out.array.set_dtype(*kept);
  for (int64_t dim : placed.array.shape) out.array.add_shape(dim);
  return out;
}

}  // namespace rollpack
