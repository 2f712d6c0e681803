// CUDA unpack (semantics in unpack.h, conventions in replay_kernels_cuda.h).
#ifndef ROLLPACK_KERNELS_UNPACK_CUDA_H_
#define ROLLPACK_KERNELS_UNPACK_CUDA_H_

#include "kernels/common.h"
#include "kernels/unpack.h"

namespace rollpack::kernels::cuda {

// Knobs of kPipelined, for the benchmark's sweep (0 / -1 = automatic).
struct UnpackConfig {
  int tile_rows = 0;         // rows per tile (rounded to the alignment granule)
  int blocks_per_sm = 0;     // resident blocks per SM (capped by occupancy)
  int streaming_stores = -1; // st.global.cs for the output: 0 off, 1 on, -1 auto (on)
};

// kPipelined, or kDirect when even its smallest tile does not fit in shared
// memory (variants below).
KernelStatus Unpack(const UnpackArgs& a, void* stream);
// kPipelined with explicit knobs (INVALID_ARGUMENT when the tile cannot fit).
KernelStatus UnpackPipelined(const UnpackArgs& a, const UnpackConfig& c, void* stream);

namespace internal {

// For the benchmark's variants (bench/unpack_variants.h). Unpack's checks before any launch; *launch is false
// when they failed or there is nothing to write.
KernelStatus CheckUnpack(const UnpackArgs& a, bool* launch);
// kDirect alone, checks included.
KernelStatus UnpackDirect(const UnpackArgs& a, void* stream);

}  // namespace internal
}  // namespace rollpack::kernels::cuda

#endif  // ROLLPACK_KERNELS_UNPACK_CUDA_H_
