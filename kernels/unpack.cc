// CPU unpack, also the reference the GPU test checks the CUDA kernels against:
// a plain loop in input order, written to be obviously right, not fast.
#include "kernels/unpack.h"

#include "kernels/cpu_helpers.h"

namespace rollpack::kernels {

KernelStatus ValidateUnpack(const UnpackArgs& a) {
  if (a.rows < 0 || a.layers < 0)
    return KernelStatus::InvalidArgument("rows and layers must be >= 0");
  if (auto s = internal::CheckK(a.k); !s.ok()) return s;
  if (a.in_type != IndexType::kU8 && a.in_type != IndexType::kU16)
    return KernelStatus::InvalidArgument("replay_experts must be uint8 or uint16");
  if (a.out_type != OutIndexType::kI32 && a.out_type != OutIndexType::kI64)
    return KernelStatus::InvalidArgument("output must be int32 or int64");
  const int64_t n = a.rows * a.layers;
  if (n > 0 && (a.experts == nullptr || a.out == nullptr))
    return KernelStatus::InvalidArgument("null experts or out");
  if (a.out_layer_stride != -1 && a.out_layer_stride < a.rows * a.k)
    return KernelStatus::InvalidArgument("out_layer_stride < rows * K");
  return KernelStatus::Ok();
}

namespace cpu {

KernelStatus Unpack(const UnpackArgs& a) {
  if (auto s = ValidateUnpack(a); !s.ok()) return s;
  const int64_t ls = a.out_layer_stride == -1 ? a.rows * a.k : a.out_layer_stride;
  for (int64_t r = 0; r < a.rows; ++r) {
    const bool fill = a.masked_fill_minus_one && a.mask != nullptr && a.mask[r] == 0;
    for (int64_t l = 0; l < a.layers; ++l) {
      for (int k = 0; k < a.k; ++k) {
        const int64_t src = (r * a.layers + l) * a.k + k;
        int64_t v = a.in_type == IndexType::kU8
                        ? int64_t(static_cast<const uint8_t*>(a.experts)[src])
                        : int64_t(static_cast<const uint16_t*>(a.experts)[src]);
        if (fill) v = -1;
        const int64_t dst = l * ls + r * a.k + k;
        if (a.out_type == OutIndexType::kI64)
          static_cast<int64_t*>(a.out)[dst] = v;
        else
          static_cast<int32_t*>(a.out)[dst] = int32_t(v);
      }
    }
  }
  return KernelStatus::Ok();
}

}  // namespace cpu
}  // namespace rollpack::kernels
