// NDArray messages built from typed values, for tests that write wire
// samples by hand.
#ifndef ROLLPACK_TESTING_NDARRAYS_H_
#define ROLLPACK_TESTING_NDARRAYS_H_

#include <cstdint>
#include <vector>

#include "rollpack/v1/ndarray.pb.h"

namespace rollpack {

// C-order `values` of `shape`, little endian (the host's order here).
template <typename T>
v1::NDArray TestArray(v1::DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
  v1::NDArray a;
  a.set_dtype(dtype);
  for (int64_t d : shape) a.add_shape(d);
  a.mutable_data()->assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  return a;
}

// A 1-D array of `values`.
template <typename T>
v1::NDArray TestArray(v1::DType dtype, const std::vector<T>& values) {
  return TestArray(dtype, {static_cast<int64_t>(values.size())}, values);
}

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_NDARRAYS_H_
