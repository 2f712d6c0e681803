// CUDA masked log-probabilities (masked_logprob_cuda.h): one warp per row.
// A masked row gathers only its kept ids' logits (tens to a thousand of the
// V), accumulating an online log-sum-exp so that each logit is read once; an
// empty list (no mask) streams the whole row in 16-byte loads. The backward
// is two launches: the zeros of the masked rows' dense gradient written like
// a memset, then per row the kept ids' values scattered over them (or, for
// an unmasked row, the whole row computed).
#include "kernels/masked_logprob_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/device_helpers.cuh"

namespace rollpack::kernels::cuda {
namespace {

using internal::CheckLaunch;
using internal::GridFor;
using internal::kFull;
using internal::kThreads;
using internal::kWarpsPerBlock;
using internal::LoadIdx;
using internal::LoadLogit;
using internal::NumSms;

struct Params {
  const void* logits;
  int64_t rows;
  int64_t vocab;
  const void* values;
  int values_type;
  int64_t num_values;
  const void* offsets;
  int offsets_type;
  const void* targets;
  int targets_type;
  bool vec_in;   // logits rows start 16-byte aligned and V fills whole vectors
  bool vec_out;  // the same for grad_logits
};

// Running log-sum-exp: m the largest value seen, s = sum exp(x - m). s is a
// double: an unmasked row adds ~V / 32 chunk sums per lane, and a float sum of
// that many terms would lose ~10 ulp of the result (one FP64 add per chunk
// costs nothing next to the loads).
struct Lse {
  float m = -INFINITY;
  double s = 0.0;
};

// Adds a chunk of N values with one rescale of the running sum.
template <int N>
__device__ __forceinline__ void AddChunk(Lse& a, const float (&x)[N]) {
  float cm = x[0];
#pragma unroll
  for (int i = 1; i < N; ++i) cm = fmaxf(cm, x[i]);
  if (cm == -INFINITY) return;  // nothing to add; keeps -inf - -inf out
  if (cm > a.m) {
    a.s *= double(expf(a.m - cm));
    a.m = cm;
  }
  float c = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) c += expf(x[i] - a.m);
  a.s += double(c);
}

__device__ __forceinline__ Lse Merge(Lse a, Lse b) {
  const float mn = fmaxf(a.m, b.m);
  if (mn == -INFINITY) return a;
  Lse r;
  r.m = mn;
  r.s = a.s * double(expf(a.m - mn)) + b.s * double(expf(b.m - mn));
  return r;
}

__device__ __forceinline__ float WarpLse(Lse a) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Lse b;
    b.m = __shfl_xor_sync(kFull, a.m, o);
    b.s = __shfl_xor_sync(kFull, a.s, o);
    a = Merge(a, b);
  }
  return float(double(a.m) + log(a.s));
}

// Elements per 16-byte vector.
template <bool BF16>
inline constexpr int kVec = BF16 ? 8 : 4;

template <bool BF16>
__device__ __forceinline__ void Unpack(const uint4& u, float (&x)[kVec<BF16>]) {
  if constexpr (BF16) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      x[2 * i] = __uint_as_float(w[i] << 16);
      x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
    x[0] = __uint_as_float(u.x);
    x[1] = __uint_as_float(u.y);
    x[2] = __uint_as_float(u.z);
    x[3] = __uint_as_float(u.w);
  }
}

