// CUDA apply forward/backward (semantics in apply.h, conventions in
// replay_kernels_cuda.h).
#ifndef ROLLPACK_KERNELS_APPLY_CUDA_H_
#define ROLLPACK_KERNELS_APPLY_CUDA_H_

#include "kernels/apply.h"
#include "kernels/common.h"

namespace rollpack::kernels::cuda {

KernelStatus ApplyForward(const ApplyArgs& a, const ApplyForwardOut& out, void* stream);
KernelStatus ApplyBackward(const ApplyArgs& a, const float* grad_probs,
                           void* grad_logits, void* stream);

}  // namespace rollpack::kernels::cuda

#endif  // ROLLPACK_KERNELS_APPLY_CUDA_H_
