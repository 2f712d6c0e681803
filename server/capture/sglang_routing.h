// SGLang's routing payload (shared/spec/capture.md section 3.1): the base64
// of the raw little-endian values, of `routed_experts_dtype` (int32 when
// absent), with no shape: it comes from the model and the tokens. The
// Python adapter's rules (client/python/rollpack/adapters/sglang.py) in C++.
#ifndef ROLLPACK_SERVER_CAPTURE_SGLANG_ROUTING_H_
#define ROLLPACK_SERVER_CAPTURE_SGLANG_ROUTING_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "scheduler/model_spec.h"
#include "server/capture/npy_header.h"

namespace rollpack {

// The integer dtype an engine names ("int32", "torch.int32", "np.int16",
// "long", "<i4", "uint8", ...) as an NpyArray's descr, item size and
// signedness (shape and data left empty). INVALID_ARGUMENT naming it when
// it is not an integer dtype.
absl::StatusOr<NpyArray> EngineDtype(absl::string_view name);

struct PlacedRouting {
  NpyArray array;          // [rows, layers, topk] over `data`
  int64_t row_offset = 0;  // the first token the rows cover
};

// `data` (the decoded bytes) of dtype `dtype_name` ("" = int32) for a
// choice of `num_tokens` tokens asked from `start`: the shape whose rows
// end at n - 1 (or n) from `start`, or from 0 for builds that ignore the
// start, with the full or the compact layer count. INVALID_ARGUMENT naming
// the byte count and the shapes that would fit.
absl::StatusOr<PlacedRouting> PlaceSglangRouting(absl::string_view data,
                                                 absl::string_view dtype_name,
                                                 int64_t num_tokens, const ModelSpec& model,
                                                 int64_t start);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_SGLANG_ROUTING_H_
