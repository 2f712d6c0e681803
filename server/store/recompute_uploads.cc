#include "server/store/recompute_uploads.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace rollpack {

RecomputeUploads::~RecomputeUploads() {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, stage] : stages_) store_->ReleaseMemory(stage->MemoryBytes());
}

int64_t RecomputeUploads::staged_bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t bytes = 0;
  for (const auto& [id, stage] : stages_) bytes += stage->MemoryBytes();
  return bytes;
}

void RecomputeUploads::Drop(const std::string& step_id) {
  auto it = stages_.find(step_id);
  if (it == stages_.end()) return;
  store_->ReleaseMemory(it->second->MemoryBytes());
  stages_.erase(it);
}

void RecomputeUploads::DropStale() {
  absl::MutexLock lock(&mu_);
  DropStaleLocked();
}

void RecomputeUploads::DropStaleLocked() {
  std::vector<std::string> stale;
  for (const auto& [id, stage] : stages_) {
    absl::StatusOr<std::shared_ptr<const Step>> live = store_->GetStep(id);
    if (!live.ok() || live->get() != &stage->step()) stale.push_back(id);
  }
  for (const std::string& id : stale) Drop(id);
  for (auto it = committed_.begin(); it != committed_.end();) {
    absl::StatusOr<std::shared_ptr<const Step>> live = store_->GetStep(it->first);
    const std::shared_ptr<const Step> committed = it->second.step.lock();
    if (!live.ok() || committed == nullptr || live->get() != committed.get()) {
      committed_.erase(it++);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<RoutingUploadResult> RecomputeUploads::Upload(const std::string& step_id,
                                                             const RankCoords& coords,
                                                             int microbatch,
                                                             const UploadedRouting& upload) {
  std::shared_ptr<RecomputeRoutingStage> stage;
  {
    absl::MutexLock lock(&mu_);
    DropStaleLocked();
    // Read under the lock, after the stale stages went: a step released and
    // created again with the same id meanwhile gets a stage of its own.
    ASSIGN_OR_RETURN(std::shared_ptr<const Step> step, store_->GetStep(step_id));
    if (step->model.is_dense()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step \"", step_id, "\": pool \"", step->pool,
          "\" holds a dense model (num_experts 0): there is no routing to record"));
    }
    if (committed_.contains(step_id)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step \"", step_id, "\": its recorded routing was committed; uploads go before the "
          "commit (a new recompute forward: a new step)"));
    }
    auto it = stages_.find(step_id);
    if (it != stages_.end()) {
      stage = it->second;
    } else {
      // Reserve before allocating, so a step too large for the limit
      // allocates nothing.
      const int64_t layers =
          static_cast<int64_t>(StoredRoutingLayerIds(step->layout.pipeline()).size());
      int64_t tokens = 0;
      for (int64_t n : step->layout.lengths()) tokens += n;
      const int64_t bytes = tokens * layers * (step->model.topk * step->model.stored_id_bytes() + 1);
      RETURN_IF_ERROR(store_->ReserveMemory(
          bytes, absl::StrCat("recorded routing of step \"", step_id, "\"")));
      stage = std::make_shared<RecomputeRoutingStage>(step);
      stages_[step_id] = stage;
    }
  }
  return stage->Place(coords, microbatch, upload);
}

absl::StatusOr<RoutingCommitResult> RecomputeUploads::Commit(const std::string& step_id) {
  std::shared_ptr<RecomputeRoutingStage> stage;
  {
    absl::MutexLock lock(&mu_);
    DropStaleLocked();
    ASSIGN_OR_RETURN(std::shared_ptr<const Step> step, store_->GetStep(step_id));
    if (auto done = committed_.find(step_id); done != committed_.end()) {
      return done->second.result;  // a retried commit (its answer was lost)
    }
    auto it = stages_.find(step_id);
    if (it == stages_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step \"", step_id, "\": no recorded routing was uploaded (Trainer.UploadRouting, "
          "one call per micro-batch and rank)"));
    }
    stage = it->second;
  }
  // Copied without the lock (uploads of other steps go on); the stage is
  // complete, so nothing changes it meanwhile but a refused upload.
  ASSIGN_OR_RETURN(std::vector<std::string> routing, stage->Routing());
  const std::shared_ptr<const Step>& step = stage->shared_step();
  RoutingCommitResult result;
  result.samples = static_cast<int32_t>(routing.size());
  for (int64_t n : step->layout.lengths()) result.tokens += n;
  // The store checks that `step` is still the live step of that id (not
  // released and created again meanwhile).
  ASSIGN_OR_RETURN(result.stored_bytes, store_->SetRecomputeRouting(step, std::move(routing)));
  absl::MutexLock lock(&mu_);
  auto it = stages_.find(step_id);
  if (it != stages_.end() && it->second == stage) Drop(step_id);
  committed_[step_id] = Committed{step, result};
  return result;
}

}  // namespace rollpack
