#include "server/store/step_activity.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"

namespace rollpack {

StepActivity::Entry& StepActivity::At(const std::string& step_id, absl::Time now) {
  auto [it, inserted] = entries_.try_emplace(step_id);
  if (inserted) {
    it->second.first_seen = now;
    it->second.generation = next_generation_++;
  }
  return it->second;
}

void StepActivity::StepCreated(const std::string& step_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  entries_.erase(step_id);
  At(step_id, now);
}

uint64_t StepActivity::StreamStarted(const std::string& step_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Entry& e = At(step_id, now);
  e.streams_started++;
  e.streams_open++;
  e.last_stream = now;
  return e.generation;
}

void StepActivity::StreamEnded(const std::string& step_id, uint64_t token, absl::Time now) {
  absl::MutexLock lock(&mu_);
  // A stream that outlives its step (released, maybe created again under
  // the same id) ends without touching what came after.
  auto it = entries_.find(step_id);
  if (it == entries_.end() || it->second.generation != token) return;
  it->second.streams_open = std::max(0, it->second.streams_open - 1);
  it->second.last_stream = now;
}

void StepActivity::StepReleased(const std::string& step_id) {
  absl::MutexLock lock(&mu_);
  entries_.erase(step_id);
}

void StepActivity::Retain(const std::vector<std::string>& live, absl::Time cutoff) {
  absl::flat_hash_set<std::string> keep(live.begin(), live.end());
  absl::MutexLock lock(&mu_);
  absl::erase_if(entries_, [&](const auto& kv) {
    const Entry& e = kv.second;
    return !keep.contains(kv.first) && e.streams_open == 0 &&
           std::max(e.first_seen, e.last_stream) < cutoff;
  });
}

StepActivity::Entry StepActivity::Get(const std::string& step_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  return At(step_id, now);
}

bool StepActivity::IsIdle(const Entry& e, absl::Time now, absl::Duration ttl) const {
  return e.streams_open == 0 && now - std::max(e.first_seen, e.last_stream) >= ttl;
}

std::vector<std::string> StepActivity::Idle(const std::vector<std::string>& live, absl::Time now,
                                            absl::Duration ttl) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> idle;
  for (const std::string& id : live) {
    if (IsIdle(At(id, now), now, ttl)) idle.push_back(id);
  }
  return idle;
}

bool StepActivity::StillIdle(const std::string& step_id, absl::Time now, absl::Duration ttl) {
  absl::MutexLock lock(&mu_);
  return IsIdle(At(step_id, now), now, ttl);
}

}  // namespace rollpack
