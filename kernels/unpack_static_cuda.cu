// CUDA static unpack (unpack_static_cuda.h). The targets of (row, layer) are
// one run of K ids in both the input and the buffer, so the work is a
// widening copy run by run: 16-byte chunks where the view allows, else runs.
#include "kernels/unpack_static_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/device_helpers.cuh"

namespace rollpack::kernels::cuda {
namespace {

using internal::CheckLaunch;
using internal::DispatchUnpackTypes;
using internal::GridFor;
using internal::kThreads;
using internal::NumSms;

struct StaticParams {
  const void* in;
  const uint8_t* mask;
  const int64_t* rows_ptr;
  void* out;
  int64_t rows;
  int64_t max_rows;
  int64_t rs;  // output row stride, elements
  int64_t ls;  // output layer stride, elements
  int layers;
  int k;
  int e;
  bool fill;
  bool narrow;  // max_rows * layers < 2^32: 32-bit index arithmetic
};

// Rows from the device scalar when given: written by the caller's stream
// before the kernel (StoreRows or a copy); clamped so that a bad value never
// reads past the staging buffer or writes past the static one.
__device__ __forceinline__ int64_t RowsOf(const StaticParams& p) {
  if (p.rows_ptr == nullptr) return p.rows;
  const int64_t rows = *p.rows_ptr;
  return rows < 0 ? 0 : (rows > p.max_rows ? p.max_rows : rows);
}

// (row, layer) of run u, in 32-bit arithmetic when it fits.
__device__ __forceinline__ void RowLayer(const StaticParams& p, int64_t u, int64_t* r, int* l) {
  if (p.narrow) {
    const uint32_t uu = uint32_t(u), rr = uu / uint32_t(p.layers);
    *r = rr;
    *l = int(uu - rr * uint32_t(p.layers));
  } else {
    *r = u / p.layers;
    *l = int(u - *r * p.layers);
  }
}

// ((r mod E) * K + j) mod E: StaticFillerId of (r, j), j < K <= E.
__device__ __forceinline__ int FillerStart(const StaticParams& p, int64_t r, int j) {
  const int q = p.narrow ? int(uint32_t(r) % uint32_t(p.e)) : int(r % p.e);
  return int((int64_t(q) * p.k + j) % p.e);
}

// The V ids of 16-byte chunk c (chunks of a run consecutive, runs in input
// order) and their offset in the buffer.
template <typename TIn, typename TOut>
__device__ __forceinline__ int64_t Chunk(const StaticParams& p, const TIn* __restrict__ in,
                                         int64_t rows, int cpr, int64_t c, TOut* v) {
  constexpr int V = 16 / int(sizeof(TOut));
  int64_t u;
  int j;
  if (p.narrow) {
    const uint32_t uu = uint32_t(c) / uint32_t(cpr);
    u = uu;
    j = int(uint32_t(c) - uu * uint32_t(cpr)) * V;
  } else {
    u = c / cpr;
    j = int(c - u * cpr) * V;
  }
  int64_t r;
  int l;
  RowLayer(p, u, &r, &l);
  if (r < rows) {
    const TIn* src = in + u * p.k + j;
    const bool neg = p.fill && __ldg(p.mask + r) == 0;
#pragma unroll
    for (int t = 0; t < V; ++t) v[t] = neg ? TOut(-1) : TOut(__ldg(src + t));
  } else {
    int f = FillerStart(p, r, j);
#pragma unroll
    for (int t = 0; t < V; ++t) {
      v[t] = TOut(f);
      if (++f == p.e) f = 0;
    }
  }
  return r * p.rs + int64_t(l) * p.ls + j;
}

// Every run starts 16-byte aligned and K is a multiple of the V ids of 16
// bytes: one thread per 16-byte chunk, so for the contiguous buffer a warp's
// store is 512 consecutive bytes (a widening copy) and its loads consecutive
// input bytes. Grid-stride when the grid is capped. (Two to eight chunks per
// thread, loads first, lost 3-50 % in the sweep: docs/kernels.md.)
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads) StaticUnpackVecKernel(const StaticParams p) {
  constexpr int V = 16 / int(sizeof(TOut));
  const int64_t rows = RowsOf(p);
  const TIn* __restrict__ in = static_cast<const TIn*>(p.in);
  TOut* __restrict__ out = static_cast<TOut*>(p.out);
  const int cpr = p.k / V;  // chunks per run
  const int64_t total = p.max_rows * p.layers * cpr;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < total;
       c += int64_t(gridDim.x) * blockDim.x) {
    alignas(16) TOut v[V];
    const int64_t dst = Chunk<TIn, TOut>(p, in, rows, cpr, c, v);
    *reinterpret_cast<uint4*>(out + dst) = *reinterpret_cast<const uint4*>(v);
  }
}

