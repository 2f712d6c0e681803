// An engine's routing rows for one choice, made into a Sample's
// routed_experts (shared/spec/capture.md section 3): the same rules as the
// Python adapters' `place` (client/python/rollpack/adapters/_common.py), so
// that a rollout captured by the proxy and one put by a producer are the
// same sample.
#ifndef ROLLPACK_SERVER_CAPTURE_ROUTING_ROWS_H_
#define ROLLPACK_SERVER_CAPTURE_ROUTING_ROWS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "rollpack/v1/ndarray.pb.h"
#include "scheduler/model_spec.h"
#include "server/capture/npy_header.h"

namespace rollpack {

// The row offset of a [rows, layers, K] payload of a choice of `num_tokens`
// tokens, asked from `start`: rows cover [offset, n - 1) (or [offset, n)),
// with offset `start`, or 0 from an engine that ignored the start asked
// for. INVALID_ARGUMENT naming the shape and what the model and the tokens
// allow: layers other than num_layers (full) or the MoE layers (compact),
// plus the routed MTP layers; K other than topk; rows that fit no offset; a
// dense model.
absl::StatusOr<int64_t> PlaceRoutingRows(absl::Span<const int64_t> shape, int64_t num_tokens,
                                         const ModelSpec& model, int64_t start);

// `array` as an NDArray of a dtype routed_experts takes: uint8, uint16,
// int16 and int32 as they are; int8 widened to int16; int64 and uint32
// narrowed to int32 when every id fits (INVALID_ARGUMENT naming the first
// that does not).
absl::StatusOr<v1::NDArray> RoutingNdArray(const NpyArray& array);

// The dtype routed_experts keeps ids of `array`'s dtype in as they come
// (uint8, uint16, int16, int32), or none when RoutingNdArray converts them.
std::optional<v1::DType> KeptRoutingDtype(const NpyArray& array);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_ROUTING_ROWS_H_
