// A validated sample as the store keeps it: routed experts normalised to the
// compact layout [n, |M|, K] at the narrowest width that holds E, whatever
// layout, dtype, row offset and row count the producer sent.
#ifndef ROLLPACK_SERVER_STORE_STORED_SAMPLE_H_
#define ROLLPACK_SERVER_STORE_STORED_SAMPLE_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "rollpack/v1/ndarray.pb.h"

namespace rollpack {

struct StoredField {
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  // Dimensions after the first (token) one.
  std::vector<int64_t> trailing_shape;
  // C-order bytes, n * product(trailing_shape) * itemsize.
  std::string data;

  int64_t row_bytes() const;
  friend bool operator==(const StoredField& a, const StoredField& b) {
    return a.dtype == b.dtype && a.trailing_shape == b.trailing_shape && a.data == b.data;
  }
};

// Bit-for-bit, so an identical re-send with a NaN scalar is a duplicate
// (NaN != NaN); found by fuzz/sample_validation_fuzzer.
inline bool SameScalars(const std::map<std::string, double>& a,
                        const std::map<std::string, double>& b) {
  if (a.size() != b.size()) return false;
  for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j) {
    if (i->first != j->first || std::memcmp(&i->second, &j->second, sizeof(double)) != 0) {
      return false;
    }
  }
  return true;
}

struct StoredSample {
  std::string sample_id;
  std::string group_id;
  int64_t policy_version = 0;
  // Samples in the group (lifecycle.md); 0 = ungrouped. The pool's
  // default_group_size is applied when the store takes the sample.
  int32_t group_size = 0;
  std::vector<int32_t> tokens;
  // [n, |M|, K] expert ids, 1 byte each when E <= 256, else 2 (little
  // endian); empty for dense models. Rows with row_valid 0 hold zeros.
  std::string experts;
  // [n]: 1 where the producer sent a replayable row; 0 where the row was
  // outside the payload or all -1 (missing).
  std::vector<uint8_t> row_valid;
  // Sorted by name, so iteration order is deterministic.
  std::map<std::string, StoredField> token_fields;
  std::map<std::string, double> scalars;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  bool grouped() const { return group_size > 0 && !group_id.empty(); }
  // Bytes this sample holds in memory (payloads plus bookkeeping), the unit
  // of the store's memory limit.
  int64_t MemoryBytes() const;

  friend bool operator==(const StoredSample& a, const StoredSample& b) {
    return a.sample_id == b.sample_id && a.group_id == b.group_id &&
           a.policy_version == b.policy_version && a.group_size == b.group_size &&
           a.tokens == b.tokens &&
           a.experts == b.experts && a.row_valid == b.row_valid &&
           a.token_fields == b.token_fields && SameScalars(a.scalars, b.scalars);
  }
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_STORED_SAMPLE_H_
