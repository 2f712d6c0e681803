// Static unpack: a micro-batch's replay targets written into a buffer the
// caller allocated once, for routers run inside a captured CUDA graph
// (Megatron's RouterReplay.set_global_static_buffers: one buffer
// [max_tokens, num_layers, topk], layer l reading the view [:, l, :]).
//
// A captured graph replays fixed pointers and fixed shapes, so the targets of
// every micro-batch must land in the same memory, and rows the micro-batch
// does not have must still hold valid routing. For r < rows (the micro-batch's
// router rows) and every local layer l and j < K:
//     out[r * out_row_stride + l * out_layer_stride + j]
//         = experts[(r * layers + l) * K + j]          (as Unpack, unpack.h)
// with -1 on rows with mask 0 when masked_fill_minus_one (and a mask); for
// rows <= r < max_rows (padding up to the buffer's size):
//     out[...] = StaticFillerId(r, j, K, E) = (r * K + j) mod E
// layout.md section 7's filler continued past the micro-batch: K distinct ids
// in [0, E) per (row, layer), never one constant row, so the graph's
// dispatcher never sees duplicate ids or ids left from an older micro-batch.
// The K axis is contiguous; the strides (elements, >= 0) may describe any
// view whose (row, layer) runs do not overlap: row-major
// (out_layer_stride >= K, out_row_stride >= layers * out_layer_stride, e.g.
// the contiguous [max_rows, layers, K] buffer or a slice of a larger one) or
// layer-major (out_row_stride >= K, out_layer_stride >= max_rows *
// out_row_stride, e.g. [layers, max_rows, K] as Unpack writes). -1 means the
// contiguous [max_rows, layers, K] strides.
//
// rows_ptr: when set, the number of rows is read from *rows_ptr when the
// kernel runs (device memory for the CUDA version; clamped to
// [0, max_rows]), not from `rows`, and `experts` / `mask` must then hold
// max_rows rows. This is what makes a captured graph reusable: the graph
// reads a fixed staging buffer and a fixed row count that the caller
// refreshes outside the graph before each replay (docs/kernels.md).
// Conventions shared with the other kernels: common.h.
#ifndef ROLLPACK_KERNELS_UNPACK_STATIC_H_
#define ROLLPACK_KERNELS_UNPACK_STATIC_H_

#include <cstdint>

#include "kernels/common.h"

namespace rollpack::kernels {

struct StaticUnpackArgs {
  const void* experts = nullptr;       // [rows, layers, K] (max_rows rows with rows_ptr)
  IndexType in_type = IndexType::kU8;  // kU8 or kU16 only
  const uint8_t* mask = nullptr;       // [rows] or null
  int64_t rows = 0;                    // the micro-batch's router rows (ignored with rows_ptr)
  const int64_t* rows_ptr = nullptr;   // rows read at run time, see above
  int64_t layers = 0;
  int k = 0;
  int num_experts = 0;                 // E: filler ids are in [0, E)
  void* out = nullptr;
  OutIndexType out_type = OutIndexType::kI64;
  int64_t max_rows = 0;
  int64_t out_row_stride = -1;         // elements; -1 = layers * K
  int64_t out_layer_stride = -1;       // elements; -1 = K
  bool masked_fill_minus_one = false;
};

// The filler id of (row, j): layout.md section 7's (q * K + j) mod E with q
// the buffer row.
inline int64_t StaticFillerId(int64_t row, int j, int k, int num_experts) {
  return ((row % num_experts) * k + j) % num_experts;
}

// Shape validation shared by the CPU and CUDA versions: INVALID_ARGUMENT
// naming the field and the value (rows > max_rows names both).
KernelStatus ValidateStaticUnpack(const StaticUnpackArgs& a);

// The strides with -1 resolved.
int64_t StaticRowStride(const StaticUnpackArgs& a);
int64_t StaticLayerStride(const StaticUnpackArgs& a);

namespace cpu {

// rows_ptr, when set, is a host pointer here.
KernelStatus StaticUnpack(const StaticUnpackArgs& a);

}  // namespace cpu
}  // namespace rollpack::kernels

#endif  // ROLLPACK_KERNELS_UNPACK_STATIC_H_
