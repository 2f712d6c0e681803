// CUDA implementation of the routing-replay kernels (semantics in
// replay_kernels.h, API in replay_kernels_cuda.h). Standard library + CUDA
// runtime only.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstdint>
#include <string>

#include "kernels/replay_kernels_cuda.h"

namespace rollpack::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

KernelStatus CheckLaunch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return KernelStatus::Internal(std::string(what) + ": " + cudaGetErrorString(e));
  return KernelStatus::Ok();
}

KernelStatus CheckCall(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    return KernelStatus::Internal(std::string(what) + ": " + cudaGetErrorString(e));
  return KernelStatus::Ok();
}

int64_t GridFor(int64_t work_items, int64_t per_block) {
  int64_t g = (work_items + per_block - 1) / per_block;
  return g < 1 ? 1 : (g > (1LL << 30) ? (1LL << 30) : g);
}

// ------------------------------------------------------------------ unpack

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

// One thread per V consecutive outputs of one layer, gathered from global.
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads)
    UnpackDirectKernel(const TIn* __restrict__ in, const uint8_t* __restrict__ mask,
                       int64_t rows, int layers, int k, TOut* __restrict__ out,
                       int64_t ls, bool fill, bool vec_out) {
  constexpr int V = 16 / sizeof(TOut);
  const int64_t seg = rows * k;
  const int64_t nchunks = (seg + V - 1) / V;
  const int64_t total = int64_t(layers) * nchunks;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < total;
       c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t l = c / nchunks;
    const int64_t j0 = (c - l * nchunks) * V;
    alignas(16) TOut vals[V];
#pragma unroll
    for (int t = 0; t < V; ++t) {
      const int64_t j = j0 + t;
      TOut v = 0;
      if (j < seg) {
        const int64_t r = j / k;
        const int64_t kk = j - r * k;
        v = TOut(__ldg(in + (r * layers + l) * k + kk));
        if (fill && mask[r] == 0) v = TOut(-1);
      }
      vals[t] = v;
    }
    TOut* dst = out + l * ls + j0;
    if (vec_out && j0 + V <= seg) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(vals);
    } else {
#pragma unroll
      for (int t = 0; t < V; ++t)
        if (j0 + t < seg) dst[t] = vals[t];
    }
  }
}

