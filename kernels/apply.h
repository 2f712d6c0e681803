// Apply: live router logits + replay ids -> the router's outputs as if it had
// chosen the replayed experts (forward), and the gradient back to the logits.
//
// Live router logits x [rows, E] (fp32 or bf16, row-contiguous; bf16 is
// computed in fp32 internally) and replay ids i[r, k] (any IndexView type, so
// the unpacked int64/int32 tensor or the received uint8/uint16 buffer
// directly).
//   s = softmax(x) over all E experts (kSoftmax) or sigmoid(x) (kSigmoid)
//   p_k = s[i_k]
//   renormalize: q_k = p_k / (sum_j p_j + eps), eps = 0 for softmax,
//                1e-20 for sigmoid (as Megatron); else q_k = p_k
//   probs[r, k] = scale * q_k                                  (fp32 [rows, K])
//   routing_map[r, e] = 1 if e is one of the row's ids else 0   (uint8 [rows, E],
//                                                  torch.bool compatible)
//   probs_dense[r, e] = probs[r, k] at e = i_k, 0 elsewhere    (optional, fp32)
// Softmax + renormalize is exactly Megatron's "top-k then softmax over the K
// logits" path (moe_router_pre_softmax = False); softmax without it is the
// pre-softmax path; sigmoid + renormalize is the DeepSeek-V3 path (an expert
// bias only changes which experts are selected, and replay fixes those). All
// rows are processed regardless of the mask (the caller decides which ids to
// feed; unpack's filler ids are valid).
// ApplyBackward: given g = d(loss)/d(probs) fp32 [rows, K], writes the exact
// analytic d(loss)/d(x) [rows, E] (same dtype as x), through the
// renormalization and the softmax normalization over all E. A repeated id in a
// row contributes once per occurrence to the gradient (probs are then
// per-occurrence; the map/dense outputs hold one entry). Ids outside [0, E):
// the CPU version returns INVALID_ARGUMENT; the CUDA version never reads or
// writes out of bounds and, for a row holding one, writes NaN probs, an
// all-zero routing-map row, a NaN dense row and a NaN gradient row.
// Conventions shared with unpack and agreement: common.h.
#ifndef ROLLPACK_KERNELS_APPLY_H_
#define ROLLPACK_KERNELS_APPLY_H_

#include <cstdint>

#include "kernels/common.h"

namespace rollpack::kernels {

struct ApplyArgs {
  const void* logits = nullptr;    // [rows, E]
  FloatType logits_type = FloatType::kF32;
  IndexView ids;                   // [rows, K] (layer_stride unused)
  int64_t rows = 0;
  int experts = 0;                 // E
  int k = 0;
  ScoreFunction score = ScoreFunction::kSoftmax;
  bool renormalize = false;
  float scale = 1.0f;
};

struct ApplyForwardOut {
  float* probs = nullptr;          // [rows, K], required
  uint8_t* routing_map = nullptr;  // [rows, E], optional
  float* probs_dense = nullptr;    // [rows, E], optional
};

// Shape validation shared by the CPU and CUDA versions.
KernelStatus ValidateApply(const ApplyArgs& a);

namespace cpu {

// Computes in float64, stores fp32.
KernelStatus ApplyForward(const ApplyArgs& a, const ApplyForwardOut& out);
// grad_probs fp32 [rows, K]; grad_logits [rows, E] of a.logits_type.
KernelStatus ApplyBackward(const ApplyArgs& a, const float* grad_probs,
                           void* grad_logits);

}  // namespace cpu
}  // namespace rollpack::kernels

#endif  // ROLLPACK_KERNELS_APPLY_H_