template <bool BF16>
__device__ __forceinline__ uint4 Pack(const float (&x)[kVec<BF16>]) {
  if constexpr (BF16) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(x[2 * i]));
      const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(x[2 * i + 1]));
      w[i] = lo | (hi << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  } else {
    return make_uint4(__float_as_uint(x[0]), __float_as_uint(x[1]), __float_as_uint(x[2]),
                      __float_as_uint(x[3]));
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

// What a row's offsets and target say, and whether they are usable (out of
// range ones make the row NaN rather than be read).
struct RowHead {
  int64_t lo, hi, target;
  bool bad;
};

__device__ __forceinline__ RowHead ReadHead(const Params& p, int64_t row) {
  RowHead h;
  h.lo = LoadIdx(p.offsets, p.offsets_type, row);
  h.hi = LoadIdx(p.offsets, p.offsets_type, row + 1);
  h.target = LoadIdx(p.targets, p.targets_type, row);
  h.bad = h.lo < 0 || h.hi < h.lo || h.hi > p.num_values || h.target < 0 ||
          h.target >= p.vocab;
  return h;
}

// log-sum-exp of a whole row (the no-mask case), all lanes get it.
template <bool BF16>
__device__ __forceinline__ float DenseRowLse(const Params& p, int64_t row, int lane) {
  Lse acc;
  if (p.vec_in) {
    constexpr int W = kVec<BF16>;
    const uint4* v = reinterpret_cast<const uint4*>(
        static_cast<const char*>(p.logits) + row * p.vocab * (BF16 ? 2 : 4));
    const int64_t n = p.vocab / W;
    int64_t i = lane;
    // Eight 16-byte loads in flight per lane before any arithmetic waits on
    // them: an unmasked row is read by one warp, and the rows around it are
    // mostly short masked ones, so this warp alone must cover the latency.
    constexpr int kUnroll = 8;
    for (; i + 32 * (kUnroll - 1) < n; i += 32 * kUnroll) {
      uint4 u[kUnroll];
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) u[j] = __ldg(v + i + 32 * j);
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        float x[W];
        Unpack<BF16>(u[j], x);
        AddChunk(acc, x);
      }
    }
    for (; i < n; i += 32) {
      float x[W];
      Unpack<BF16>(__ldg(v + i), x);
      AddChunk(acc, x);
    }
  } else {
    for (int64_t v = lane; v < p.vocab; v += 32) {
      const float x[1] = {LoadLogit<BF16>(p.logits, row * p.vocab + v)};
      AddChunk(acc, x);
    }
  }
  return WarpLse(acc);
}

template <bool BF16>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(Params p, float* __restrict__ logprobs, float* __restrict__ lse_out) {
  const int lane = threadIdx.x & 31;
  const int64_t warp0 = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t nwarps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = warp0; row < p.rows; row += nwarps) {
    const RowHead h = ReadHead(p, row);
    float lse = NAN;
    bool bad = h.bad, found = true;
    if (!bad && h.hi > h.lo) {
      Lse acc;
      bool lane_bad = false, lane_found = false;
      for (int64_t i = h.lo + lane; i < h.hi; i += 32) {
        const int64_t id = LoadIdx(p.values, p.values_type, i);
        if (id < 0 || id >= p.vocab) {
          lane_bad = true;
          continue;
        }
        lane_found |= id == h.target;
        const float x[1] = {LoadLogit<BF16>(p.logits, row * p.vocab + id)};
        AddChunk(acc, x);
      }
      bad = __any_sync(kFull, lane_bad);
      found = __any_sync(kFull, lane_found);
      lse = WarpLse(acc);
    } else if (!bad) {
      lse = DenseRowLse<BF16>(p, row, lane);
    }
    if (lane == 0) {
      float lp = NAN;
      if (!bad) {
        lp = found ? LoadLogit<BF16>(p.logits, row * p.vocab + h.target) - lse : -INFINITY;
      } else {
        lse = NAN;
      }
      logprobs[row] = lp;
      if (lse_out != nullptr) lse_out[row] = lse;
    }
  }
}

