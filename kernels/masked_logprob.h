// Masked log-probabilities: the sampled token's log-probability under the
// engine's sampling mask (docs/layout.md section 13, field `sampling_mask`).
//
// The engine samples token y_t from the softmax of its logits restricted to
// the ids its top-k/top-p/min-p filter kept, S_t. Replaying that mask in the
// trainer means computing, for every row t of live logits z [rows, V]:
//   lse_t     = log sum_{u in S_t} exp(z_t[u])
//   logprob_t = z_t[y_t] - lse_t
// with S_t = values[offsets[t] : offsets[t+1]] (CSR; offsets[0] need not be
// 0, so a shifted view of the delivered offsets works directly).
//   - An empty S_t means "no mask": the full-vocabulary log-softmax (prompt
//     and padding positions carry empty lists).
//   - y_t not in a non-empty S_t: logprob_t = -inf (probability 0 under the
//     engine's distribution), lse_t as above, and no gradient through
//     logprob_t (it is a constant).
// Backward, given g_t = dL/dlogprob_t and optional h_t = dL/dlse_t:
//   dL/dz_t[v] = g_t * 1[v == y_t] + (h_t - g_t) * exp(z_t[v] - lse_t)   v in S_t
//              = 0                                                        v not in S_t
// (g_t is taken as 0 where y_t is not in S_t; an empty S_t is all of [0, V)).
// The gradient is written dense, [rows, V] of the logits' dtype.
//
// Logits fp32 or bf16 (raw uint16 bits), row-contiguous; bf16 is computed in
// fp32 (the CPU reference in float64). Ids: uint16, int32 or int64; offsets
// and targets int32 or int64. The ids of one list must be distinct (engines
// send sets): the CPU version refuses a repeated id, the CUDA version does not
// look (a per-row sort would cost more than the kernel) and its result for
// such a row is unspecified.
// Out-of-range input (an id or target outside [0, V), offsets decreasing or
// past num_values): the CPU version returns INVALID_ARGUMENT naming the row;
// the CUDA version never reads or writes out of bounds and writes NaN logprob
// and lse for that row (backward: a NaN gradient row).
#ifndef ROLLPACK_KERNELS_MASKED_LOGPROB_H_
#define ROLLPACK_KERNELS_MASKED_LOGPROB_H_

#include <cstdint>

#include "kernels/common.h"

namespace rollpack::kernels {

struct MaskedLogprobArgs {
  const void* logits = nullptr;  // [rows, V]
  FloatType logits_type = FloatType::kF32;
  int64_t rows = 0;
  int64_t vocab = 0;             // V
  const void* values = nullptr;  // [num_values] kept ids
  IndexType values_type = IndexType::kI32;
  int64_t num_values = 0;
  const void* offsets = nullptr;  // [rows + 1]
  IndexType offsets_type = IndexType::kI64;
  const void* targets = nullptr;  // [rows] sampled ids y_t
  IndexType targets_type = IndexType::kI64;
};

// Shape and type validation shared by the CPU and CUDA versions (what can be
// checked without reading the arrays).
KernelStatus ValidateMaskedLogprob(const MaskedLogprobArgs& a);

namespace cpu {

// logprobs fp32 [rows], required; lse fp32 [rows], optional (nullptr).
KernelStatus MaskedLogprobForward(const MaskedLogprobArgs& a, float* logprobs, float* lse);
// lse: the forward's [rows]; grad_logprobs fp32 [rows]; grad_lse fp32 [rows]
// or nullptr (= 0); grad_logits [rows, V] of a.logits_type.
KernelStatus MaskedLogprobBackward(const MaskedLogprobArgs& a, const float* lse,
                                   const float* grad_logprobs, const float* grad_lse,
                                   void* grad_logits);

}  // namespace cpu
}  // namespace rollpack::kernels

#endif  // ROLLPACK_KERNELS_MASKED_LOGPROB_H_
