// What the CUDA sources of the kernels share (unpack_cuda.cu, apply_cuda.cu,
// agreement_cuda.cu and the benchmark's bench/unpack_variants.cu): launch
// shape, error checks, cached device attributes, id/logit loads and warp
// reductions. Not part of the API: no public header includes it, so callers
// of replay_kernels_cuda.h need no CUDA include.
//
// Everything is inline in a named namespace rather than static: the device
// attribute caches are then one per program, and a source that leaves a helper
// unused gets no unused-function warning (the CUDA builds use
// --Werror=all-warnings).
#ifndef ROLLPACK_KERNELS_DEVICE_HELPERS_CUH_
#define ROLLPACK_KERNELS_DEVICE_HELPERS_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/common.h"

namespace rollpack::kernels::cuda::internal {

inline constexpr int kThreads = 256;
inline constexpr int kWarpsPerBlock = kThreads / 32;
inline constexpr unsigned kFull = 0xffffffffu;

inline KernelStatus CheckLaunch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return KernelStatus::Internal(std::string(what) + ": " + cudaGetErrorString(e));
  return KernelStatus::Ok();
}

inline KernelStatus CheckCall(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    return KernelStatus::Internal(std::string(what) + ": " + cudaGetErrorString(e));
  return KernelStatus::Ok();
}

inline int64_t GridFor(int64_t work_items, int64_t per_block) {
  int64_t g = (work_items + per_block - 1) / per_block;
  return g < 1 ? 1 : (g > (1LL << 30) ? (1LL << 30) : g);
}

// Device attributes, cached: the launchers size every launch from them and
// each query is a driver round trip.
inline int MaxDynamicSmem() {
  static int v = [] {
    int dev = 0, val = 48 * 1024;
    if (cudaGetDevice(&dev) == cudaSuccess)
      cudaDeviceGetAttribute(&val, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return val;
  }();
  return v;
}

inline int NumSms() {
  static int v = [] {
    int dev = 0, val = 132;
    if (cudaGetDevice(&dev) == cudaSuccess)
      cudaDeviceGetAttribute(&val, cudaDevAttrMultiProcessorCount, dev);
    return val;
  }();
  return v;
}

inline int SmemPerSm() {
  static int v = [] {
    int dev = 0, val = 228 * 1024;
    if (cudaGetDevice(&dev) == cudaSuccess)
      cudaDeviceGetAttribute(&val, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    return val;
  }();
  return v;
}

// Calls f(TIn{}, TOut{}) with unpack's element types: uint8_t or uint16_t in,
// int32_t or long long out, so that each launcher is written once as a
// template.
template <typename F>
KernelStatus DispatchUnpackTypes(IndexType in, OutIndexType out, F&& f) {
  const bool u8 = in == IndexType::kU8;
  const bool i64 = out == OutIndexType::kI64;
  if (u8 && i64) return f(uint8_t{}, 0LL);
  if (u8) return f(uint8_t{}, int32_t{});
  if (i64) return f(uint16_t{}, 0LL);
  return f(uint16_t{}, int32_t{});
}

// Calls f(std::integral_constant<int, NPL>) with NPL = ceil(E / 32) rounded up
// to a power of two: the logits of a row live in registers, NPL per lane.
template <typename F>
KernelStatus DispatchNpl(int e, F&& f) {
  if (e <= 32) return f(std::integral_constant<int, 1>());
  if (e <= 64) return f(std::integral_constant<int, 2>());
  if (e <= 128) return f(std::integral_constant<int, 4>());
  if (e <= 256) return f(std::integral_constant<int, 8>());
  if (e <= 512) return f(std::integral_constant<int, 16>());
  return f(std::integral_constant<int, 32>());
}

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

}  // namespace rollpack::kernels::cuda::internal

#endif  // ROLLPACK_KERNELS_DEVICE_HELPERS_CUH_
