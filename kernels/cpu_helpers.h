// Checks and loads shared by the CPU sources of the kernels (unpack.cc,
// apply.cc, agreement.cc); not part of the API. Validation lives on the CPU
// side because the CUDA versions call the same Validate* functions.
#ifndef ROLLPACK_KERNELS_CPU_HELPERS_H_
#define ROLLPACK_KERNELS_CPU_HELPERS_H_

#include <cstdint>
#include <string>

#include "kernels/common.h"

namespace rollpack::kernels::internal {

inline KernelStatus CheckK(int k) {
  if (k < 1 || k > kMaxK)
    return KernelStatus::InvalidArgument("K must be in [1, 16], got " + std::to_string(k));
  return KernelStatus::Ok();
}

inline KernelStatus CheckView(const IndexView& v, const char* name, int64_t rows, int k,
                              bool layered) {
  if (IndexTypeSize(v.type) == 0)
    return KernelStatus::InvalidArgument(std::string(name) + ": bad index type");
  if (rows > 0 && v.data == nullptr)
    return KernelStatus::InvalidArgument(std::string(name) + ": null data");
  if (rows > 1 && v.row_stride < k)
    return KernelStatus::InvalidArgument(std::string(name) + ": row_stride < K");
  if (layered && v.layer_stride < 0)
    return KernelStatus::InvalidArgument(std::string(name) + ": negative layer_stride");
  return KernelStatus::Ok();
}

inline int64_t LoadIdx(const IndexView& v, int64_t off) {
  switch (v.type) {
    case IndexType::kU8:
      return static_cast<const uint8_t*>(v.data)[off];
    case IndexType::kU16:
      return static_cast<const uint16_t*>(v.data)[off];
    case IndexType::kI32:
      return static_cast<const int32_t*>(v.data)[off];
    case IndexType::kI64:
      return static_cast<const int64_t*>(v.data)[off];
  }
  return -1;
}

inline double LoadLogit(const void* p, FloatType t, int64_t off) {
  if (t == FloatType::kF32) return static_cast<const float*>(p)[off];
  return Bf16ToFloat(static_cast<const uint16_t*>(p)[off]);
}

}  // namespace rollpack::kernels::internal

#endif  // ROLLPACK_KERNELS_CPU_HELPERS_H_
