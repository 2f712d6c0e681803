// R2 (docs/layout.md section 11) on one server: the live steps' upload
// stages, their memory counted against the store's limit, and the commit
// that hands a complete stage's routing to the store. Thread-safe.
#ifndef ROLLPACK_SERVER_STORE_RECOMPUTE_UPLOADS_H_
#define ROLLPACK_SERVER_STORE_RECOMPUTE_UPLOADS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "scheduler/layout.h"
#include "scheduler/layout_scatter.h"
#include "server/store/recompute_routing.h"
#include "server/store/sample_store.h"

namespace rollpack {

struct RoutingCommitResult {
  int32_t samples = 0;
  int64_t tokens = 0;
  int64_t stored_bytes = 0;
};

// A cluster member's share of a step whose samples it holds
// (docs/recompute.md, "In a cluster").
struct HeldStep {
  // The plan, rebuilt from the step's record.
  std::shared_ptr<const Step> step;
  // Owner of each of the step's sequences; this member is `self`.
  std::shared_ptr<const std::vector<int32_t>> owner;
  int self = -1;
  // The attempt of this member's hold (SampleStore::HoldAttempt).
  int64_t attempt = 0;
};

class RecomputeUploads {
 public:
  explicit RecomputeUploads(SampleStore* store) : store_(store) {}
  ~RecomputeUploads();
  RecomputeUploads(const RecomputeUploads&) = delete;
  RecomputeUploads& operator=(const RecomputeUploads&) = delete;

  // RecomputeRoutingStage::Place on the step's stage, made at its first
  // upload: NOT_FOUND when the step is not live; RESOURCE_EXHAUSTED when
  // the stage does not fit under the store's memory limit; FAILED_PRECONDITION
  // for a dense model (nothing to record).
  absl::StatusOr<RoutingUploadResult> Upload(const std::string& step_id,
                                             const RankCoords& coords, int microbatch,
                                             const UploadedRouting& upload);
  // Hands the complete stage to the store (SampleStore::SetRecomputeRouting)
  // and drops it. FAILED_PRECONDITION naming the first gap (the stage stays:
  // the missing uploads may still come) or when nothing was uploaded. A
  // commit of a step already committed answers as the first one did (a
  // retry whose answer was lost); uploads to it are then refused.
  absl::StatusOr<RoutingCommitResult> Commit(const std::string& step_id);
  // The same for a cluster member's share of a step (its hold of the
  // samples, not a step of its own): `upload` carries only the rows of
  // held.self's sequences; stages live while the hold of that attempt does.
  absl::StatusOr<RoutingUploadResult> UploadHeld(const HeldStep& held, const RankCoords& coords,
                                                 int microbatch, const UploadedRouting& upload);
  // The first phase of a cluster commit: what CommitHeld would store, or its
  // FAILED_PRECONDITION naming the first gap. Changes nothing.
  absl::StatusOr<RoutingCommitResult> CheckHeld(const HeldStep& held);
  // The second: SampleStore::SetHeldRecomputeRouting with the stage.
  absl::StatusOr<RoutingCommitResult> CommitHeld(const HeldStep& held);
  // Bytes the stages hold.
  int64_t staged_bytes() const;
  // Drops the stages of steps no longer live (released, expired, or a new
  // step with the same id), giving their memory back. The directory calls it
  // after every release; Upload and Commit call it too.
  void DropStale();

 private:
  struct Staged {
    std::shared_ptr<RecomputeRoutingStage> stage;
    // A cluster member's hold: its attempt (0: a step of this server's own).
    int64_t attempt = 0;
  };
  // NOT_FOUND naming both attempts unless this member holds `step_id`'s
  // samples for `attempt`.
  absl::Status HeldLive(const std::string& step_id, int64_t attempt) const;
  // Whether the step (attempt 0) or hold (attempt) `step` stands for is live.
  bool IsLive(const std::string& step_id, const Step* step, int64_t attempt) const;
  // The step's stage, made (and its memory reserved) at its first upload;
  // FAILED_PRECONDITION for a dense model or a step already committed.
  absl::StatusOr<std::shared_ptr<RecomputeRoutingStage>> StageFor(
      const std::shared_ptr<const Step>& step, const HeldStep* held)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The committed answer, or the complete stage's routing (not yet stored).
  absl::StatusOr<std::shared_ptr<RecomputeRoutingStage>> CompleteStage(
      const std::string& step_id, int64_t attempt, const HeldStep* held,
      std::optional<RoutingCommitResult>* committed);
  void MarkCommitted(const std::string& step_id, const std::shared_ptr<RecomputeRoutingStage>& stage,
                     int64_t attempt, const RoutingCommitResult& result);
  void DropStaleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Drop(const std::string& step_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  SampleStore* const store_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Staged> stages_ ABSL_GUARDED_BY(mu_);
  // Steps whose routing was committed, while they live.
  struct Committed {
    std::weak_ptr<const Step> step;
    int64_t attempt = 0;
    RoutingCommitResult result;
  };
  absl::flat_hash_map<std::string, Committed> committed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_RECOMPUTE_UPLOADS_H_
