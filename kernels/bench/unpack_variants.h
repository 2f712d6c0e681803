// The replay-unpack kernel variants the benchmark and the GPU test compare,
// the retired tiled kernels among them.
#ifndef ROLLPACK_KERNELS_BENCH_UNPACK_VARIANTS_H_
#define ROLLPACK_KERNELS_BENCH_UNPACK_VARIANTS_H_

#include "kernels/unpack_cuda.h"

namespace rollpack::kernels::cuda {

// kPipelined: a persistent grid (a few blocks per SM), each block walking
// tiles of rows through a 3-stage shared-memory ring filled with cp.async, so
// that the next tiles' loads are in flight while the current tile's layers are
// written with 16-byte stores. kDirect: one thread per 16 output bytes,
// gathering from global memory (rows too large for any tile). kAuto: what
// Unpack runs. kTiled (one block per tile of >= 16 rows, load then store; the
// default before kPipelined) and kTiledFlat (the first tiled version) are kept
// only for the benchmark's comparison: any row too large for kPipelined's
// smallest tile is also too large for kTiled's 16 rows, so Unpack never runs
// them. Explicit kTiled/kTiledFlat/kPipelined return INVALID_ARGUMENT when
// their tile does not fit; any other value runs kDirect.
enum class UnpackVariant : int {
  kAuto = 0,
  kTiled = 1,
  kDirect = 2,
  kTiledFlat = 3,
  kPipelined = 4,
};

// Any variant, checks included. Lives with the benchmark (target
// rollpack_unpack_variants), so the trainer's library carries only the
// kernels Unpack runs.
KernelStatus UnpackWithVariant(const UnpackArgs& a, UnpackVariant v, void* stream);

}  // namespace rollpack::kernels::cuda

#endif  // ROLLPACK_KERNELS_BENCH_UNPACK_VARIANTS_H_
