// R2 (docs/layout.md section 11): the routing trainer ranks record in a
// step's recompute forward, put back into the step's samples as it arrives,
// one micro-batch of one rank at a time, until a commit makes it the
// samples' recompute routing. Thread-safe.
#ifndef ROLLPACK_SERVER_STORE_RECOMPUTE_ROUTING_H_
#define ROLLPACK_SERVER_STORE_RECOMPUTE_ROUTING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "scheduler/layout.h"
#include "scheduler/layout_scatter.h"
#include "server/store/step.h"

namespace rollpack {

struct RoutingUploadResult {
  // Real-token rows of the upload (padding rows are dropped).
  int64_t rows = 0;
  // Of them, rows every entry of which an earlier upload had placed.
  int64_t repeated_rows = 0;
  // (token, layer) entries of the step still missing after this upload.
  int64_t missing_entries = 0;
};

// The uploads of one step. Memory: for every sample, its routing in the
// store's compact form plus one coverage byte per (token, layer).
class RecomputeRoutingStage {
 public:
  // With `owner` (a cluster member's stage: docs/cluster.md), only the
  // step's sequences owner[i] == self: uploads carry only their rows
  // (UploadedRouting::owner), and completeness is theirs.
  explicit RecomputeRoutingStage(std::shared_ptr<const Step> step,
                                 std::shared_ptr<const std::vector<int32_t>> owner = nullptr,
                                 int self = -1);

  const Step& step() const { return *step_; }
  const std::shared_ptr<const Step>& shared_step() const { return step_; }
  // Bytes this stage holds (fixed at construction).
  int64_t MemoryBytes() const { return memory_bytes_; }

  // The checks of Place that need no stage: every entry's ids in [0, E) and
  // distinct (INVALID_ARGUMENT naming the sample, token and layer).
  // Requires CheckUploadShape to pass.
  static absl::Status CheckIds(const Step& step, const RankMicrobatchLayout& rank,
                               const UploadedRouting& upload);

  // Places rank `coords`' upload for micro-batch `microbatch`, all or
  // nothing: INVALID_ARGUMENT for coordinates or a micro-batch outside the
  // step, a shape other than the rank's replay_experts, an id outside
  // [0, E) or repeated within a (token, layer); FAILED_PRECONDITION naming
  // the sample, token, layer and both values when an entry was placed
  // before with other ids. Nothing changes on error. An owner's stage reads
  // `upload` as carrying only its sequences' rows (whatever upload.owner).
  absl::StatusOr<RoutingUploadResult> Place(const RankCoords& coords, int microbatch,
                                            const UploadedRouting& upload);

  // Every sample's routing in the store's compact form [n, stored layers, K]
  // (in the step's sample order; empty for a sequence another member owns),
  // when every entry of every real token is placed; else FAILED_PRECONDITION
  // naming the first missing sample, token and layer and how many entries
  // are missing. Changes nothing.
  absl::StatusOr<std::vector<std::string>> Routing() const;
  // Routing()'s verdict without the copy.
  absl::Status CheckComplete() const;
  // Whether the stage covers the step's sequence i.
  bool Owns(size_t i) const { return owner_ == nullptr || (*owner_)[i] == self_; }

 private:
  absl::StatusOr<RoutingUploadResult> PlaceChecked(const RankMicrobatchLayout& rank,
                                                   const UploadedRouting& upload);
  absl::Status CheckCompleteLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<const Step> step_;
  const std::shared_ptr<const std::vector<int32_t>> owner_;
  const int self_;
  const int topk_;
  const int num_experts_;
  const int id_bytes_;
  const std::vector<int> layer_ids_;  // global id of each stored layer
  int64_t memory_bytes_ = 0;

  mutable absl::Mutex mu_;
  // Per sample: ids [n, stored layers, K] and placed flags [n, stored layers].
  std::vector<std::string> ids_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<uint8_t>> placed_ ABSL_GUARDED_BY(mu_);
  int64_t missing_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_RECOMPUTE_ROUTING_H_
