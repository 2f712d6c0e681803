// A choice's routing payload, from the engine's base64 to the
// routed_experts NDArray its sample keeps (shared/spec/capture.md section
// 3.1), decoded once: straight into the array's bytes when the engine's
// dtype is one routed_experts keeps as it comes (uint8, uint16, int16,
// int32: what vLLM and SGLang send), through RoutingNdArray's conversion
// otherwise. An 8k-token int16 choice is 6 MB: decoding it into a buffer
// and copying it out cost 0.16 ms more (docs/performance.md, "Capture
// port").
#ifndef ROLLPACK_SERVER_CAPTURE_ROUTING_DECODE_H_
#define ROLLPACK_SERVER_CAPTURE_ROUTING_DECODE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "rollpack/v1/ndarray.pb.h"
#include "scheduler/model_spec.h"

namespace rollpack {

// All of `base64` into `out`, resized to the decoded bytes.
// INVALID_ARGUMENT as DecodeBase64.
absl::Status DecodeBase64Into(absl::string_view base64, std::string& out);

// vLLM: base64 of a .npy file. The array its header describes (the
// shape is the caller's to place: PlaceRoutingRows). INVALID_ARGUMENT as
// DecodeBase64, ParseNpy and RoutingNdArray, with the same messages.
absl::StatusOr<v1::NDArray> DecodeNpyRouting(absl::string_view base64);

struct DecodedRouting {
  v1::NDArray array;       // [rows, layers, topk]
  int64_t row_offset = 0;  // the first token the rows cover
};

// SGLang: base64 of raw values of `dtype_name` ("" = int32), shaped and
// placed by PlaceSglangRouting for a choice of `num_tokens` tokens asked
// from `start`. INVALID_ARGUMENT as DecodeBase64, PlaceSglangRouting and
// RoutingNdArray.
absl::StatusOr<DecodedRouting> DecodeSglangRouting(absl::string_view base64,
                                                   absl::string_view dtype_name,
                                                   int64_t num_tokens, const ModelSpec& model,
                                                   int64_t start);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_ROUTING_DECODE_H_
