// The unpack variants that only the benchmark compares (and
// replay_kernels_gpu_test checks): kTiled, the default before kPipelined, and
// kTiledFlat, the first tiled version, with UnpackWithVariant to pick any
// variant by number (unpack_cuda.h). They live here rather than in
// rollpack_kernels_cuda because Unpack can never run them: a row too large for
// kPipelined's smallest tile (3 stages of 1-4 rows) is also too large for
// kTiled's 16.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/device_helpers.cuh"
#include "kernels/unpack.h"
#include "kernels/bench/unpack_variants.h"
#include "kernels/unpack_cuda.h"

namespace rollpack::kernels::cuda {
namespace {

using internal::CheckCall;
using internal::CheckLaunch;
using internal::DispatchUnpackTypes;
using internal::kThreads;
using internal::MaxDynamicSmem;

// kTiledFlat (first version, kept for the benchmark): one block = TR
// consecutive rows (a contiguous chunk of the input), copied to shared memory
// with 16-byte loads, then written layer by layer: for layer l the block's
// output is the contiguous run out[l][r0 .. r0+TR)[0 .. K). Costs two integer
// divisions per output element and bank conflicts between rows.
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads)
    UnpackTiledFlatKernel(const TIn* __restrict__ in, const uint8_t* __restrict__ mask,
                      int64_t rows, int layers, int k, TOut* __restrict__ out,
                      int64_t ls, bool fill, int tr, bool vec_out) {
  extern __shared__ __align__(16) unsigned char smem[];
  TIn* s = reinterpret_cast<TIn*>(smem);
  const int64_t r0 = int64_t(blockIdx.x) * tr;
  if (r0 >= rows) return;
  const int nr = int(rows - r0 < tr ? rows - r0 : tr);
  const int64_t row_elems = int64_t(layers) * k;
  const int64_t n_in = nr * row_elems;
  const TIn* src = in + r0 * row_elems;

  // Phase 1: contiguous chunk -> shared memory.
  int64_t done = 0;
  if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    const int64_t nvec = n_in * int64_t(sizeof(TIn)) / 16;
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(smem);
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) d4[i] = __ldg(s4 + i);
    done = nvec * 16 / int64_t(sizeof(TIn));
  }
  for (int64_t i = done + threadIdx.x; i < n_in; i += blockDim.x) s[i] = src[i];
  __syncthreads();

  // Phase 2: per layer, a contiguous run of nr*K outputs.
  constexpr int V = 16 / sizeof(TOut);
  const int seg = nr * k;
  const int nchunks = (seg + V - 1) / V;
  const int total = layers * nchunks;
  for (int c = threadIdx.x; c < total; c += blockDim.x) {
    const int l = c / nchunks;
    const int j0 = (c - l * nchunks) * V;
    alignas(16) TOut vals[V];
#pragma unroll
    for (int t = 0; t < V; ++t) {
      const int j = j0 + t;
      TOut v = 0;
      if (j < seg) {
        const int rl = j / k;
        const int kk = j - rl * k;
        v = TOut(s[(int64_t(rl) * layers + l) * k + kk]);
        if (fill && mask[r0 + rl] == 0) v = TOut(-1);
      }
      vals[t] = v;
    }
    TOut* dst = out + int64_t(l) * ls + r0 * k + j0;
    if (vec_out && j0 + V <= seg) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(vals);
    } else {
#pragma unroll
      for (int t = 0; t < V; ++t)
        if (j0 + t < seg) dst[t] = vals[t];
    }
  }
}

// kTiled: like kTiledFlat, but shared-memory rows are padded to an odd number
// of 16-byte units (no bank conflicts between rows), and each thread owns one
// 16-byte output chunk position of the block's run and loops over a subset of
// the layers: the chunk's shared-memory offsets and mask flags are computed
// once, and each layer then costs V shared loads and one 16-byte store.
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads)
    UnpackTiledKernel(const TIn* __restrict__ in, const uint8_t* __restrict__ mask,
                      int64_t rows, int layers, int k, TOut* __restrict__ out,
                      int64_t ls, bool fill, int tr, int pitch, bool vec_in, bool vec_out) {
  extern __shared__ __align__(16) unsigned char smem[];
  TIn* s = reinterpret_cast<TIn*>(smem);
  const int64_t r0 = int64_t(blockIdx.x) * tr;
  if (r0 >= rows) return;
  const int nr = int(rows - r0 < tr ? rows - r0 : tr);
  const int row_elems = layers * k;
  const TIn* src = in + r0 * row_elems;

  // Phase 1: rows r0 .. r0+nr -> shared memory, row pitch `pitch` elements.
  if (vec_in && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    const int vpr = row_elems * int(sizeof(TIn)) / 16;  // 16-byte units per row
    const int nvec = nr * vpr;
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
      const int r = i / vpr;
      const int w = i - r * vpr;
      reinterpret_cast<uint4*>(s + r * pitch)[w] = __ldg(s4 + i);
    }
  } else {
    const int n_in = nr * row_elems;
    for (int i = threadIdx.x; i < n_in; i += blockDim.x) {
      const int r = i / row_elems;
      s[r * pitch + (i - r * row_elems)] = src[i];
    }
  }
  __syncthreads();

  // Phase 2.
  constexpr int V = 16 / sizeof(TOut);
  const int seg = nr * k;
  const int nchunks = (seg + V - 1) / V;
  const int groups = nchunks >= int(blockDim.x) ? 1 : int(blockDim.x) / nchunks;
  const int work = nchunks * groups;
  for (int c = threadIdx.x; c < work; c += blockDim.x) {
    const int g = c / nchunks;
    const int j0 = (c - g * nchunks) * V;
    int off[V];
    bool neg[V];
#pragma unroll
    for (int t = 0; t < V; ++t) {
      const int j = j0 + t < seg ? j0 + t : seg - 1;
      const int rl = j / k;
      off[t] = rl * pitch + (j - rl * k) + g * k;
      neg[t] = fill && mask[r0 + rl] == 0;
    }
    const bool full = vec_out && j0 + V <= seg;
    TOut* dst = out + int64_t(g) * ls + r0 * k + j0;
    const int64_t dstep = int64_t(groups) * ls;
    const int sstep = groups * k;
#pragma unroll 4
    for (int l = g; l < layers; l += groups) {
      alignas(16) TOut vals[V];
#pragma unroll
      for (int t = 0; t < V; ++t) vals[t] = neg[t] ? TOut(-1) : TOut(s[off[t]]);
      if (full) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(vals);
      } else {
#pragma unroll
        for (int t = 0; t < V; ++t)
          if (j0 + t < seg) dst[t] = vals[t];
      }
#pragma unroll
      for (int t = 0; t < V; ++t) off[t] += sstep;
      dst += dstep;
    }
  }
}

