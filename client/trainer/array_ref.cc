#include "client/trainer/array_ref.h"

namespace rollpack {

int ElementSize(v1::DType dtype) {
  switch (dtype) {
    case v1::UINT8: return 1;
    case v1::UINT16: case v1::INT16: case v1::FLOAT16: case v1::BFLOAT16: return 2;
    case v1::INT32: case v1::FLOAT32: return 4;
    case v1::INT64: case v1::FLOAT64: return 8;
    default: return 0;
  }
}

int64_t ArrayRef::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t ArrayRef::nbytes() const { return numel() * ElementSize(dtype); }

}  // namespace rollpack
