// One pool's open samples (../shared/spec/lifecycle.md section 5): samples
// sent in pieces that no piece has sealed yet, by id. An open sample is
// mutable and kept apart from the sealed ones, so a piece costs time and
// memory in proportion to what it carries, not to what the sample holds.
//
// Not thread-safe: SampleStore keeps one in each pool and calls it only
// under its mutex. It keeps the pieces alone: the store keeps the groups
// the samples join, charges the bytes each call reports to its limits, and
// takes a sealed sample into its free set.
#ifndef ROLLPACK_SERVER_STORE_OPEN_SAMPLES_H_
#define ROLLPACK_SERVER_STORE_OPEN_SAMPLES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "scheduler/model_spec.h"
#include "server/store/field_schema.h"
#include "server/store/scalar_annotation.h"
#include "server/store/stored_sample.h"

namespace rollpack {

// Where an open sample stands, for a producer that extends it without
// keeping its own copy (the capture port's sessions).
struct OpenSampleState {
  std::vector<int32_t> tokens;
  // Where its routing rows end; -1: none yet.
  int64_t rows_end = -1;
  int32_t pieces = 0;
  std::map<std::string, double> scalars;
  // Its token fields' dtypes and trailing shapes: every later piece
  // carries the same.
  std::map<std::string, FieldSchema> token_fields;
  // Its ragged fields' names: every later piece with tokens carries them.
  std::vector<std::string> ragged_fields;
};

class OpenSamples {
 public:
  // SampleStore::MemoryBytes, the unit of the store's limits: it counts the
  // store's index entries too, which only the store knows.
  using MemoryBytesFn = int64_t (*)(const StoredSample& sample);

  struct Entry {
    // The pieces so far, in the whole-sample form a sealed sample has.
    StoredSample sample;
    // Where the stored routed-expert rows end; -1 while no piece carried any.
    int64_t rows_end = -1;
    // Per MoE layer: some covered row has a nonzero id; and how many rows
    // are covered (the all-zero-layer rule, checked at seal).
    std::vector<uint8_t> layer_nonzero;
    int64_t covered_rows = 0;
  };
  using Map = absl::flat_hash_map<std::string, Entry>;

  // What a piece message, or an open sample's snapshot, does.
  enum class Action { kDuplicate, kOpen, kExtend, kRestoreOpen };
  struct Plan {
    Action action = Action::kDuplicate;
    // Memory the piece adds.
    int64_t new_bytes = 0;
    // The piece seals the sample: it leaves the open ones. Only a kExtend
    // seals (a piece 0 that would is a whole sample, never a piece).
    bool seals = false;
  };
  struct Applied {
    // Memory the piece added: the plan's new_bytes (the buffers grow as
    // the plan counted them), and the scalars a sealing piece adds, which
    // the plan leaves out.
    int64_t added_bytes = 0;
    // The sample, out of the open ones, when the piece sealed it.
    std::optional<StoredSample> sealed;
  };

  explicit OpenSamples(MemoryBytesFn memory_bytes) : memory_bytes_(memory_bytes) {}

  // Whether the store takes `sample` through here: a piece message, or an
  // open sample's snapshot (a compacted log).
  static bool IsPieceOrOpen(const StoredSample& sample) {
    return sample.piece_message.has_value() ||
           (!sample.pieces.empty() && sample.pieces.back().partial);
  }

  bool contains(const std::string& sample_id) const { return open_.contains(sample_id); }
  bool empty() const { return open_.empty(); }
  size_t size() const { return open_.size(); }
  // Every open sample, in no particular order.
  Map::const_iterator begin() const { return open_.begin(); }
  Map::const_iterator end() const { return open_.end(); }
  // The open sample `sample_id` so far, or null.
  const StoredSample* Find(const std::string& sample_id) const;

  // What storing `piece` (of pool `pool_name`, holding `model`) would do,
  // or the refusal (lifecycle.md section 5); changes nothing. `sealed`: the
  // pool's sealed sample of the same id, or null; `pending`: the entry for
  // the sample of an annotation prepared but not committed, or null (a
  // sealing piece may not set a scalar it sets).
  absl::StatusOr<Plan> PlanPiece(const std::string& pool_name, const ModelSpec& model,
                                 const StoredSample& piece, const StoredSample* sealed,
                                 const ScalarAnnotation* pending) const;
  // Stores a piece as PlanPiece planned it against this state.
  Applied ApplyPiece(const Plan& plan, StoredSample piece, const ModelSpec& model);
  // Adds the `scalars` the open sample `sample_id` lacks as later scalars
  // (AnnotateSamples), with `logged_bytes` of the record that holds them;
  // the memory it added. The sample must be open.
  int64_t AddScalars(const std::string& sample_id, const std::map<std::string, double>& scalars,
                     int64_t logged_bytes);
  // Deletes the open sample; the memory it held (0 when it is not open).
  int64_t Erase(const std::string& sample_id);
  // Where the open sample stands; nullopt when it is not open.
  std::optional<OpenSampleState> State(const std::string& sample_id) const;

 private:
  MemoryBytesFn memory_bytes_;
  Map open_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_OPEN_SAMPLES_H_
