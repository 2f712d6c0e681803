// CUDA static unpack (semantics in unpack_static.h, conventions in
// replay_kernels_cuda.h: device pointers, `stream` a cudaStream_t as void*).
//
// Both functions only launch a kernel on `stream`: no allocation, no copy, no
// synchronisation, no stream query. So they may be called while `stream` is
// being captured into a CUDA graph (torch.cuda.graph), and the graph then
// replays them with the pointers and scalars of that call.
#ifndef ROLLPACK_KERNELS_UNPACK_STATIC_CUDA_H_
#define ROLLPACK_KERNELS_UNPACK_STATIC_CUDA_H_

#include <cstdint>

#include "kernels/common.h"
#include "kernels/unpack_static.h"

namespace rollpack::kernels::cuda {

// With a.rows_ptr, the row count is read on the device when the kernel runs.
KernelStatus StaticUnpack(const StaticUnpackArgs& a, void* stream);

// *rows_ptr = rows, stream-ordered (a one-thread kernel: a host-to-device
// copy of a pageable value would synchronise, one of a pinned value would
// race with the next call's update).
KernelStatus StoreRows(int64_t* rows_ptr, int64_t rows, void* stream);

namespace internal {

// The kernels' grid cap, for the sweep (`unpack_static_gpu_test --sweep`):
// blocks of 256 threads per SM, 0 = the default, < 0 = no cap (one block per
// 256 work items).
struct StaticUnpackConfig {
  int blocks_per_sm = 0;
};
KernelStatus StaticUnpackWithConfig(const StaticUnpackArgs& a, const StaticUnpackConfig& c,
                                    void* stream);

}  // namespace internal

}  // namespace rollpack::kernels::cuda

#endif  // ROLLPACK_KERNELS_UNPACK_STATIC_CUDA_H_