int MaxDynamicSmem() {
  static int v = [] {
    int dev = 0, val = 48 * 1024;
    if (cudaGetDevice(&dev) == cudaSuccess)
      cudaDeviceGetAttribute(&val, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return val;
  }();
  return v;
}

int NumSms() {
  static int v = [] {
    int dev = 0, val = 132;
    if (cudaGetDevice(&dev) == cudaSuccess)
      cudaDeviceGetAttribute(&val, cudaDevAttrMultiProcessorCount, dev);
    return val;
  }();
  return v;
}

template <typename TIn, typename TOut>
KernelStatus LaunchUnpack(const UnpackArgs& a, UnpackVariant variant, cudaStream_t st) {
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
  const bool flat = variant == UnpackVariant::kTiledFlat;
  const int64_t tile_row_bytes = flat ? row_bytes : pitch_bytes;
  // Rows per tile: a multiple of 16 (keeps every tile's input start and output
  // runs 16-byte aligned), about 8 KB of shared memory.
  int64_t tr = (8192 / tile_row_bytes) / 16 * 16;
  if (tr < 16) tr = 16;
  if (tr > 512) tr = 512;
  const int64_t smem = tr * tile_row_bytes;
  if (variant == UnpackVariant::kAuto)
    variant = smem <= MaxDynamicSmem() ? UnpackVariant::kTiled : UnpackVariant::kDirect;
  if (variant == UnpackVariant::kTiled || variant == UnpackVariant::kTiledFlat) {
    if (smem > MaxDynamicSmem())
      return KernelStatus::InvalidArgument("tiled unpack: layers * K too large for shared memory");
    const int64_t grid = (a.rows + tr - 1) / tr;
    if (grid > (1LL << 31) - 1) return KernelStatus::InvalidArgument("too many rows");
    // In-tile offsets are int: tr * pitch <= shared memory size.
    auto flat_kern = UnpackTiledFlatKernel<TIn, TOut>;
    auto kern = UnpackTiledKernel<TIn, TOut>;
    if (smem > 48 * 1024) {
      cudaError_t e = flat ? cudaFuncSetAttribute(flat_kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem))
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
  constexpr int64_t V = 16 / sizeof(TOut);
  const int64_t chunks = a.layers * ((a.rows * a.k + V - 1) / V);
  const int64_t grid = std::min<int64_t>(GridFor(chunks, kThreads), int64_t(NumSms()) * 16);
  UnpackDirectKernel<TIn, TOut><<<dim3(unsigned(grid)), kThreads, 0, st>>>(
      in, a.mask, a.rows, int(a.layers), a.k, out, ls, fill, out_aligned);
  return CheckLaunch("UnpackDirectKernel");
}

// ------------------------------------------------------------ shared device

__device__ __forceinline__ int64_t LoadIdx(const void* p, int type, int64_t off) {
  switch (type) {
    case int(IndexType::kU8):
      return __ldg(static_cast<const uint8_t*>(p) + off);
    case int(IndexType::kU16):
      return __ldg(static_cast<const uint16_t*>(p) + off);
    case int(IndexType::kI32):
      return __ldg(static_cast<const int32_t*>(p) + off);
    default:
      return __ldg(static_cast<const long long*>(p) + off);
  }
}

template <bool BF16>
__device__ __forceinline__ float LoadLogit(const void* p, int64_t off) {
  if constexpr (BF16) {
    const unsigned short b = __ldg(static_cast<const unsigned short*>(p) + off);
    return __uint_as_float(uint32_t(b) << 16);
  } else {
    return __ldg(static_cast<const float*>(p) + off);
  }
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

struct ApplyParams {
  const void* logits;
  const void* ids;
  int ids_type;
  int64_t ids_row_stride;
  int64_t rows;
  int e;
  int k;
  bool softmax;
  bool renorm;
  float scale;
  float eps;
};

// Loads one row (lane holds e = lane + 32 j) and returns max and sum of
// exp(x - max) (softmax only).
template <bool BF16, int NPL>
__device__ __forceinline__ void LoadRow(const ApplyParams& p, int64_t row, int lane,
                                        float (&x)[NPL], float& mx, float& sum) {
#pragma unroll
  for (int j = 0; j < NPL; ++j) {
    const int e = lane + 32 * j;
    x[j] = e < p.e ? LoadLogit<BF16>(p.logits, row * p.e + e) : -INFINITY;
  }
  mx = 0.f;
  sum = 0.f;
  if (p.softmax) {
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < NPL; ++j) m = fmaxf(m, x[j]);
    mx = WarpMax(m);
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < NPL; ++j)
      if (lane + 32 * j < p.e) s += expf(x[j] - mx);
    sum = WarpSum(s);
  }
}

__device__ __forceinline__ float Score(const ApplyParams& p, float x, float mx, float sum) {
  return p.softmax ? expf(x - mx) / sum : 1.0f / (1.0f + expf(-x));
}

template <bool BF16, int NPL>
__global__ void __launch_bounds__(kThreads)
    ApplyForwardKernel(ApplyParams p, float* __restrict__ probs, uint8_t* __restrict__ map,
                       float* __restrict__ dense) {
  const int lane = threadIdx.x & 31;
  const int64_t warp0 = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t nwarps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = warp0; row < p.rows; row += nwarps) {
    float x[NPL], mx, sum;
    LoadRow<BF16, NPL>(p, row, lane, x, mx, sum);
    int64_t id = 0;
    bool valid = true;
    float pk = 0.f;
    if (lane < p.k) {
      id = LoadIdx(p.ids, p.ids_type, row * p.ids_row_stride + lane);
      valid = id >= 0 && id < p.e;
      if (valid) pk = Score(p, LoadLogit<BF16>(p.logits, row * p.e + id), mx, sum);
    }
    const bool bad = __any_sync(kFull, !valid);
    const float S = WarpSum(pk);
    float q = p.renorm ? pk / (S + p.eps) : pk;
    q *= p.scale;
    if (bad) q = NAN;
    if (lane < p.k) probs[row * p.k + lane] = q;
    if (map != nullptr) {
      uint8_t* mrow = map + row * p.e;
      if ((p.e & 15) == 0 && (reinterpret_cast<uintptr_t>(map) & 15) == 0) {
        for (int i = lane; i < p.e / 16; i += 32) reinterpret_cast<uint4*>(mrow)[i] = make_uint4(0, 0, 0, 0);
      } else {
        for (int i = lane; i < p.e; i += 32) mrow[i] = 0;
      }
    }
    if (dense != nullptr) {
      float* drow = dense + row * p.e;
      const float z = bad ? NAN : 0.f;
      if ((p.e & 3) == 0 && (reinterpret_cast<uintptr_t>(dense) & 15) == 0) {
        for (int i = lane; i < p.e / 4; i += 32) reinterpret_cast<float4*>(drow)[i] = make_float4(z, z, z, z);
      } else {
        for (int i = lane; i < p.e; i += 32) drow[i] = z;
      }
    }
    __syncwarp();
    if (lane < p.k && valid && !bad) {
      if (map != nullptr) map[row * p.e + id] = 1;
      if (dense != nullptr) dense[row * p.e + id] = q;
    }
    __syncwarp();
  }
}

