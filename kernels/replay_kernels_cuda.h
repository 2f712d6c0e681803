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

// kAuto picks kPipelined (below) and falls back to kTiled, then kDirect, when
// its tile does not fit in shared memory. kPipelined: a persistent grid (a few
// blocks per SM), each block owning one contiguous range of rows and walking
// it in tiles through a 3-stage shared-memory ring filled with cp.async, so
// that the next tiles' loads are in flight while the current tile's layers are
// written with 16-byte stores. kTiled: one block per tile of >= 16 rows, load
// then store (the previous default). kDirect: one thread per 16 output bytes,
// gathering from global memory (fallback when 16 rows of layers * K ids do
// not fit in shared memory). kTiledFlat: the first tiled version, kept for the
// benchmark. Explicit kTiled/kTiledFlat/kPipelined return INVALID_ARGUMENT
// when their tile does not fit.
enum class UnpackVariant : int {
  kAuto = 0,
  kTiled = 1,
  kDirect = 2,
  kTiledFlat = 3,
  kPipelined = 4,
};

// Knobs of kPipelined, for the benchmark's sweep (0 / -1 = automatic).
struct UnpackConfig {
  int tile_rows = 0;         // rows per tile (rounded to the alignment granule)
  int blocks_per_sm = 0;     // resident blocks per SM (capped by occupancy)
  int streaming_stores = -1; // st.global.cs for the output: 0 off, 1 on, -1 auto (on)
};

KernelStatus Unpack(const UnpackArgs& a, void* stream);
KernelStatus UnpackWithVariant(const UnpackArgs& a, UnpackVariant v, void* stream);
// kPipelined with explicit knobs (INVALID_ARGUMENT when the tile cannot fit).
KernelStatus UnpackPipelined(const UnpackArgs& a, const UnpackConfig& c, void* stream);

KernelStatus ApplyForward(const ApplyArgs& a, const ApplyForwardOut& out, void* stream);
KernelStatus ApplyBackward(const ApplyArgs& a, const float* grad_probs,
                           void* grad_logits, void* stream);

// stats: device array of `layers` AgreementStats (3 x int64 each), overwritten.
KernelStatus AgreementFromLogits(const AgreementLogitsArgs& a, AgreementStats* stats,
                                 void* stream);
KernelStatus AgreementFromIds(const AgreementIdsArgs& a, AgreementStats* stats,
                              void* stream);

}  // namespace rollpack::kernels::cuda
