#include "server/store/step_holds.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/store/log_records.h"

namespace rollpack {

const StepHolds::Hold* StepHolds::Find(const std::string& step_id) const {
  auto it = holds_.find(step_id);
  return it == holds_.end() ? nullptr : &it->second;
}

absl::StatusOr<const StepHolds::Hold*> StepHolds::Get(const std::string& step_id,
                                                      int64_t attempt) const {
  const Hold* hold = Find(step_id);
  if (hold == nullptr || (attempt != 0 && hold->attempt != attempt)) {
    return absl::NotFoundError(absl::StrCat("step \"", step_id, "\" holds no samples here",
                                            attempt != 0 ? " for this attempt" : ""));
  }
  return hold;
}

void StepHolds::Add(const std::string& step_id, Hold hold) {
  holds_[step_id] = std::move(hold);
}

absl::Status StepHolds::Confirm(const std::string& step_id) {
  auto it = holds_.find(step_id);
  if (it == holds_.end()) {
    return absl::NotFoundError(absl::StrCat("step \"", step_id, "\" holds no samples here"));
  }
  it->second.confirmed = true;
  return absl::OkStatus();
}

int64_t StepHolds::Attempt(const std::string& step_id) const {
  const Hold* hold = Find(step_id);
  return hold == nullptr ? 0 : hold->attempt;
}

std::vector<std::string> StepHolds::Unconfirmed(absl::Time cutoff) const {
  std::vector<std::string> ids;
  for (const auto& [id, hold] : holds_) {
    if (!hold.confirmed && hold.held_at <= cutoff) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<std::string> StepHolds::Ids(const std::string& pool) const {
  std::vector<std::string> ids;
  for (const auto& [id, hold] : holds_) {
    if (pool.empty() || hold.pool == pool) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::string StepHolds::HolderOf(const std::string& pool, const std::string& sample_id) const {
  for (const auto& [step_id, hold] : holds_) {
    if (hold.pool != pool) continue;
    const auto& ids = hold.sample_ids;
    if (std::find(ids.begin(), ids.end(), sample_id) != ids.end()) return step_id;
  }
  return "";
}

absl::StatusOr<std::vector<size_t>> StepHolds::Positions(
    const std::string& step_id, absl::Span<const std::string> sample_ids) const {
  ASSIGN_OR_RETURN(const Hold* hold, Get(step_id));
  absl::flat_hash_map<absl::string_view, size_t> index;
  index.reserve(hold->sample_ids.size());
  for (size_t i = 0; i < hold->sample_ids.size(); ++i) index[hold->sample_ids[i]] = i;
  std::vector<size_t> positions;
  positions.reserve(sample_ids.size());
  for (const std::string& id : sample_ids) {
    auto at = index.find(id);
    if (at == index.end()) {
      return absl::NotFoundError(
          absl::StrCat("sample \"", id, "\" is not held here for step \"", step_id, "\""));
    }
    positions.push_back(at->second);
  }
  return positions;
}

absl::StatusOr<std::vector<std::shared_ptr<const std::string>>> StepHolds::RecomputeRouting(
    const std::string& step_id, absl::Span<const std::string> sample_ids) const {
  ASSIGN_OR_RETURN(const Hold* hold, Get(step_id));
  if (!hold->recompute) {
    return absl::FailedPreconditionError(
        absl::StrCat("step \"", step_id, "\" replays rollout routing, not recompute routing"));
  }
  ASSIGN_OR_RETURN(std::vector<size_t> positions, Positions(step_id, sample_ids));
  std::vector<std::shared_ptr<const std::string>> routing;
  routing.reserve(positions.size());
  for (size_t at : positions) routing.push_back(hold->recompute_routing[at]);
  return routing;
}

std::string StepHolds::Record(const std::string& step_id, const Hold& hold) {
  return EncodeHoldSamples(step_id, hold.pool, hold.sample_ids, hold.coordinator, hold.attempt,
                           hold.reuse_samples, hold.recompute);
}

}  // namespace rollpack
