// The GPU tests' CUDA helpers (test-only): a CUDA call that fails ends the
// test program naming the call, and device buffers freed when they go.
#ifndef ROLLPACK_KERNELS_TESTING_CUDA_H_
#define ROLLPACK_KERNELS_TESTING_CUDA_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("FATAL %s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

namespace rollpack::kernels::test_support {

// `bytes` of device memory (at least 16, and 64 more for kernels that read
// a vector past the end), freed with the object.
struct DevBuf {
  void* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t bytes) : n(bytes) { CK(cudaMalloc(&p, std::max<size_t>(bytes, 16) + 64)); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  T* as(size_t byte_off = 0) {
    return reinterpret_cast<T*>(static_cast<char*>(p) + byte_off);
  }
};

inline void Upload(void* dst, const void* src, size_t n) {
  if (n) CK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
}
inline void Download(void* dst, const void* src, size_t n) {
  if (n) CK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
}

}  // namespace rollpack::kernels::test_support

#endif  // ROLLPACK_KERNELS_TESTING_CUDA_H_
