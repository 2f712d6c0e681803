#include "server/cluster/etcd_reachability.h"

#include <algorithm>

namespace rollpack {

EtcdReachability::Change EtcdReachability::Observe(absl::Time started, absl::Time ended,
                                                   bool failed, absl::string_view error) {
  absl::MutexLock lock(&mu_);
  if (!failed) {
    failing_since_ = absl::InfinitePast();
    if (state_.reachable) return Change::kNone;
    state_.reachable = true;
    state_.last_outage = std::max(ended - state_.unreachable_since, absl::ZeroDuration());
    state_.unreachable_since = absl::InfinitePast();
    return Change::kRegained;
  }
  state_.last_error = std::string(error);
  if (failing_since_ == absl::InfinitePast()) failing_since_ = started;
  // Attempts of several threads overlap: the run began with the earliest.
  failing_since_ = std::min(failing_since_, started);
  if (!state_.reachable || ended - failing_since_ < grace_) return Change::kNone;
  state_.reachable = false;
  state_.unreachable_since = failing_since_;
  ++state_.outages;
  return Change::kLost;
}

EtcdReachability::State EtcdReachability::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

bool EtcdReachability::reachable() const {
  absl::MutexLock lock(&mu_);
  return state_.reachable;
}

absl::Duration EtcdReachability::UnreachableFor(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  if (state_.reachable) return absl::ZeroDuration();
  return std::max(now - state_.unreachable_since, absl::ZeroDuration());
}

}  // namespace rollpack
