// CUDA versions of the routing-replay kernels (semantics in replay_kernels.h).
//
// Same argument structs as the CPU versions; every pointer in them is a device
// pointer (mask too). `stream` is a cudaStream_t passed as void* (nullptr =
// the legacy default stream), so this header needs no CUDA include and binds
// easily from Python (torch.cuda.current_stream().cuda_stream). Every call is
// asynchronous on `stream`, validates shapes first (INVALID_ARGUMENT, nothing
// launched) and checks its launch with cudaGetLastError (INTERNAL with the
// CUDA error string). Kernel faults surface at the caller's next sync.
#pragma once

#include "kernels/replay_kernels.h"

namespace rollpack::kernels::cuda {

// kAuto picks kTiled (shared-memory transpose of a block of >= 16 rows,
// 16-byte loads and stores) and falls back to kDirect (one thread per 16
// output bytes, gathering from global memory) when 16 rows of layers * K ids
// do not fit in shared memory. kTiledFlat is the first tiled version, kept for
// the benchmark. Explicit kTiled/kTiledFlat return INVALID_ARGUMENT when the
// tile does not fit.
enum class UnpackVariant : int { kAuto = 0, kTiled = 1, kDirect = 2, kTiledFlat = 3 };

KernelStatus Unpack(const UnpackArgs& a, void* stream);
KernelStatus UnpackWithVariant(const UnpackArgs& a, UnpackVariant v, void* stream);

KernelStatus ApplyForward(const ApplyArgs& a, const ApplyForwardOut& out, void* stream);
KernelStatus ApplyBackward(const ApplyArgs& a, const float* grad_probs,
                           void* grad_logits, void* stream);

// stats: device array of `layers` AgreementStats (3 x int64 each), overwritten.
KernelStatus AgreementFromLogits(const AgreementLogitsArgs& a, AgreementStats* stats,
                                 void* stream);
KernelStatus AgreementFromIds(const AgreementIdsArgs& a, AgreementStats* stats,
                              void* stream);

}  // namespace rollpack::kernels::cuda
