#include "server/store/recompute_uploads.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace rollpack {

RecomputeUploads::~RecomputeUploads() {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, staged] : stages_) store_->ReleaseMemory(staged.stage->MemoryBytes());
}

int64_t RecomputeUploads::staged_bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t bytes = 0;
  for (const auto& [id, staged] : stages_) bytes += staged.stage->MemoryBytes();
  return bytes;
}

void RecomputeUploads::Drop(const std::string& step_id) {
  auto it = stages_.find(step_id);
  if (it == stages_.end()) return;
  store_->ReleaseMemory(it->second.stage->MemoryBytes());
  stages_.erase(it);
}

void RecomputeUploads::DropStale() {
  absl::MutexLock lock(&mu_);
  DropStaleLocked();
}

absl::Status RecomputeUploads::HeldLive(const std::string& step_id, int64_t attempt) const {
  const int64_t held = store_->HoldAttempt(step_id);
  if (held == attempt) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(
      "step \"", step_id, "\" holds no samples here for attempt ", attempt,
      held == 0 ? " (no hold: released, or never taken)" : absl::StrCat(" (held for attempt ", held, ")")));
}

bool RecomputeUploads::IsLive(const std::string& step_id, const Step* step,
                              int64_t attempt) const {
  if (attempt != 0) return store_->HoldAttempt(step_id) == attempt;
  absl::StatusOr<std::shared_ptr<const Step>> live = store_->GetStep(step_id);
  return live.ok() && step != nullptr && live->get() == step;
}

void RecomputeUploads::DropStaleLocked() {
  std::vector<std::string> stale;
  for (const auto& [id, staged] : stages_) {
    if (!IsLive(id, &staged.stage->step(), staged.attempt)) stale.push_back(id);
  }
  for (const std::string& id : stale) Drop(id);
  for (auto it = committed_.begin(); it != committed_.end();) {
    const std::shared_ptr<const Step> committed = it->second.step.lock();
    if (!IsLive(it->first, committed.get(), it->second.attempt)) {
      committed_.erase(it++);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<std::shared_ptr<RecomputeRoutingStage>> RecomputeUploads::StageFor(
    const std::shared_ptr<const Step>& step, const HeldStep* held) {
  const std::string& step_id = step->step_id;
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
  if (auto it = stages_.find(step_id); it != stages_.end()) return it->second.stage;
  // Reserve before allocating, so a step too large for the limit allocates
  // nothing.
  const int64_t layers = static_cast<int64_t>(StoredRoutingLayerIds(step->layout.pipeline()).size());
  int64_t tokens = 0;
  const absl::Span<const int64_t> lengths = step->layout.lengths();
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (held == nullptr || (*held->owner)[i] == held->self) tokens += lengths[i];
  }
  const int64_t bytes = tokens * layers * (step->model.topk * step->model.stored_id_bytes() + 1);
  RETURN_IF_ERROR(
      store_->ReserveMemory(bytes, absl::StrCat("recorded routing of step \"", step_id, "\"")));
  auto stage = held == nullptr
                   ? std::make_shared<RecomputeRoutingStage>(step)
                   : std::make_shared<RecomputeRoutingStage>(step, held->owner, held->self);
  stages_[step_id] = Staged{stage, held == nullptr ? 0 : held->attempt};
  return stage;
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
    ASSIGN_OR_RETURN(stage, StageFor(step, nullptr));
  }
  return stage->Place(coords, microbatch, upload);
}

absl::StatusOr<RoutingUploadResult> RecomputeUploads::UploadHeld(const HeldStep& held,
                                                                 const RankCoords& coords,
                                                                 int microbatch,
                                                                 const UploadedRouting& upload) {
  const std::string& step_id = held.step->step_id;
  std::shared_ptr<RecomputeRoutingStage> stage;
  {
    absl::MutexLock lock(&mu_);
    DropStaleLocked();
    RETURN_IF_ERROR(HeldLive(step_id, held.attempt));
    ASSIGN_OR_RETURN(stage, StageFor(held.step, &held));
  }
  return stage->Place(coords, microbatch, upload);
}

absl::StatusOr<std::shared_ptr<RecomputeRoutingStage>> RecomputeUploads::CompleteStage(
    const std::string& step_id, int64_t attempt, const HeldStep* held,
    std::optional<RoutingCommitResult>* committed) {
  std::shared_ptr<RecomputeRoutingStage> stage;
  {
    absl::MutexLock lock(&mu_);
    DropStaleLocked();
    if (held != nullptr) RETURN_IF_ERROR(HeldLive(step_id, attempt));
    if (auto done = committed_.find(step_id); done != committed_.end()) {
      *committed = done->second.result;  // a retried commit (its answer was lost)
      return nullptr;
    }
    auto it = stages_.find(step_id);
    if (it == stages_.end()) {
      const Step* step_of_held = held != nullptr ? held->step.get() : nullptr;
      if (step_of_held != nullptr && !step_of_held->model.is_dense()) {
        // Name a gap as a stage would: this member's first sample.
        const Step& step = *step_of_held;
        for (size_t i = 0; i < step.sample_ids.size(); ++i) {
          if ((*held->owner)[i] != held->self) continue;
          return absl::FailedPreconditionError(absl::StrCat(
              "recorded routing of step \"", step_id, "\" is incomplete: sample \"",
              step.sample_ids[i], "\" token 0 layer ",
              StoredRoutingLayerIds(step.layout.pipeline()).front(),
              " was not uploaded (no upload reached this member's samples; every rank uploads "
              "every micro-batch it received)"));
        }
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "step \"", step_id, "\": no recorded routing was uploaded (Trainer.UploadRouting, "
          "one call per micro-batch and rank)"));
    }
    stage = it->second.stage;
  }
  return stage;
}

