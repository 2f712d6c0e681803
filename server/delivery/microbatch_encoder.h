// Materialises what one trainer rank receives for one micro-batch directly as
// the bytes gRPC sends: the canonical protobuf encoding of v1::Microbatch,
// with tokens, token fields (dense and ragged) and replay gathered from the
// stored samples into their final place in the output buffer. That gather is
// the only copy of payload bytes the server makes when serving a fetch
// (docs/performance.md).
#ifndef ROLLPACK_SERVER_DELIVERY_MICROBATCH_ENCODER_H_
#define ROLLPACK_SERVER_DELIVERY_MICROBATCH_ENCODER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "rollpack/v1/trainer.pb.h"
#include "scheduler/layout.h"
#include "server/delivery/ragged_token_fields.h"
#include "server/store/step.h"

namespace rollpack {

// Trainer.FetchPieces: the micro-batch's rows of the sequences one member
// holds, and where they go (trainer.proto, PieceRows).
struct PieceSelection {
  // Owner of each of the step's sequences (an index into `members`);
  // empty: every sequence is this member's.
  absl::Span<const int32_t> owner;
  absl::Span<const std::string> members;
  int self = -1;
  // Every metadata field and the other owners, with this member's rows.
  bool header = false;
};

struct MicrobatchRequest {
  RankCoords rank;
  int index = 0;
  // Tokens and token fields to every pipeline stage.
  bool all_fields = false;
  // Null: the whole micro-batch (FetchMicrobatches). Must outlive Encode.
  const PieceSelection* piece = nullptr;
  // A RECOMPUTE step whose plan holds no routing (a cluster step): [i] is
  // the step's sequence i's, set for every sequence of the micro-batch.
  // Empty: the step's own. Must outlive Encode.
  absl::Span<const std::shared_ptr<const std::string>> recompute_routing;
};

// Two phases so the caller can allocate the output (a gRPC slice) at its
// exact size: Prepare lays the micro-batch out and sizes it, Encode gathers.
// One encoder per stream, reused between micro-batches to keep its vectors.
// Not thread-safe; the Step must outlive Encode.
class MicrobatchEncoder {
 public:
  // Errors: the layout's (INVALID_ARGUMENT for coordinates, OUT_OF_RANGE for
  // the index).
  absl::Status Prepare(const Step& step, const MicrobatchRequest& request);
  // The same with the samples given apart from the step (a cluster step's
  // plan holds none): samples[i] is the step's sequence i, and must be set
  // for every sequence of the rank's micro-batch. Must outlive Encode.
  absl::Status Prepare(const Step& step, const MicrobatchRequest& request,
                       absl::Span<const std::shared_ptr<const StoredSample>> samples);

  // Bytes Encode writes for the prepared micro-batch.
  size_t encoded_size() const { return encoded_size_; }
  // A piece that is not the header, of a micro-batch without rows of this
  // member: nothing to send (encoded_size() is 0).
  bool empty_piece() const { return empty_piece_; }

  // Writes exactly encoded_size() bytes: what SerializeToString with
  // deterministic map order gives for the same v1::Microbatch, so it parses
  // with any protobuf implementation. INVALID_ARGUMENT if `out` has another
  // size; FAILED_PRECONDITION before a successful Prepare.
  absl::Status Encode(absl::Span<char> out) const;

 private:
  enum class Payload { kTokens, kTokenField, kReplayExperts, kReplayMask };
  // One NDArray field whose data is gathered in place.
  struct ArrayField {
    Payload payload;
    int field_number = 0;   // of Microbatch
    std::string map_key;    // token_fields only
    std::string array_head; // NDArray {dtype, shape} serialized, data omitted
    int64_t data_bytes = 0;
  };

  size_t ArrayFieldSize(const ArrayField& field) const;
  // DATA_LOSS unless `sample` (the step's sequence `seq`) holds routing of
  // the width the step's model gathers: its experts and row flags, or its
  // committed recompute routing.
  absl::Status CheckRouting(const Step& step, int seq, const StoredSample& sample) const;
  absl::Status GatherPayload(const ArrayField& field, absl::Span<uint8_t> out,
                             absl::Span<uint8_t> mask_out) const;

  // Keeps the runs of the sequences `piece` owns, renumbered to tile their
  // own rows, and notes each kept run's rows of the whole output as (first,
  // count) pairs in `spans`.
  static void SelectRuns(absl::Span<const RowRun> runs, const PieceSelection& piece,
                         absl::Span<const int> sequences, std::vector<RowRun>* kept,
                         google::protobuf::RepeatedField<int64_t>* spans);

  const Step* step_ = nullptr;
  absl::Span<const std::shared_ptr<const StoredSample>> samples_;
  absl::Span<const std::shared_ptr<const std::string>> recompute_routing_;
  RankMicrobatchLayout rank_;
  // What the arrays carry: the rank's runs, or a piece's.
  absl::Span<const RowRun> token_runs_;
  absl::Span<const RowRun> router_runs_;
  std::vector<RowRun> piece_token_runs_;
  std::vector<RowRun> piece_router_runs_;
  // Ordinal of the first sequence whose sample is here (token fields'
  // schema); -1: none.
  int first_held_ = -1;
  bool empty_piece_ = false;
  // Fields 1-8 and 13-20 of Microbatch: serialized by protobuf around the
  // gathered arrays (fields 9-12), which keeps the field-number order;
  // field 21 (ragged token fields) follows the tail.
  v1::Microbatch head_;
  v1::Microbatch tail_;
  std::vector<ArrayField> arrays_;
  RaggedTokenFieldsEncoder ragged_;
  size_t encoded_size_ = 0;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_DELIVERY_MICROBATCH_ENCODER_H_
