// Unpack: the received replay buffer -> per-layer expert ids for the router.
//
// layout.md section 7 sends `replay_experts` [rows, layers, K] (uint8 when
// E <= 256, else uint16, token-major) and `replay_mask` uint8 [rows]. Unpack
// writes, in one pass over all layers,
//     out[l * out_layer_stride + r * K + k] = experts[(r * layers + l) * K + k]
// as int64 or int32, i.e. x.permute(1, 0, 2).to(int64).contiguous() when
// out_layer_stride == rows * K. out + l * out_layer_stride is then the
// [rows, K] tensor that Megatron's RouterReplay.set_target_indices takes for
// local layer l. Rows with mask 0 carry filler ids that the sender made valid
// and distinct (layout.md section 7); they are COPIED THROUGH by default, so
// the trainer can feed every row to the router unchanged. With
// masked_fill_minus_one (and a non-null mask) those rows are written as -1
// instead. mask may be null (= all ones). Ids are not range-checked here.
// Conventions shared with apply and agreement: common.h.
#ifndef ROLLPACK_KERNELS_UNPACK_H_
#define ROLLPACK_KERNELS_UNPACK_H_

#include <cstdint>

#include "kernels/common.h"

namespace rollpack::kernels {

struct UnpackArgs {
  const void* experts = nullptr;   // [rows, layers, K]
  IndexType in_type = IndexType::kU8;  // kU8 or kU16 only
  const uint8_t* mask = nullptr;   // [rows] or null
  int64_t rows = 0;
  int64_t layers = 0;
  int k = 0;
  void* out = nullptr;             // layer l at out + l * out_layer_stride
  OutIndexType out_type = OutIndexType::kI64;
  int64_t out_layer_stride = -1;   // elements; -1 means rows * K
  bool masked_fill_minus_one = false;
};

// Shape validation shared by the CPU and CUDA versions.
KernelStatus ValidateUnpack(const UnpackArgs& a);

namespace cpu {

KernelStatus Unpack(const UnpackArgs& a);

}  // namespace cpu
}  // namespace rollpack::kernels

#endif  // ROLLPACK_KERNELS_UNPACK_H_
