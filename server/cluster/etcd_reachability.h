// Whether this member reaches etcd, from the outcome of every attempt the
// etcd client makes (docs/cluster.md, "When etcd is away"): what the metrics
// rollpack_cluster_etcd_*, the "etcd unreachable" / "reachable again" log
// lines and the Scheduler's health status follow.
//
// One failed attempt is no outage: etcd fails over (a leader election, an
// endpoint gone) within a second or two and the client retries. etcd is
// unreachable once attempts have failed, with none succeeding, for `grace`
// (the client's per-attempt deadline: a stalled etcd is unreachable when its
// first attempt times out, a stopped one after `grace` of refused
// connections), and reachable again at the first attempt that succeeds.
#ifndef ROLLPACK_SERVER_CLUSTER_ETCD_REACHABILITY_H_
#define ROLLPACK_SERVER_CLUSTER_ETCD_REACHABILITY_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rollpack {

class EtcdReachability {
 public:
  // What an attempt changed.
  enum class Change { kNone, kLost, kRegained };
  struct State {
    bool reachable = true;
    // Since when etcd has not answered (InfinitePast while reachable): the
    // start of the first failed attempt of the outage.
    absl::Time unreachable_since = absl::InfinitePast();
    // Transitions reachable -> unreachable so far.
    int64_t outages = 0;
    // The error of the last failed attempt ("" when none failed yet).
    std::string last_error;
    // How long the last outage lasted (set when it ended).
    absl::Duration last_outage = absl::ZeroDuration();
  };

  explicit EtcdReachability(absl::Duration grace) : grace_(grace) {}

  // An attempt that ran from `started` to `ended`; `failed`: etcd did not
  // answer it (UNAVAILABLE, DEADLINE_EXCEEDED), with `error`. An answer of
  // any other code is etcd answering.
  Change Observe(absl::Time started, absl::Time ended, bool failed, absl::string_view error);

  State state() const;
  bool reachable() const;
  // 0 while reachable.
  absl::Duration UnreachableFor(absl::Time now) const;

 private:
  const absl::Duration grace_;
  mutable absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_);
  // Start of the first failed attempt since the last success (InfinitePast:
  // the last attempt succeeded).
  absl::Time failing_since_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_ETCD_REACHABILITY_H_