// Shared-memory tiles of >= 16 rows (about 8 KB), loaded, then stored.
template <typename TIn, typename TOut>
KernelStatus LaunchTiled(const UnpackArgs& a, bool flat, cudaStream_t st) {
  const int64_t ls = a.out_layer_stride == -1 ? a.rows * a.k : a.out_layer_stride;
  const bool fill = a.masked_fill_minus_one && a.mask != nullptr;
  const TIn* in = static_cast<const TIn*>(a.experts);
  TOut* out = static_cast<TOut*>(a.out);
  const bool out_aligned = (reinterpret_cast<uintptr_t>(out) & 15) == 0 &&
                           (ls * int64_t(sizeof(TOut))) % 16 == 0;
  const int64_t row_bytes = a.layers * a.k * int64_t(sizeof(TIn));
  // Padded shared-memory row: an odd number of 16-byte units when rows are
  // whole units (16-byte loads), else an odd number of 4-byte words.
  const bool vec_in = row_bytes % 16 == 0;
  int64_t pitch_bytes;
  if (vec_in) {
    pitch_bytes = row_bytes + ((row_bytes / 16) % 2 == 0 ? 16 : 0);
  } else {
    pitch_bytes = (row_bytes + 3) / 4 * 4;
    if ((pitch_bytes / 4) % 2 == 0) pitch_bytes += 4;
  }
  const int64_t tile_row_bytes = flat ? row_bytes : pitch_bytes;
  // Rows per tile: a multiple of 16 (keeps every tile's input start and output
  // runs 16-byte aligned), about 8 KB of shared memory.
  int64_t tr = (8192 / tile_row_bytes) / 16 * 16;
  if (tr < 16) tr = 16;
  if (tr > 512) tr = 512;
  const int64_t smem = tr * tile_row_bytes;
  if (smem > MaxDynamicSmem())
    return KernelStatus::InvalidArgument("tiled unpack: layers * K too large for shared memory");
  const int64_t grid = (a.rows + tr - 1) / tr;
  if (grid > (1LL << 31) - 1) return KernelStatus::InvalidArgument("too many rows");
  // In-tile offsets are int: tr * pitch <= shared memory size.
  auto flat_kern = UnpackTiledFlatKernel<TIn, TOut>;
  auto kern = UnpackTiledKernel<TIn, TOut>;
  if (smem > 48 * 1024) {
    cudaError_t e =
        flat ? cudaFuncSetAttribute(flat_kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(smem))
             : cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (auto s = CheckCall(e, "cudaFuncSetAttribute"); !s.ok()) return s;
  }
  if (flat) {
    flat_kern<<<dim3(unsigned(grid)), kThreads, size_t(smem), st>>>(
        in, a.mask, a.rows, int(a.layers), a.k, out, ls, fill, int(tr), out_aligned);
    return CheckLaunch("UnpackTiledFlatKernel");
  }
  kern<<<dim3(unsigned(grid)), kThreads, size_t(smem), st>>>(
      in, a.mask, a.rows, int(a.layers), a.k, out, ls, fill, int(tr),
      int(pitch_bytes / int64_t(sizeof(TIn))), vec_in, out_aligned);
  return CheckLaunch("UnpackTiledKernel");
}

}  // namespace

KernelStatus UnpackWithVariant(const UnpackArgs& a, UnpackVariant v, void* stream) {
  switch (v) {
    case UnpackVariant::kAuto:
      return Unpack(a, stream);
    case UnpackVariant::kPipelined:
      return UnpackPipelined(a, UnpackConfig{}, stream);
    case UnpackVariant::kTiled:
    case UnpackVariant::kTiledFlat:
      break;
    default:
      return internal::UnpackDirect(a, stream);
  }
  bool launch = false;
  if (auto s = internal::CheckUnpack(a, &launch); !launch) return s;
  const bool flat = v == UnpackVariant::kTiledFlat;
  return DispatchUnpackTypes(a.in_type, a.out_type, [&](auto in, auto out) {
    return LaunchTiled<decltype(in), decltype(out)>(a, flat, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace rollpack::kernels::cuda
