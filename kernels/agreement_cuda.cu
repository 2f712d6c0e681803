// CUDA agreement (agreement_cuda.h): one warp per (layer, row), K rounds of
// warp arg-max for the live top-K; counts reduced per block, then one 64-bit
// atomic per count per block.
#include "kernels/agreement_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/device_helpers.cuh"

namespace rollpack::kernels::cuda {
namespace {

using internal::CheckCall;
using internal::CheckLaunch;
using internal::DispatchNpl;
using internal::GridFor;
using internal::kFull;
using internal::kThreads;
using internal::kWarpsPerBlock;
using internal::LoadIdx;
using internal::LoadLogit;
using internal::NumSms;

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
  const int64_t gx =
      std::max<int64_t>(1, std::min<int64_t>(GridFor(p.rows, kWarpsPerBlock),
                                             (int64_t(NumSms()) * 32 + layers - 1) / layers));
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