template <bool BF16>
__global__ void __launch_bounds__(kThreads)
    BackwardKernel(Params p, const float* __restrict__ lse_in, const float* __restrict__ glp,
                   const float* __restrict__ glse, void* __restrict__ gx) {
  constexpr int W = kVec<BF16>;
  const int lane = threadIdx.x & 31;
  const int64_t warp0 = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t nwarps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = warp0; row < p.rows; row += nwarps) {
    const RowHead h = ReadHead(p, row);
    const bool masked = h.hi > h.lo;
    bool bad = h.bad, found = true;
    if (!bad && masked) {
      bool lane_bad = false, lane_found = false;
      for (int64_t i = h.lo + lane; i < h.hi; i += 32) {
        const int64_t id = LoadIdx(p.values, p.values_type, i);
        lane_bad |= id < 0 || id >= p.vocab;
        lane_found |= id == h.target;
      }
      bad = __any_sync(kFull, lane_bad);
      found = __any_sync(kFull, lane_found);
    }
    // dL/dz[v] = g 1[v == y] + c exp(z[v] - lse), c = h - g.
    const float g = found ? glp[row] : 0.f;
    const float c = (glse != nullptr ? glse[row] : 0.f) - g;
    const float l = lse_in[row];
    const int64_t base = row * p.vocab;
    if (bad) {
      // Rare: NaN over the row, whatever the zero fill wrote.
      for (int64_t v = lane; v < p.vocab; v += 32) StoreGrad<BF16>(gx, base + v, NAN);
    } else if (masked) {
      // The rest of the row is ZeroMaskedRowsKernel's zeros.
      for (int64_t i = h.lo + lane; i < h.hi; i += 32) {
        const int64_t id = LoadIdx(p.values, p.values_type, i);
        const float z = LoadLogit<BF16>(p.logits, base + id);
        StoreGrad<BF16>(gx, base + id, (id == h.target ? g : 0.f) + c * expf(z - l));
      }
    } else if (p.vec_out && p.vec_in) {
      const int64_t n = p.vocab / W;
      uint4* out = reinterpret_cast<uint4*>(static_cast<char*>(gx) + base * (BF16 ? 2 : 4));
      const uint4* in = reinterpret_cast<const uint4*>(static_cast<const char*>(p.logits) +
                                                       base * (BF16 ? 2 : 4));
      constexpr int kUnroll = 4;
      for (int64_t i0 = lane; i0 < n; i0 += 32 * kUnroll) {
        uint4 u[kUnroll];
#pragma unroll
        for (int j = 0; j < kUnroll; ++j)
          u[j] = i0 + 32 * j < n ? __ldg(in + i0 + 32 * j) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < kUnroll; ++j) {
          const int64_t i = i0 + 32 * j;
          if (i >= n) break;
          float x[W];
          Unpack<BF16>(u[j], x);
#pragma unroll
          for (int e = 0; e < W; ++e)
            x[e] = (i * W + e == h.target ? g : 0.f) + c * expf(x[e] - l);
          out[i] = Pack<BF16>(x);
        }
      }
    } else {
      for (int64_t v = lane; v < p.vocab; v += 32)
        StoreGrad<BF16>(gx, base + v, (v == h.target ? g : 0.f) +
                                          c * expf(LoadLogit<BF16>(p.logits, base + v) - l));
    }
  }
}

// The zeros of the masked rows' gradient, written as a memset would: each
// block a contiguous chunk, consecutive blocks consecutive chunks (a warp
// streaming its own row while thousands of others stream theirs reached only
// ~60% of the memset's bandwidth on an H200). Unmasked rows are left to
// BackwardKernel, which writes every element of them.
template <bool BF16>
__global__ void __launch_bounds__(kThreads) ZeroMaskedRowsKernel(Params p, void* __restrict__ gx) {
  constexpr int kPerThread = 4;
  constexpr int64_t kChunk = int64_t(kThreads) * kPerThread;
  const int esz = BF16 ? 2 : 4;
  const int64_t per_row = p.vec_out ? p.vocab / kVec<BF16> : p.vocab;  // units of a row
  const int64_t chunks = (per_row + kChunk - 1) / kChunk;
  const int64_t items = p.rows * chunks;
  for (int64_t k = blockIdx.x; k < items; k += gridDim.x) {
    const int64_t row = k / chunks;
    if (LoadIdx(p.offsets, p.offsets_type, row + 1) <= LoadIdx(p.offsets, p.offsets_type, row))
      continue;
    const int64_t first = (k - row * chunks) * kChunk + threadIdx.x;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t u = first + j * kThreads;
      if (u >= per_row) break;
      if (p.vec_out)
        reinterpret_cast<uint4*>(static_cast<char*>(gx) + row * p.vocab * esz)[u] =
            make_uint4(0, 0, 0, 0);
      else
        StoreGrad<BF16>(gx, row * p.vocab + u, 0.f);
    }
  }
}

