#include "server/capture/sglang_routing.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "server/capture/routing_rows.h"

namespace rollpack {

absl::StatusOr<NpyArray> EngineDtype(absl::string_view name) {
  absl::string_view s = absl::StripAsciiWhitespace(name);
  for (absl::string_view prefix : {"torch.", "numpy.", "np."}) absl::ConsumePrefix(&s, prefix);
  struct Known {
    absl::string_view name;
    const char* descr;
  };
  static constexpr Known kKnown[] = {
      {"int8", "|i1"},   {"uint8", "|u1"},  {"int16", "<i2"}, {"short", "<i2"},
      {"uint16", "<u2"}, {"int32", "<i4"},  {"int", "<i4"},   {"uint32", "<u4"},
      {"int64", "<i8"},  {"long", "<i8"},   {"uint64", "<u8"}, {"|i1", "|i1"},
      {"|u1", "|u1"},    {"<i2", "<i2"},    {"<u2", "<u2"},   {"<i4", "<i4"},
      {"<u4", "<u4"},    {"<i8", "<i8"},    {"<u8", "<u8"},   {"i1", "|i1"},
      {"u1", "|u1"},     {"i2", "<i2"},     {"u2", "<u2"},    {"i4", "<i4"},
      {"u4", "<u4"},     {"i8", "<i8"},     {"u8", "<u8"},
  };
  for (const Known& k : kKnown) {
    if (s == k.name) {
      NpyArray array;
      array.descr = k.descr;
      array.item_bytes = array.descr[2] - '0';
      array.is_signed = array.descr[1] == 'i';
      return array;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("routed_experts_dtype \"", name, "\" is not an integer dtype"));
}

absl::StatusOr<PlacedRouting> PlaceSglangRouting(absl::string_view data,
                                                 absl::string_view dtype_name,
                                                 int64_t num_tokens, const ModelSpec& model,
                                                 int64_t start) {
  absl::StatusOr<NpyArray> dtype = EngineDtype(dtype_name.empty() ? "int32" : dtype_name);
  if (!dtype.ok()) return dtype.status();
  if (model.is_dense()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model \"", model.name, "\" is dense (num_experts 0): it has no routed experts"));
  }
  if (data.size() % dtype->item_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("SGLang routed_experts holds ", data.size(),
                                                   " bytes, not a multiple of ",
                                                   dtype->descr, "'s ", dtype->item_bytes));
  }
  if (start < 0 || num_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("start offset ", start, " of ", num_tokens, " tokens"));
  }
  const int64_t values = static_cast<int64_t>(data.size()) / dtype->item_bytes;
  const int64_t k = model.topk;
  const int64_t mtp = model.routed_mtp_layers();
  std::vector<int64_t> layer_counts = {model.num_layers + mtp};
  if (model.num_moe_layers() != model.num_layers) {
    layer_counts.push_back(model.num_moe_layers() + mtp);
  }
  std::vector<int64_t> starts = {start};
  if (start > 0) starts.push_back(0);  // builds that ignore the start answer from 0
  std::vector<std::string> fits;
  for (int64_t end : {num_tokens - 1, num_tokens}) {
    for (int64_t s : starts) {
      for (int64_t layers : layer_counts) {
        const int64_t rows = end - s;
        if (rows < 0) continue;
        if (rows * layers * k == values) {
          PlacedRouting placed{*std::move(dtype), s};
          placed.array.shape = {rows, layers, k};
          placed.array.data = data;
          absl::StatusOr<int64_t> offset =
              PlaceRoutingRows(placed.array.shape, num_tokens, model, s);
          if (!offset.ok()) return offset.status();
          placed.row_offset = *offset;
          return placed;
        }
        fits.push_back(absl::StrCat(rows * layers * k));
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "SGLang routed_experts holds ", values, " ", dtype->descr, " values; with ", num_tokens,
      " tokens, start ", start, ", topk ", k, " and ", absl::StrJoin(layer_counts, " or "),
      " layers it should hold ", absl::StrJoin(fits, " or ")));
}

}  // namespace rollpack
