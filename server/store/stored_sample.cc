#include "server/store/stored_sample.h"

#include "server/store/ndarray.h"

namespace rollpack {

int64_t StoredField::row_bytes() const {
  int64_t bytes = DTypeSize(dtype);
  for (int64_t d : trailing_shape) bytes *= d;
  return bytes;
}

}  // namespace rollpack