template <bool BF16>
__device__ __forceinline__ void StoreGrad(void* g, int64_t off, float v) {
  if constexpr (BF16) {
    static_cast<__nv_bfloat16*>(g)[off] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(g)[off] = v;
  }
}

template <bool BF16, int NPL>
__global__ void __launch_bounds__(kThreads)
    ApplyBackwardKernel(ApplyParams p, const float* __restrict__ gprobs, void* __restrict__ gx) {
  const int lane = threadIdx.x & 31;
  const int64_t warp0 = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t nwarps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = warp0; row < p.rows; row += nwarps) {
    float x[NPL], mx, sum;
    LoadRow<BF16, NPL>(p, row, lane, x, mx, sum);
    int64_t id = -1;
    bool valid = true;
    float pk = 0.f, g = 0.f, one_minus = 0.f;
    if (lane < p.k) {
      id = LoadIdx(p.ids, p.ids_type, row * p.ids_row_stride + lane);
      valid = id >= 0 && id < p.e;
      if (valid) {
        const float xi = LoadLogit<BF16>(p.logits, row * p.e + id);
        pk = Score(p, xi, mx, sum);
        // 1 - sigmoid(x) = sigmoid(-x), without the cancellation of 1 - pk.
        if (!p.softmax) one_minus = 1.0f / (1.0f + expf(xi));
      }
      g = gprobs[row * p.k + lane];
    }
    const bool bad = __any_sync(kFull, !valid);
    float dp;
    if (p.renorm) {
      // q = p / denom exactly as in the forward; with K = 1, q == 1 and the
      // gradient is exactly 0.
      const float denom = WarpSum(pk) + p.eps;
      const float gq = WarpSum(g * (pk / denom));
      dp = p.scale * (g - gq) / denom;
    } else {
      dp = p.scale * g;
    }
    if (lane >= p.k) dp = 0.f;
    // Sum of dp over the lanes holding the same id (repeated ids).
    float dpt = 0.f;
    for (int k2 = 0; k2 < p.k; ++k2) {
      const long long id2 = __shfl_sync(kFull, (long long)id, k2);
      const float dp2 = __shfl_sync(kFull, dp, k2);
      if (id2 == id) dpt += dp2;
    }
    if (p.softmax) {
      const float c = WarpSum(dp * pk);
#pragma unroll
      for (int j = 0; j < NPL; ++j) {
        const int e = lane + 32 * j;
        if (e < p.e) StoreGrad<BF16>(gx, row * p.e + e, bad ? NAN : -(expf(x[j] - mx) / sum) * c);
      }
      __syncwarp();
      if (lane < p.k && valid && !bad) StoreGrad<BF16>(gx, row * p.e + id, pk * (dpt - c));
    } else {
#pragma unroll
      for (int j = 0; j < NPL; ++j) {
        const int e = lane + 32 * j;
        if (e < p.e) StoreGrad<BF16>(gx, row * p.e + e, bad ? NAN : 0.f);
      }
      __syncwarp();
      if (lane < p.k && valid && !bad) StoreGrad<BF16>(gx, row * p.e + id, dpt * pk * one_minus);
    }
    __syncwarp();
  }
}

