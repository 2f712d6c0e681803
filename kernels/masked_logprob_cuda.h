// CUDA masked log-probabilities (semantics in masked_logprob.h, conventions
// in replay_kernels_cuda.h: device pointers, `stream` a cudaStream_t as void*,
// asynchronous, shapes validated before any launch).
#ifndef ROLLPACK_KERNELS_MASKED_LOGPROB_CUDA_H_
#define ROLLPACK_KERNELS_MASKED_LOGPROB_CUDA_H_

#include "kernels/common.h"
#include "kernels/masked_logprob.h"

namespace rollpack::kernels::cuda {

KernelStatus MaskedLogprobForward(const MaskedLogprobArgs& a, float* logprobs, float* lse,
                                  void* stream);
KernelStatus MaskedLogprobBackward(const MaskedLogprobArgs& a, const float* lse,
                                   const float* grad_logprobs, const float* grad_lse,
                                   void* grad_logits, void* stream);

}  // namespace rollpack::kernels::cuda

#endif  // ROLLPACK_KERNELS_MASKED_LOGPROB_CUDA_H_
