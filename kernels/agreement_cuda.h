// CUDA agreement (semantics in agreement.h, conventions in
// replay_kernels_cuda.h).
#ifndef ROLLPACK_KERNELS_AGREEMENT_CUDA_H_
#define ROLLPACK_KERNELS_AGREEMENT_CUDA_H_

#include "kernels/agreement.h"
#include "kernels/common.h"

namespace rollpack::kernels::cuda {

// stats: device array of `layers` AgreementStats (3 x int64 each), overwritten.
// Integer counts rather than fractions, so that the result is deterministic
// whatever the order of the blocks' atomics.
KernelStatus AgreementFromLogits(const AgreementLogitsArgs& a, AgreementStats* stats,
                                 void* stream);
KernelStatus AgreementFromIds(const AgreementIdsArgs& a, AgreementStats* stats,
                              void* stream);

}  // namespace rollpack::kernels::cuda

#endif  // ROLLPACK_KERNELS_AGREEMENT_CUDA_H_