bool Aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15) == 0; }

Params MakeParams(const MaskedLogprobArgs& a, const void* grad_out) {
  Params p;
  p.logits = a.logits;
  p.rows = a.rows;
  p.vocab = a.vocab;
  p.values = a.values;
  p.values_type = int(a.values_type);
  p.num_values = a.num_values;
  p.offsets = a.offsets;
  p.offsets_type = int(a.offsets_type);
  p.targets = a.targets;
  p.targets_type = int(a.targets_type);
  const int per_vec = a.logits_type == FloatType::kBF16 ? 8 : 4;
  const bool whole = a.vocab % per_vec == 0;
  p.vec_in = whole && Aligned16(a.logits);
  p.vec_out = whole && grad_out != nullptr && Aligned16(grad_out);
  return p;
}

dim3 RowGrid(int64_t rows) {
  return dim3(unsigned(std::min<int64_t>(GridFor(rows, kWarpsPerBlock), int64_t(NumSms()) * 64)));
}

}  // namespace

KernelStatus MaskedLogprobForward(const MaskedLogprobArgs& a, float* logprobs, float* lse,
                                  void* stream) {
  if (auto s = ValidateMaskedLogprob(a); !s.ok()) return s;
  if (a.rows > 0 && logprobs == nullptr)
    return KernelStatus::InvalidArgument("null logprobs output");
  if (a.rows == 0) return KernelStatus::Ok();
  auto st = static_cast<cudaStream_t>(stream);
  const Params p = MakeParams(a, nullptr);
  if (a.logits_type == FloatType::kBF16)
    ForwardKernel<true><<<RowGrid(a.rows), kThreads, 0, st>>>(p, logprobs, lse);
  else
    ForwardKernel<false><<<RowGrid(a.rows), kThreads, 0, st>>>(p, logprobs, lse);
  return CheckLaunch("MaskedLogprobForward");
}

KernelStatus MaskedLogprobBackward(const MaskedLogprobArgs& a, const float* lse,
                                   const float* grad_logprobs, const float* grad_lse,
                                   void* grad_logits, void* stream) {
  if (auto s = ValidateMaskedLogprob(a); !s.ok()) return s;
  if (a.rows > 0 && (lse == nullptr || grad_logprobs == nullptr || grad_logits == nullptr))
    return KernelStatus::InvalidArgument("null lse, grad_logprobs or grad_logits");
  if (a.rows == 0) return KernelStatus::Ok();
  auto st = static_cast<cudaStream_t>(stream);
  const Params p = MakeParams(a, grad_logits);
  const unsigned zero_grid = unsigned(std::min<int64_t>(
      GridFor(a.rows * ((a.vocab + kThreads * 4 - 1) / (kThreads * 4)), 1), int64_t(NumSms()) * 32));
  if (a.logits_type == FloatType::kBF16)
    ZeroMaskedRowsKernel<true><<<zero_grid, kThreads, 0, st>>>(p, grad_logits);
  else
    ZeroMaskedRowsKernel<false><<<zero_grid, kThreads, 0, st>>>(p, grad_logits);
  if (auto s = CheckLaunch("MaskedLogprobBackward zero fill"); !s.ok()) return s;
  if (a.logits_type == FloatType::kBF16)
    BackwardKernel<true><<<RowGrid(a.rows), kThreads, 0, st>>>(p, lse, grad_logprobs, grad_lse,
                                                               grad_logits);
  else
    BackwardKernel<false><<<RowGrid(a.rows), kThreads, 0, st>>>(p, lse, grad_logprobs, grad_lse,
                                                                grad_logits);
  return CheckLaunch("MaskedLogprobBackward");
}

}  // namespace rollpack::kernels::cuda