ApplyParams MakeParams(const ApplyArgs& a) {
  ApplyParams p;
  p.logits = a.logits;
  p.ids = a.ids.data;
  p.ids_type = int(a.ids.type);
  p.ids_row_stride = a.ids.row_stride;
  p.rows = a.rows;
  p.e = a.experts;
  p.k = a.k;
  p.softmax = a.score == ScoreFunction::kSoftmax;
  p.renorm = a.renormalize;
  p.scale = a.scale;
  p.eps = a.score == ScoreFunction::kSigmoid ? 1e-20f : 0.f;
  return p;
}

// Calls f(std::integral_constant<int, NPL>) with NPL = ceil(E / 32) rounded up
// to a power of two.
template <typename F>
KernelStatus DispatchNpl(int e, F&& f) {
  if (e <= 32) return f(std::integral_constant<int, 1>());
  if (e <= 64) return f(std::integral_constant<int, 2>());
  if (e <= 128) return f(std::integral_constant<int, 4>());
  if (e <= 256) return f(std::integral_constant<int, 8>());
  if (e <= 512) return f(std::integral_constant<int, 16>());
  return f(std::integral_constant<int, 32>());
}

int64_t RowGrid(int64_t rows) {
  return std::min<int64_t>(GridFor(rows, kWarpsPerBlock), int64_t(NumSms()) * 64);
}

// ---------------------------------------------------------------- agreement

struct AgreeParams {
  const void* logits;  // null for the ids variant
  int64_t logits_layer_stride;
  const void* live;
  int live_type;
  int64_t live_row_stride, live_layer_stride;
  const void* rep;
  int rep_type;
  int64_t rep_row_stride, rep_layer_stride;
  const uint8_t* mask;
  int64_t rows;
  int e;
  int k;
};

// Lanes < K hold live id `lv` and replay id `rv`; returns (differ, overlap)
// for the row, valid in every lane.
__device__ __forceinline__ void CompareRow(int lane, int k, long long lv, long long rv,
                                           bool* differ, int* overlap) {
  bool r_in_l = false, l_in_r = false, r_first = true;
  for (int k2 = 0; k2 < k; ++k2) {
    const long long l2 = __shfl_sync(kFull, lv, k2);
    const long long r2 = __shfl_sync(kFull, rv, k2);
    r_in_l |= (l2 == rv);
    l_in_r |= (r2 == lv);
    if (k2 < lane && r2 == rv) r_first = false;
  }
  const bool active = lane < k;
  const unsigned ok = __ballot_sync(kFull, !active || (r_in_l && l_in_r));
  const unsigned ov = __ballot_sync(kFull, active && r_first && r_in_l);
  *differ = ok != kFull;
  *overlap = __popc(ov);
}

