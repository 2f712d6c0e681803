// A pool's fields as the store fixes them (pool.h, "Schema"): every
// sample of a pool carries the same token fields and ragged field names.
#ifndef ROLLPACK_SERVER_STORE_FIELD_SCHEMA_H_
#define ROLLPACK_SERVER_STORE_FIELD_SCHEMA_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "rollpack/v1/ndarray.pb.h"

namespace rollpack {

struct FieldSchema {
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> trailing_shape;
  // A ragged per-token field (layout.md section 13): its name is what the
  // pool fixes (dtype: the stored one, no trailing shape). Only in the
  // schema a PoolDirectory proposes and fixes (pool_directory.h).
  bool ragged = false;
};

// The fields a batch's first sample (not a later piece) proposes for a pool
// that has not fixed them yet.
struct BatchSchema {
  std::map<std::string, FieldSchema> token_fields;
  std::set<std::string> ragged;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_FIELD_SCHEMA_H_