// Any other view: one thread per (row, layer) run of K ids, element stores.
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads) StaticUnpackRunKernel(const StaticParams p) {
  const int64_t rows = RowsOf(p);
  const TIn* in = static_cast<const TIn*>(p.in);
  TOut* out = static_cast<TOut*>(p.out);
  const int64_t units = p.max_rows * p.layers;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units;
       u += int64_t(gridDim.x) * blockDim.x) {
    int64_t r;
    int l;
    RowLayer(p, u, &r, &l);
    TOut* dst = out + r * p.rs + int64_t(l) * p.ls;
    if (r < rows) {
      const TIn* src = in + u * p.k;
      const bool neg = p.fill && __ldg(p.mask + r) == 0;
      for (int j = 0; j < p.k; ++j) dst[j] = neg ? TOut(-1) : TOut(__ldg(src + j));
    } else {
      int f = FillerStart(p, r, 0);
      for (int j = 0; j < p.k; ++j) {
        dst[j] = TOut(f);
        if (++f == p.e) f = 0;
      }
    }
  }
}

__global__ void StoreRowsKernel(int64_t* dst, int64_t rows) { *dst = rows; }

// Grid cap (blocks per SM) when the caller sets none, from the sweep
// (`unpack_static_gpu_test --sweep`, H100, docs/kernels.md): int64 buffers
// were fastest with one block per 256 chunks and no cap (78-93 % of the copy
// bandwidth against 73-84 % at 8 per SM), int32 ones with 16 per SM (99 %
// against 90 % uncapped).
constexpr int kDefaultBlocksPerSmI64 = -1;
constexpr int kDefaultBlocksPerSmI32 = 16;

template <typename TIn, typename TOut>
KernelStatus Launch(const StaticUnpackArgs& a, const internal::StaticUnpackConfig& cfg,
                    cudaStream_t st) {
  constexpr int V = 16 / int(sizeof(TOut));
  StaticParams p{};
  p.in = a.experts;
  p.mask = a.mask;
  p.rows_ptr = a.rows_ptr;
  p.out = a.out;
  p.rows = a.rows;
  p.max_rows = a.max_rows;
  p.rs = StaticRowStride(a);
  p.ls = StaticLayerStride(a);
  p.layers = int(a.layers);
  p.k = a.k;
  p.e = a.num_experts;
  p.fill = a.masked_fill_minus_one && a.mask != nullptr;
  const int64_t units = a.max_rows * a.layers;
  // Chunk indices (vector path) are below units * K.
  p.narrow = units * a.k < (int64_t{1} << 32);
  constexpr int64_t sz = int64_t(sizeof(TOut));
  const bool vec = reinterpret_cast<uintptr_t>(a.out) % 16 == 0 && a.k % V == 0 &&
                   (a.max_rows <= 1 || (p.rs * sz) % 16 == 0) &&
                   (a.layers <= 1 || (p.ls * sz) % 16 == 0);
  // Blocks per SM (< 0: one block per 256 items, no grid-stride loop).
  const int bps = cfg.blocks_per_sm != 0 ? cfg.blocks_per_sm
                  : sz == 8                ? kDefaultBlocksPerSmI64
                                           : kDefaultBlocksPerSmI32;
  // The kernels grid-stride, so the grid is always capped to what dim3.x
  // holds (uncapped, `unsigned(g)` could truncate, even to 0).
  auto grid_for = [&](int64_t items) {
    const int64_t g = GridFor(items, kThreads);
    return std::min<int64_t>(bps > 0 ? std::min<int64_t>(g, int64_t(NumSms()) * bps) : g,
                             int64_t{0x7fffffff});
  };
  if (!vec) {
    StaticUnpackRunKernel<TIn, TOut><<<dim3(unsigned(grid_for(units))), kThreads, 0, st>>>(p);
    return CheckLaunch("StaticUnpackRunKernel");
  }
  const int64_t chunks = units * (a.k / V);
  StaticUnpackVecKernel<TIn, TOut><<<dim3(unsigned(grid_for(chunks))), kThreads, 0, st>>>(p);
  return CheckLaunch("StaticUnpackVecKernel");
}

}  // namespace

namespace internal {

KernelStatus StaticUnpackWithConfig(const StaticUnpackArgs& a, const StaticUnpackConfig& c,
                                    void* stream) {
  if (auto s = ValidateStaticUnpack(a); !s.ok()) return s;
  if (a.max_rows == 0 || a.layers == 0) return KernelStatus::Ok();
  auto st = static_cast<cudaStream_t>(stream);
  return DispatchUnpackTypes(a.in_type, a.out_type, [&](auto in, auto out) {
    return Launch<decltype(in), decltype(out)>(a, c, st);
  });
}

}  // namespace internal

KernelStatus StaticUnpack(const StaticUnpackArgs& a, void* stream) {
  return internal::StaticUnpackWithConfig(a, internal::StaticUnpackConfig{}, stream);
}

KernelStatus StoreRows(int64_t* rows_ptr, int64_t rows, void* stream) {
  if (rows_ptr == nullptr) return KernelStatus::InvalidArgument("null rows_ptr");
  if (rows < 0) {
    return KernelStatus::InvalidArgument("rows must be >= 0, got " + std::to_string(rows));
  }
  StoreRowsKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(rows_ptr, rows);
  return CheckLaunch("StoreRowsKernel");
}

}  // namespace rollpack::kernels::cuda
