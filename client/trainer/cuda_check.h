// CUDA error and current-device handling shared by the CUDA delivery paths
// (built with ROLLPACK_WITH_CUDA only).
#ifndef ROLLPACK_CLIENT_TRAINER_CUDA_CHECK_H_
#define ROLLPACK_CLIENT_TRAINER_CUDA_CHECK_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rollpack::trainer_internal {

inline absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

#define RP_CUDA(expr)                                                            \
  do {                                                                           \
    cudaError_t _e = (expr);                                                     \
    if (_e != cudaSuccess) return ::rollpack::trainer_internal::CudaError(_e, #expr); \
  } while (0)

// The library runs on the caller's threads too (Next, destructors): it must
// leave their current device as it found it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&prev_);
    if (prev_ != device) cudaSetDevice(device);
    changed_ = prev_ != device;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool changed_ = false;
};

}  // namespace rollpack::trainer_internal

#endif  // ROLLPACK_CLIENT_TRAINER_CUDA_CHECK_H_
