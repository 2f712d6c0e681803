// CUDA apply forward/backward (apply_cuda.h): one warp per row, the row's
// logits in registers, so that each logit is read once for the softmax
// normalisation and the K picks alike.
#include "kernels/apply_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/device_helpers.cuh"

namespace rollpack::kernels::cuda {
namespace {

using internal::CheckLaunch;
using internal::DispatchNpl;
using internal::GridFor;
using internal::kFull;
using internal::kThreads;
using internal::kWarpsPerBlock;
using internal::LoadIdx;
using internal::LoadLogit;
using internal::NumSms;
using internal::WarpMax;
using internal::WarpSum;

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
        for (int i = lane; i < p.e / 16; i += 32)
          reinterpret_cast<uint4*>(mrow)[i] = make_uint4(0, 0, 0, 0);
      } else {
        for (int i = lane; i < p.e; i += 32) mrow[i] = 0;
      }
    }
    if (dense != nullptr) {
      float* drow = dense + row * p.e;
      const float z = bad ? NAN : 0.f;
      if ((p.e & 3) == 0 && (reinterpret_cast<uintptr_t>(dense) & 15) == 0) {
        for (int i = lane; i < p.e / 4; i += 32)
          reinterpret_cast<float4*>(drow)[i] = make_float4(z, z, z, z);
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

int64_t RowGrid(int64_t rows) {
  return std::min<int64_t>(GridFor(rows, kWarpsPerBlock), int64_t(NumSms()) * 64);
}

}  // namespace

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

}  // namespace rollpack::kernels::cuda
