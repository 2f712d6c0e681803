// What the routing-replay kernels share: status, element types, id views and
// limits (the operations are in unpack.h, apply.h and agreement.h).
//
// Depends only on the C++ standard library, so that it builds where absl is
// missing (the GPU machine); replay_kernels_absl.h adapts KernelStatus to
// absl::Status. The CUDA versions (replay_kernels_cuda.h) take the same
// argument structs plus a stream and device pointers, so that one set of
// structs and validators serves both.
//
// Every function validates its sizes and returns INVALID_ARGUMENT (before
// touching any memory) on a bad shape; rows == 0 is valid and does nothing
// (agreement still writes its zero counts). Limits: 1 <= K <= 16 (kMaxK),
// K <= E <= 1024 (kMaxExperts) where E is an argument.
#ifndef ROLLPACK_KERNELS_COMMON_H_
#define ROLLPACK_KERNELS_COMMON_H_

#include <cstdint>
#include <string>
#include <utility>

namespace rollpack::kernels {

inline constexpr int kMaxK = 16;
inline constexpr int kMaxExperts = 1024;

enum class StatusCode : int { kOk = 0, kInvalidArgument = 3, kInternal = 13 };

// A small status without absl (see replay_kernels_absl.h for the adapter).
struct KernelStatus {
  StatusCode code = StatusCode::kOk;
  std::string message;

  bool ok() const { return code == StatusCode::kOk; }
  static KernelStatus Ok() { return {}; }
  static KernelStatus InvalidArgument(std::string m) {
    return {StatusCode::kInvalidArgument, std::move(m)};
  }
  static KernelStatus Internal(std::string m) {
    return {StatusCode::kInternal, std::move(m)};
  }
  std::string ToString() const;
};

enum class IndexType : int { kU8 = 0, kU16 = 1, kI32 = 2, kI64 = 3 };
enum class OutIndexType : int { kI32 = 2, kI64 = 3 };
enum class FloatType : int { kF32 = 0, kBF16 = 1 };  // bf16: raw uint16 bits
enum class ScoreFunction : int { kSoftmax = 0, kSigmoid = 1 };

int IndexTypeSize(IndexType t);

// Strided view of expert ids: id(l, r, k) = data[l * layer_stride +
// r * row_stride + k] (strides in elements). For the received buffer
// [rows, layers, K]: row_stride = layers * K, layer_stride = K. For unpacked
// [layers, rows, K]: row_stride = K, layer_stride = rows * K.
struct IndexView {
  const void* data = nullptr;
  IndexType type = IndexType::kI64;
  int64_t row_stride = 0;
  int64_t layer_stride = 0;
};

// bf16 <-> float (round to nearest even), host side.
float Bf16ToFloat(uint16_t b);
uint16_t FloatToBf16(float f);

}  // namespace rollpack::kernels

#endif  // ROLLPACK_KERNELS_COMMON_H_
