// A typed view of one array of a delivered micro-batch, on the host or on a
// CUDA device (docs/trainer.md).
#ifndef ROLLPACK_CLIENT_TRAINER_ARRAY_REF_H_
#define ROLLPACK_CLIENT_TRAINER_ARRAY_REF_H_

#include <cstdint>
#include <vector>

#include "rollpack/v1/ndarray.pb.h"

namespace rollpack {

// A dense C-order array in host (device == -1) or CUDA device memory.
struct ArrayRef {
  void* data = nullptr;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  int64_t numel() const;
  int64_t nbytes() const;
};

// A ragged token field (layout.md section 13) on the same memory as the
// batch's other arrays: row r's list is values[offsets[r] : offsets[r + 1]].
// values: INT32 [num_values] whatever the wire's dtype (uint16 ids are
// widened as they are staged: torch before 2.3 has no uint16 to index
// with); offsets: INT64 [rows + 1], from 0, checked on receipt.
struct RaggedArrayRef {
  ArrayRef values;
  ArrayRef offsets;
};

// Bytes per element; 0 for a dtype the trainer side cannot hold.
int ElementSize(v1::DType dtype);

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_TRAINER_ARRAY_REF_H_
