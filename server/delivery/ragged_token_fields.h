// Microbatch.ragged_token_fields (layout.md section 13) of one rank's
// micro-batch, written as MicrobatchEncoder writes its arrays: sized first,
// then framed by hand with each field's values and offsets gathered from
// the stored samples straight into their place in the output buffer.
#ifndef ROLLPACK_SERVER_DELIVERY_RAGGED_TOKEN_FIELDS_H_
#define ROLLPACK_SERVER_DELIVERY_RAGGED_TOKEN_FIELDS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "rollpack/v1/ndarray.pb.h"
#include "scheduler/layout.h"
#include "server/store/step.h"

namespace rollpack {

// Not thread-safe; reused between micro-batches to keep its vectors.
class RaggedTokenFieldsEncoder {
 public:
  // Nothing to write (a rank or piece without token fields).
  void Clear();

  // The fields over the token rows `runs` (a rank's, or a piece's renumbered
  // to tile its own rows), one entry per name of the sample at ordinal
  // `schema` of the micro-batch, in name order. samples[sequences[j]] is
  // ordinal j's sample, set for every ordinal the runs read. DATA_LOSS
  // naming the step, sample and field when a sample the runs read lacks a
  // field, has another or an extra one, or holds offsets or values that do
  // not fit its tokens. `samples`, `sequences` and `runs` must outlive
  // Encode.
  absl::Status Prepare(const Step& step,
                       absl::Span<const std::shared_ptr<const StoredSample>> samples,
                       absl::Span<const int> sequences, int schema, absl::Span<const RowRun> runs);

  // Bytes Encode writes: every entry of field `Microbatch.ragged_token_fields`.
  size_t encoded_size() const { return encoded_size_; }

  // Writes exactly encoded_size() bytes: what deterministic protobuf
  // serialization gives for the map. INVALID_ARGUMENT for another size.
  absl::Status Encode(absl::Span<uint8_t> out) const;

 private:
  struct Field {
    std::string name;
    v1::DType dtype = v1::DTYPE_UNSPECIFIED;
    size_t value_bytes = 0;
    int64_t values = 0;  // in the runs' rows
    // NDArray {dtype, shape} of values and offsets serialized, data omitted.
    std::string values_head;
    std::string offsets_head;
  };
  // Sizes of one field's nested messages (the data's framing included).
  struct Sizes {
    size_t values_array = 0;
    size_t offsets_array = 0;
    size_t ragged = 0;
    size_t entry = 0;
  };
  Sizes SizesOf(const Field& field) const;
  absl::Status CheckSample(const Step& step, int seq, const StoredSample& sample) const;

  absl::Span<const std::shared_ptr<const StoredSample>> samples_;
  absl::Span<const int> sequences_;
  absl::Span<const RowRun> runs_;
  int64_t rows_ = 0;
  std::vector<Field> fields_;
  size_t encoded_size_ = 0;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_DELIVERY_RAGGED_TOKEN_FIELDS_H_
