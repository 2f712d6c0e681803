// Reading and writing the wire's NDArray without copying its payload.
#ifndef ROLLPACK_SERVER_STORE_NDARRAY_H_
#define ROLLPACK_SERVER_STORE_NDARRAY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "rollpack/v1/ndarray.pb.h"

namespace rollpack {

// Bytes per element, or 0 for DTYPE_UNSPECIFIED and unknown values.
int DTypeSize(v1::DType dtype);
// "uint8", "int32", ...; "dtype(N)" for unknown values.
std::string DTypeName(v1::DType dtype);

// A validated, read-only view of an NDArray's payload.
struct ArrayView {
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  absl::string_view data;

  int64_t num_elements() const;
  int64_t dim(int i) const { return shape[i]; }
  int rank() const { return static_cast<int>(shape.size()); }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data.data());
  }
};

// Checks that `array` is well formed: a known dtype, no negative dimension,
// no overflow of product(shape) * itemsize, and exactly that many bytes.
// `what` names the array in errors, e.g. `sample "s17": tokens`.
absl::StatusOr<ArrayView> ViewArray(const v1::NDArray& array,
                                    absl::string_view what);

// True when the message carries nothing (no dtype, shape or data): an
// optional array that was not sent.
bool IsEmptyArray(const v1::NDArray& array);

// Fills `out` with a C-order array of `dtype` and `shape`, leaving `data`
// sized but unwritten so callers can gather straight into it.
char* ResizeArray(v1::NDArray* out, v1::DType dtype,
                  absl::Span<const int64_t> shape);

// Copies a typed vector into `out` (for small metadata arrays).
void SetInt32Array(v1::NDArray* out, absl::Span<const int32_t> values);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_NDARRAY_H_
