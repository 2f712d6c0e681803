// Routing-replay kernels, CPU side: one include for callers, whatever they use.
//
// The declarations and their semantics live with each operation, so that a
// change to one does not touch the others:
//   kernels/common.h     status, element types, IndexView, limits, bf16 helpers
//   kernels/unpack.h     received [rows, layers, K] buffer -> per-layer ids
//   kernels/unpack_static.h  the same into a caller's static buffer (CUDA graphs)
//   kernels/apply.h      live logits + replay ids -> probs, routing map, gradient
//   kernels/agreement.h  live vs replayed selection, per layer
//   kernels/masked_logprob.h  logits + sampling mask -> the sampled token's
//                        log-probability under the mask, and its gradient
// kernels/replay_kernels_cuda.h gathers the CUDA versions the same way;
// kernels/replay_kernels_absl.h adapts KernelStatus to absl::Status.
#ifndef ROLLPACK_KERNELS_REPLAY_KERNELS_H_
#define ROLLPACK_KERNELS_REPLAY_KERNELS_H_

#include "kernels/agreement.h"
#include "kernels/apply.h"
#include "kernels/common.h"
#include "kernels/masked_logprob.h"
#include "kernels/unpack.h"
#include "kernels/unpack_static.h"

#endif  // ROLLPACK_KERNELS_REPLAY_KERNELS_H_
