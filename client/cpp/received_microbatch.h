// A Microbatch as the trainer receives it: gRPC's received slices kept as they
// are, the small fields parsed, and every array's bytes located in the slices
// but not copied. The consumer copies each array once, straight to where it
// is used (DeviceStream: the pinned staging buffer the H2D copy reads), where
// protobuf's parse would first copy every array into a std::string of fresh
// memory and the consumer would copy it again (docs/performance.md).
//
// Parsing follows protobuf's rules for any valid encoding, not only the
// canonical one rollpackd writes: fields in any order, unknown fields kept,
// a repeated message field merged, the last value of a scalar or bytes field
// wins, the last map entry of a key wins. ToMessage() equals what
// Microbatch::ParseFromString gives for the same bytes (tested on randomised
// encodings in client/cpp/received_microbatch_test.cc).
//
// A micro-batch assembled from the pieces of a FetchPieces stream
// (microbatch_assembly.h) is one too: it keeps every piece's slices, and
// CopyData scatters each piece's rows to their place in the same one copy.
#ifndef ROLLPACK_CLIENT_CPP_RECEIVED_MICROBATCH_H_
#define ROLLPACK_CLIENT_CPP_RECEIVED_MICROBATCH_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cpp/ragged_field.h"
#include "client/cpp/sequence_metadata.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack {

class ReceivedMicrobatch {
 public:
  // The arrays of a Microbatch, by the names DeviceStream uses for them:
  // "tokens", "cu_seqlens", "cu_seqlens_padded", "replay_experts",
  // "replay_mask", "field:<name>" for token_fields[<name>], and
  // "ragged_values:<name>" / "ragged_offsets:<name>" for the two arrays of
  // ragged_token_fields[<name>] (client/cpp/ragged_field.h).
  static constexpr absl::string_view kFieldPrefix = "field:";

  // DATA_LOSS naming the byte offset when the bytes are not a Microbatch.
  static absl::StatusOr<ReceivedMicrobatch> Parse(const grpc::ByteBuffer& buffer);

  ReceivedMicrobatch() = default;
  ReceivedMicrobatch(ReceivedMicrobatch&&) = default;
  ReceivedMicrobatch& operator=(ReceivedMicrobatch&&) = default;

  // Every field but the arrays' `data`, which is empty here. The
  // per-sequence fields (group_ids, policy_versions, scalars, advantages:
  // a few bytes per sequence) are held whole, data included.
  const v1::Microbatch& meta() const { return meta_; }
  // Those per-sequence fields, checked against the number of sequences
  // (DATA_LOSS naming the field otherwise) and decoded
  // (client/cpp/sequence_metadata.h).
  absl::StatusOr<SequenceMetadata> sequences() const { return ReadSequenceMetadata(meta_); }
  // Bytes the message occupied on the wire.
  int64_t wire_bytes() const { return wire_bytes_; }

  // The named array's `data` size in bytes; -1 if the message has no such
  // array (an absent array and one without data both read as 0 in
  // protobuf: ToMessage() makes no difference between them either).
  int64_t data_size(absl::string_view array) const;

  // Copies the named array's bytes to `out` (data_size bytes); nothing for
  // an absent array.
  void CopyData(absl::string_view array, void* out) const;

  // Ragged token field `field` (layout.md section 13) checked before anyone
  // trusts it: its heads (ReadRaggedShape), its two arrays' data sizes, and
  // its offsets from 0, never decreasing, ending at the number of values
  // (read in place, not copied). DATA_LOSS naming the micro-batch, the
  // field and the offending entry otherwise; NOT_FOUND when the micro-batch
  // has no such field. Its bytes: CopyData(RaggedValuesName(field), ...)
  // and CopyData(RaggedOffsetsName(field), ...).
  absl::StatusOr<RaggedShape> CheckRagged(absl::string_view field) const;

  // The whole message, arrays copied once into its strings.
  v1::Microbatch ToMessage() const;

 private:
  // Bytes [offset, offset + size) of the slices, offsets counted over all
  // of them in order.
  struct Range {
    int64_t offset = 0;
    int64_t size = 0;
  };
  // Part of an array's bytes: `from` in the slices goes to byte `to` of the
  // array.
  struct Segment {
    Range from;
    int64_t to = 0;
  };
  // An array's bytes: `size` in all, its segments sorted by `to` and tiling
  // [0, size). One segment for a message as received; one per row span of
  // each piece for a micro-batch assembled from pieces (microbatch_assembly.h),
  // whose slices are those of all its pieces.
  struct ArrayData {
    int64_t size = 0;
    std::vector<Segment> segments;
  };

  friend class MicrobatchWireParser;
  friend class MicrobatchAssembler;

  // Calls `piece(data, size)` for each slice's part of [offset, offset+size).
  template <typename Fn>
  void ForEachPiece(Range range, Fn piece) const;
  const ArrayData* Find(absl::string_view array) const;

  v1::Microbatch meta_;
  std::map<std::string, ArrayData, std::less<>> data_;
  std::vector<grpc::Slice> slices_;
  std::vector<int64_t> slice_offsets_;  // offset of each slice's first byte
  int64_t wire_bytes_ = 0;
};

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_CPP_RECEIVED_MICROBATCH_H_
