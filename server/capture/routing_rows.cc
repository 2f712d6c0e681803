#include "server/capture/routing_rows.h"

#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rollpack {
namespace {

std::string ShapeText(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Converts `count` little-endian elements of `From` to `To`, refusing one
// outside To's range.
template <typename From, typename To>
absl::Status Convert(absl::string_view data, int64_t count, std::string& out) {
  out.resize(static_cast<size_t>(count) * sizeof(To));
  for (int64_t i = 0; i < count; ++i) {
    From v;
    std::memcpy(&v, data.data() + i * sizeof(From), sizeof(From));
    if (static_cast<int64_t>(v) < std::numeric_limits<To>::min() ||
        static_cast<int64_t>(v) > static_cast<int64_t>(std::numeric_limits<To>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("routed expert id ", static_cast<int64_t>(v), " at element ", i,
                       " does not fit the ids' ", sizeof(To) * 8, "-bit type"));
    }
    const To t = static_cast<To>(v);
    std::memcpy(out.data() + i * sizeof(To), &t, sizeof(To));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> PlaceRoutingRows(absl::Span<const int64_t> shape, int64_t num_tokens,
                                         const ModelSpec& model, int64_t start) {
  if (model.is_dense()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model \"", model.name, "\" is dense (num_experts 0): it has no routed experts"));
  }
  if (shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("routed experts must be [rows, layers, topk], got ", ShapeText(shape)));
  }
  const int64_t rows = shape[0], layers = shape[1], k = shape[2];
  const int64_t mtp = model.routed_mtp_layers();
  const int64_t full = model.num_layers + mtp, compact = model.num_moe_layers() + mtp;
  if (layers != full && layers != compact) {
    return absl::InvalidArgumentError(absl::StrCat(
        "routed experts ", ShapeText(shape), " have ", layers, " layers; model \"", model.name,
        "\" has ", full, " (full layout) or ", compact, " (compact)"));
  }
  if (k != model.topk) {
    return absl::InvalidArgumentError(absl::StrCat("routed experts ", ShapeText(shape), " have ",
                                                   k, " experts per token; model \"",
                                                   model.name, "\" has topk ", model.topk));
  }
  if (start < 0 || num_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("start offset ", start, " of ", num_tokens, " tokens"));
  }
  // Rows end at n - 1 (the last sampled token was never forwarded), or at n;
  // an engine that ignored the start asked for starts at 0.
  const int64_t starts[] = {start, 0};
  for (int64_t end : {num_tokens - 1, num_tokens}) {
    for (int64_t s : starts) {
      if (end - s == rows) return s;  // s + rows may overflow (the client's start)
      if (start == 0) break;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "routed experts ", ShapeText(shape), " have ", rows, " rows; with ", num_tokens,
      " tokens from offset ", start, start > 0 ? " (or 0)" : "",
      " they must end at token ", num_tokens - 1, " or ", num_tokens));
}

std::optional<v1::DType> KeptRoutingDtype(const NpyArray& array) {
  switch (array.item_bytes * (array.is_signed ? -1 : 1)) {
    case 1:
      return v1::UINT8;
    case 2:
      return v1::UINT16;
    case -2:
      return v1::INT16;
    case -4:
      return v1::INT32;
    default:
      return std::nullopt;
  }
}

absl::StatusOr<v1::NDArray> RoutingNdArray(const NpyArray& array) {
  v1::NDArray out;
  int64_t count = 1;
  for (int64_t dim : array.shape) {
    out.add_shape(dim);
    count *= dim;
  }
  std::string& data = *out.mutable_data();
  if (const std::optional<v1::DType> kept = KeptRoutingDtype(array); kept.has_value()) {
    out.set_dtype(*kept);
    data.assign(array.data.data(), array.data.size());
    return out;
  }
  switch (array.item_bytes * (array.is_signed ? -1 : 1)) {
    case -1:
      out.set_dtype(v1::INT16);
      if (absl::Status s = Convert<int8_t, int16_t>(array.data, count, data); !s.ok()) return s;
      return out;
    case 4:
      out.set_dtype(v1::INT32);
      if (absl::Status s = Convert<uint32_t, int32_t>(array.data, count, data); !s.ok()) return s;
      return out;
    case -8:
      out.set_dtype(v1::INT32);
      if (absl::Status s = Convert<int64_t, int32_t>(array.data, count, data); !s.ok()) return s;
      return out;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("routed experts of dtype ", array.descr, " (ids are stored as uint8, "
                       "uint16, int16 or int32)"));
  }
}

}  // namespace rollpack
