// Ragged per-token fields as a trainer receives them (layout.md section 13;
// trainer.proto Microbatch.ragged_token_fields): one list per token row,
// `values` (uint16 or int32 ids) and `offsets` (int64 [rows + 1], from 0,
// never decreasing, ending at len(values)). The checks every receiver makes
// before it trusts one, whichever form the bytes are in: the heads (dtype,
// shape) here, the offsets' contents fed in pieces of any size, as gRPC's
// slices cut them.
#ifndef ROLLPACK_CLIENT_CPP_RAGGED_FIELD_H_
#define ROLLPACK_CLIENT_CPP_RAGGED_FIELD_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "rollpack/v1/ndarray.pb.h"

namespace rollpack {

// The names of a ragged field's two arrays among a micro-batch's arrays
// (ReceivedMicrobatch, the trainer's slots): "ragged_values:<name>" and
// "ragged_offsets:<name>".
inline constexpr absl::string_view kRaggedValuesPrefix = "ragged_values:";
inline constexpr absl::string_view kRaggedOffsetsPrefix = "ragged_offsets:";
std::string RaggedValuesName(absl::string_view field);
std::string RaggedOffsetsName(absl::string_view field);

// What the heads of a delivered ragged field say.
struct RaggedShape {
  v1::DType values_dtype = v1::DTYPE_UNSPECIFIED;  // UINT16 or INT32
  int64_t rows = 0;                                // offsets has rows + 1 entries
  int64_t num_values = 0;
  int64_t values_bytes() const { return num_values * (values_dtype == v1::UINT16 ? 2 : 4); }
  int64_t offsets_bytes() const { return (rows + 1) * 8; }
};

// `field`'s heads: values 1-D UINT16 or INT32, offsets 1-D INT64 of at
// least one entry. DATA_LOSS naming `where` (e.g. "micro-batch 3"), the
// field and what it holds otherwise.
absl::StatusOr<RaggedShape> ReadRaggedShape(absl::string_view where, absl::string_view field,
                                            const v1::RaggedArray& heads);

// The offsets' contents, fed as little-endian bytes in pieces of any size
// (an entry may straddle two): offsets[0] = 0, never decreasing, the last
// = `num_values`, exactly `rows + 1` entries.
class RaggedOffsetsCheck {
 public:
  RaggedOffsetsCheck(int64_t rows, int64_t num_values) : rows_(rows), num_values_(num_values) {}

  void Feed(const char* data, int64_t size);
  // OK, or DATA_LOSS naming `where`, `field`, the row and the values.
  absl::Status Finish(absl::string_view where, absl::string_view field) const;

 private:
  void Take(int64_t offset);

  const int64_t rows_;
  const int64_t num_values_;
  int64_t entries_ = 0;
  int64_t previous_ = 0;
  // The first entry that broke a rule (-1: none yet) and its value.
  int64_t bad_entry_ = -1;
  int64_t bad_value_ = 0;
  char carry_[8] = {};
  int carried_ = 0;
};

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_CPP_RAGGED_FIELD_H_