// Block = one layer (blockIdx.y) x a stride of rows; one warp per row.
template <bool FROM_LOGITS, bool BF16, int NPL>
__global__ void __launch_bounds__(kThreads)
    AgreementKernel(AgreeParams p, unsigned long long* __restrict__ stats) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t l = blockIdx.y;
  long long counted = 0, differ = 0, overlap = 0;
  for (int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + warp; row < p.rows;
       row += int64_t(gridDim.x) * kWarpsPerBlock) {
    if (p.mask != nullptr && p.mask[row] == 0) continue;
    long long lv = -1, rv = -2;
    if (lane < p.k)
      rv = LoadIdx(p.rep, p.rep_type, l * p.rep_layer_stride + row * p.rep_row_stride + lane);
    if constexpr (FROM_LOGITS) {
      float x[NPL];
      const int64_t base = l * p.logits_layer_stride + row * p.e;
#pragma unroll
      for (int j = 0; j < NPL; ++j) {
        const int e = lane + 32 * j;
        x[j] = e < p.e ? LoadLogit<BF16>(p.logits, base + e) : 0.f;
      }
      unsigned taken = 0;  // bit j: element lane + 32 j already selected
      for (int round = 0; round < p.k; ++round) {
        float bv = -INFINITY;
        int bid = 0x7fffffff;
        int bj = -1;
#pragma unroll
        for (int j = 0; j < NPL; ++j) {
          const int e = lane + 32 * j;
          if (e < p.e && !(taken & (1u << j)) && (x[j] > bv || (x[j] == bv && e < bid))) {
            bv = x[j];
            bid = e;
            bj = j;
          }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          const float ov = __shfl_xor_sync(kFull, bv, o);
          const int oid = __shfl_xor_sync(kFull, bid, o);
          if (ov > bv || (ov == bv && oid < bid)) {
            bv = ov;
            bid = oid;
          }
        }
        // bid is now the round's winner in every lane.
        if (bj >= 0 && lane + 32 * bj == bid) taken |= 1u << bj;
        if (lane == round) lv = bid;
      }
    } else {
      if (lane < p.k)
        lv = LoadIdx(p.live, p.live_type, l * p.live_layer_stride + row * p.live_row_stride + lane);
    }
    bool d;
    int ov;
    CompareRow(lane, p.k, lv, rv, &d, &ov);
    counted += 1;
    differ += d;
    overlap += ov;
  }
  __shared__ long long red[3][kWarpsPerBlock];
  if (lane == 0) {
    red[0][warp] = counted;
    red[1][warp] = differ;
    red[2][warp] = overlap;
  }
  __syncthreads();
  if (threadIdx.x < 3) {
    long long s = 0;
    for (int w = 0; w < kWarpsPerBlock; ++w) s += red[threadIdx.x][w];
    if (s != 0) atomicAdd(stats + l * 3 + threadIdx.x, (unsigned long long)s);
  }
}

KernelStatus LaunchAgreement(const AgreeParams& p, bool from_logits, bool bf16,
                             int64_t layers, AgreementStats* stats, cudaStream_t st) {
  static_assert(sizeof(AgreementStats) == 3 * sizeof(unsigned long long), "layout");
  if (layers == 0) return KernelStatus::Ok();
  if (stats == nullptr) return KernelStatus::InvalidArgument("null stats");
  if (layers > 65535) return KernelStatus::InvalidArgument("layers > 65535");
  if (auto s = CheckCall(cudaMemsetAsync(stats, 0, size_t(layers) * sizeof(AgreementStats), st),
                         "cudaMemsetAsync");
      !s.ok())
    return s;
  if (p.rows == 0) return KernelStatus::Ok();
  auto* out = reinterpret_cast<unsigned long long*>(stats);
  const int64_t gx = std::max<int64_t>(
      1, std::min<int64_t>(GridFor(p.rows, kWarpsPerBlock), (int64_t(NumSms()) * 32 + layers - 1) / layers));
  const dim3 grid{unsigned(gx), unsigned(layers), 1u};
  if (!from_logits) {
    AgreementKernel<false, false, 1><<<grid, kThreads, 0, st>>>(p, out);
    return CheckLaunch("AgreementKernel(ids)");
  }
  return DispatchNpl(p.e, [&](auto npl) {
    constexpr int N = decltype(npl)::value;
    if (bf16)
      AgreementKernel<true, true, N><<<grid, kThreads, 0, st>>>(p, out);
    else
      AgreementKernel<true, false, N><<<grid, kThreads, 0, st>>>(p, out);
    return CheckLaunch("AgreementKernel(logits)");
  });
}

}  // namespace

KernelStatus UnpackWithVariant(const UnpackArgs& a, UnpackVariant v, void* stream) {
  if (auto s = ValidateUnpack(a); !s.ok()) return s;
  if (a.rows == 0 || a.layers == 0) return KernelStatus::Ok();
  if (a.layers > (1LL << 24)) return KernelStatus::InvalidArgument("layers too large");
  auto st = static_cast<cudaStream_t>(stream);
  const bool u8 = a.in_type == IndexType::kU8;
  const bool i64 = a.out_type == OutIndexType::kI64;
  if (u8 && i64) return LaunchUnpack<uint8_t, long long>(a, v, st);
  if (u8) return LaunchUnpack<uint8_t, int32_t>(a, v, st);
  if (i64) return LaunchUnpack<uint16_t, long long>(a, v, st);
  return LaunchUnpack<uint16_t, int32_t>(a, v, st);
}

