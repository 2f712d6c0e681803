// CPU static unpack, also the reference the GPU test checks the CUDA kernel
// against: a plain loop per (row, layer), written to be obviously right.
#include "kernels/unpack_static.h"

#include <algorithm>
#include <string>

#include "kernels/cpu_helpers.h"

namespace rollpack::kernels {
namespace {

KernelStatus Bad(const std::string& m) { return KernelStatus::InvalidArgument(m); }
std::string S(int64_t v) { return std::to_string(v); }

}  // namespace

int64_t StaticRowStride(const StaticUnpackArgs& a) {
  return a.out_row_stride == -1 ? a.layers * a.k : a.out_row_stride;
}
int64_t StaticLayerStride(const StaticUnpackArgs& a) {
  return a.out_layer_stride == -1 ? a.k : a.out_layer_stride;
}

KernelStatus ValidateStaticUnpack(const StaticUnpackArgs& a) {
  if (a.max_rows < 0) return Bad("max_rows must be >= 0, got " + S(a.max_rows));
  if (a.layers < 0) return Bad("layers must be >= 0, got " + S(a.layers));
  // Bounds on the sizes; the stride products below are checked on their own.
  if (a.max_rows > (int64_t{1} << 36)) return Bad("max_rows too large: " + S(a.max_rows));
  if (a.layers > (1 << 20)) return Bad("layers too large: " + S(a.layers));
  if (auto s = internal::CheckK(a.k); !s.ok()) return s;
  if (a.num_experts < a.k || a.num_experts > kMaxExperts) {
    return Bad("num_experts must be in [K, " + S(kMaxExperts) + "] (K = " + S(a.k) + "), got " +
               S(a.num_experts));
  }
  if (a.in_type != IndexType::kU8 && a.in_type != IndexType::kU16)
    return Bad("replay_experts must be uint8 or uint16");
  if (a.out_type != OutIndexType::kI32 && a.out_type != OutIndexType::kI64)
    return Bad("the static buffer must be int32 or int64");
  if (a.rows_ptr == nullptr) {
    if (a.rows < 0) return Bad("rows must be >= 0, got " + S(a.rows));
    if (a.rows > a.max_rows) {
      return Bad("the micro-batch has " + S(a.rows) +
                 " router rows but the static buffer holds max_rows = " + S(a.max_rows));
    }
  }
  const int64_t in_rows = a.rows_ptr != nullptr ? a.max_rows : a.rows;
  if (in_rows * a.layers > 0 && a.experts == nullptr) return Bad("null experts");
  if (a.max_rows * a.layers > 0 && a.out == nullptr) return Bad("null static buffer");
  const int64_t rs = StaticRowStride(a), ls = StaticLayerStride(a);
  if (a.out_row_stride < -1 || a.out_layer_stride < -1)
    return Bad("strides must be >= 0 (or -1), got row " + S(a.out_row_stride) + ", layer " +
               S(a.out_layer_stride));
  if (rs > (int64_t{1} << 44) || ls > (int64_t{1} << 44))
    return Bad("strides too large: row " + S(rs) + ", layer " + S(ls));
  // Every offset the kernel forms (row * rs + layer * ls + K) and the
  // overlap checks below (layers * ls, max_rows * rs) stay below 2^62.
  constexpr int64_t kMaxOffset = int64_t{1} << 62;
  if ((a.max_rows > 0 && rs > kMaxOffset / 2 / a.max_rows) ||
      (a.layers > 0 && ls > kMaxOffset / 2 / a.layers)) {
    return Bad("static buffer too large: max_rows " + S(a.max_rows) + " x row stride " + S(rs) +
               ", layers " + S(a.layers) + " x layer stride " + S(ls));
  }
  // The runs of K ids must not overlap: rows outside layers, or layers
  // outside rows. A single row or layer only needs its runs apart.
  const bool many_rows = a.max_rows > 1, many_layers = a.layers > 1;
  const bool row_major = (!many_layers || ls >= a.k) && (!many_rows || rs >= a.layers * ls) &&
                         (many_layers || !many_rows || rs >= a.k);
  const bool layer_major = (!many_rows || rs >= a.k) && (!many_layers || ls >= a.max_rows * rs) &&
                           (many_rows || !many_layers || ls >= a.k);
  if (!row_major && !layer_major) {
    return Bad("static buffer strides (row " + S(rs) + ", layer " + S(ls) +
               ") overlap for max_rows = " + S(a.max_rows) + ", layers = " + S(a.layers) +
               ", K = " + S(a.k));
  }
  return KernelStatus::Ok();
}

namespace cpu {

KernelStatus StaticUnpack(const StaticUnpackArgs& a) {
  if (auto s = ValidateStaticUnpack(a); !s.ok()) return s;
  const int64_t rows =
      a.rows_ptr != nullptr ? std::clamp<int64_t>(*a.rows_ptr, 0, a.max_rows) : a.rows;
  const int64_t rs = StaticRowStride(a), ls = StaticLayerStride(a);
  for (int64_t r = 0; r < a.max_rows; ++r) {
    const bool minus_one =
        r < rows && a.masked_fill_minus_one && a.mask != nullptr && a.mask[r] == 0;
    for (int64_t l = 0; l < a.layers; ++l) {
      for (int j = 0; j < a.k; ++j) {
        int64_t v;
        if (r >= rows) {
          v = StaticFillerId(r, j, a.k, a.num_experts);
        } else if (minus_one) {
          v = -1;
        } else {
          const int64_t src = (r * a.layers + l) * a.k + j;
          v = a.in_type == IndexType::kU8 ? int64_t(static_cast<const uint8_t*>(a.experts)[src])
                                          : int64_t(static_cast<const uint16_t*>(a.experts)[src]);
        }
        const int64_t dst = r * rs + l * ls + j;
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
