#include "server/store/stored_sample.h"

#include "server/store/ndarray.h"

namespace rollpack {

int64_t StoredField::row_bytes() const {
  int64_t bytes = DTypeSize(dtype);
  for (int64_t d : trailing_shape) bytes *= d;
  return bytes;
}

int64_t StoredSample::MemoryBytes() const {
  // Fixed overhead approximates the object, map nodes and allocator slack.
  constexpr int64_t kOverhead = 256;
  int64_t bytes = kOverhead + sample_id.size() + group_id.size() +
                  static_cast<int64_t>(tokens.size() * sizeof(int32_t)) +
                  static_cast<int64_t>(experts.size() + row_valid.size());
  for (const auto& [name, field] : token_fields) {
    bytes += kOverhead / 2 + name.size() + field.data.size();
  }
  bytes += static_cast<int64_t>(scalars.size()) * (kOverhead / 4);
  bytes += static_cast<int64_t>(pieces.size() * sizeof(PieceBounds));
  return bytes;
}

}  // namespace rollpack