KernelStatus Unpack(const UnpackArgs& a, void* stream) {
  return UnpackWithVariant(a, UnpackVariant::kAuto, stream);
}

KernelStatus ApplyForward(const ApplyArgs& a, const ApplyForwardOut& out, void* stream) {
  if (auto s = ValidateApply(a); !s.ok()) return s;
  if (a.rows > 0 && out.probs == nullptr)
    return KernelStatus::InvalidArgument("null probs output");
  if (a.rows == 0) return KernelStatus::Ok();
  auto st = static_cast<cudaStream_t>(stream);
  const ApplyParams p = MakeParams(a);
  const dim3 grid(unsigned(RowGrid(a.rows)));
  return DispatchNpl(a.experts, [&](auto npl) {
    constexpr int N = decltype(npl)::value;
    if (a.logits_type == FloatType::kBF16)
      ApplyForwardKernel<true, N><<<grid, kThreads, 0, st>>>(p, out.probs, out.routing_map,
                                                            out.probs_dense);
    else
      ApplyForwardKernel<false, N><<<grid, kThreads, 0, st>>>(p, out.probs, out.routing_map,
                                                             out.probs_dense);
    return CheckLaunch("ApplyForwardKernel");
  });
}

KernelStatus ApplyBackward(const ApplyArgs& a, const float* grad_probs, void* grad_logits,
                           void* stream) {
  if (auto s = ValidateApply(a); !s.ok()) return s;
  if (a.rows > 0 && (grad_probs == nullptr || grad_logits == nullptr))
    return KernelStatus::InvalidArgument("null grad_probs or grad_logits");
  if (a.rows == 0) return KernelStatus::Ok();
  auto st = static_cast<cudaStream_t>(stream);
  const ApplyParams p = MakeParams(a);
  const dim3 grid(unsigned(RowGrid(a.rows)));
  return DispatchNpl(a.experts, [&](auto npl) {
    constexpr int N = decltype(npl)::value;
    if (a.logits_type == FloatType::kBF16)
      ApplyBackwardKernel<true, N><<<grid, kThreads, 0, st>>>(p, grad_probs, grad_logits);
    else
      ApplyBackwardKernel<false, N><<<grid, kThreads, 0, st>>>(p, grad_probs, grad_logits);
    return CheckLaunch("ApplyBackwardKernel");
  });
}

KernelStatus AgreementFromLogits(const AgreementLogitsArgs& a, AgreementStats* stats,
                                 void* stream) {
  if (auto s = ValidateAgreementLogits(a); !s.ok()) return s;
  AgreeParams p{};
  p.logits = a.logits;
  p.logits_layer_stride = a.logits_layer_stride == -1 ? a.rows * a.experts : a.logits_layer_stride;
  p.rep = a.replay.data;
  p.rep_type = int(a.replay.type);
  p.rep_row_stride = a.replay.row_stride;
  p.rep_layer_stride = a.replay.layer_stride;
  p.mask = a.mask;
  p.rows = a.rows;
  p.e = a.experts;
  p.k = a.k;
  return LaunchAgreement(p, true, a.logits_type == FloatType::kBF16, a.layers, stats,
                         static_cast<cudaStream_t>(stream));
}

KernelStatus AgreementFromIds(const AgreementIdsArgs& a, AgreementStats* stats, void* stream) {
  if (auto s = ValidateAgreementIds(a); !s.ok()) return s;
  AgreeParams p{};
  p.live = a.live.data;
  p.live_type = int(a.live.type);
  p.live_row_stride = a.live.row_stride;
  p.live_layer_stride = a.live.layer_stride;
  p.rep = a.replay.data;
  p.rep_type = int(a.replay.type);
  p.rep_row_stride = a.replay.row_stride;
  p.rep_layer_stride = a.replay.layer_stride;
  p.mask = a.mask;
  p.rows = a.rows;
  p.e = 0;
  p.k = a.k;
  return LaunchAgreement(p, false, false, a.layers, stats, static_cast<cudaStream_t>(stream));
}

}  // namespace rollpack::kernels::cuda
