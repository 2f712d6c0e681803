#include "server/store/step_activity.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"

namespace rollpack {

StepActivity::Entry& StepActivity::At(const std::string& step_id, absl::Time now) {
  auto [it, inserted] = entries_.try_emplace(step_id);
  if (inserted) it->second.first_seen = now;
  return it->second;
}

void StepActivity::StepCreated(const std::string& step_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  At(step_id, now);
}

void StepActivity::StreamStarted(const std::string& step_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Entry& e = At(step_id, now);
  e.streams_started++;
  e.streams_open++;
  e.last_stream = now;
}

void StepActivity::StreamEnded(const std::string& step_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  // A stream that outlives its step's release (it keeps its data) ends
  // after the entry is gone: nothing to record.
  auto it = entries_.find(step_id);
  if (it == entries_.end()) return;
  it->second.streams_open = std::max(0, it->second.streams_open - 1);
  it->second.last_stream = now;
}

void StepActivity::StepReleased(const std::string& step_id) {
  absl::MutexLock lock(&mu_);
  entries_.erase(step_id);
}

void StepActivity::Retain(const std::vector<std::string>& live) {
  absl::flat_hash_set<std::string> keep(live.begin(), live.end());
  absl::MutexLock lock(&mu_);
  absl::erase_if(entries_, [&](const auto& kv) { return !keep.contains(kv.first); });
}

StepActivity::Entry StepActivity::Get(const std::string& step_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  return At(step_id, now);
}

std::vector<std::string> StepActivity::Idle(const std::vector<std::string>& live, absl::Time now,
                                            absl::Duration ttl) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> idle;
  for (const std::string& id : live) {
    const Entry& e = At(id, now);
    if (e.streams_open > 0) continue;
    if (now - std::max(e.first_seen, e.last_stream) >= ttl) idle.push_back(id);
  }
  return idle;
}

}  // namespace rollpack