void RecomputeUploads::MarkCommitted(const std::string& step_id,
                                     const std::shared_ptr<RecomputeRoutingStage>& stage,
                                     int64_t attempt, const RoutingCommitResult& result) {
  absl::MutexLock lock(&mu_);
  auto it = stages_.find(step_id);
  if (it != stages_.end() && it->second.stage == stage) Drop(step_id);
  committed_[step_id] = Committed{stage->shared_step(), attempt, result};
}

namespace {

// The stage's routing of the sequences it covers, with their ids, and the
// commit's counts (stored_bytes left 0).
struct OwnedRouting {
  std::vector<std::string> sample_ids;
  std::vector<std::string> routing;
  RoutingCommitResult result;
};

absl::StatusOr<OwnedRouting> Owned(const RecomputeRoutingStage& stage) {
  ASSIGN_OR_RETURN(std::vector<std::string> routing, stage.Routing());
  const Step& step = stage.step();
  OwnedRouting owned;
  for (size_t i = 0; i < routing.size(); ++i) {
    if (!stage.Owns(i)) continue;
    owned.sample_ids.push_back(step.sample_ids[i]);
    owned.routing.push_back(std::move(routing[i]));
    owned.result.tokens += step.layout.lengths()[i];
  }
  owned.result.samples = static_cast<int32_t>(owned.sample_ids.size());
  return owned;
}

}  // namespace

absl::StatusOr<RoutingCommitResult> RecomputeUploads::Commit(const std::string& step_id) {
  std::optional<RoutingCommitResult> committed;
  {
    absl::MutexLock lock(&mu_);
    DropStaleLocked();
    RETURN_IF_ERROR(store_->GetStep(step_id).status());
  }
  ASSIGN_OR_RETURN(std::shared_ptr<RecomputeRoutingStage> stage,
                   CompleteStage(step_id, 0, nullptr, &committed));
  if (committed.has_value()) return *committed;
  // Copied without the lock (uploads of other steps go on); the stage is
  // complete, so nothing changes it meanwhile but a refused upload.
  ASSIGN_OR_RETURN(OwnedRouting owned, Owned(*stage));
  // The store checks that the step is still the live step of that id (not
  // released and created again meanwhile).
  ASSIGN_OR_RETURN(owned.result.stored_bytes,
                   store_->SetRecomputeRouting(stage->shared_step(), std::move(owned.routing)));
  MarkCommitted(step_id, stage, 0, owned.result);
  return owned.result;
}

absl::StatusOr<RoutingCommitResult> RecomputeUploads::CheckHeld(const HeldStep& held) {
  std::optional<RoutingCommitResult> committed;
  ASSIGN_OR_RETURN(std::shared_ptr<RecomputeRoutingStage> stage,
                   CompleteStage(held.step->step_id, held.attempt, &held, &committed));
  if (committed.has_value()) return *committed;
  RETURN_IF_ERROR(stage->CheckComplete());
  // What the commit would store, counted without copying the stage.
  RoutingCommitResult result;
  const Step& step = stage->step();
  const ModelSpec& model = step.model;
  for (size_t i = 0; i < step.sample_ids.size(); ++i) {
    if (!stage->Owns(i)) continue;
    ++result.samples;
    result.tokens += step.layout.lengths()[i];
  }
  result.stored_bytes =
      result.tokens * model.stored_layers() * model.topk * model.stored_id_bytes();
  return result;
}

absl::StatusOr<RoutingCommitResult> RecomputeUploads::CommitHeld(const HeldStep& held) {
  const std::string& step_id = held.step->step_id;
  std::optional<RoutingCommitResult> committed;
  ASSIGN_OR_RETURN(std::shared_ptr<RecomputeRoutingStage> stage,
                   CompleteStage(step_id, held.attempt, &held, &committed));
  if (committed.has_value()) return *committed;
  ASSIGN_OR_RETURN(OwnedRouting owned, Owned(*stage));
  ASSIGN_OR_RETURN(owned.result.stored_bytes,
                   store_->SetHeldRecomputeRouting(step_id, held.attempt, owned.sample_ids,
                                                   std::move(owned.routing)));
  MarkCommitted(step_id, stage, held.attempt, owned.result);
  return owned.result;
}

}  // namespace rollpack
