// What trainers did with each live step: streams served and when one last
// started or ended. A controller that lost track of its steps reads it
// (Scheduler.ListSteps); --step-ttl releases steps nobody has touched for
// that long (docs/operations.md, "Controller").
#ifndef ROLLPACK_SERVER_STORE_STEP_ACTIVITY_H_
#define ROLLPACK_SERVER_STORE_STEP_ACTIVITY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rollpack {

class StepActivity {
 public:
  struct Entry {
    int64_t streams_started = 0;
    int32_t streams_open = 0;
    // When a stream last started or ended; InfinitePast while none did.
    absl::Time last_stream = absl::InfinitePast();
    // When this server first knew the step (created, or recovered).
    absl::Time first_seen = absl::InfinitePast();
    // Which step of that id the entry is about: a step id can be reused
    // once released, and a stream of the old step may still end later.
    uint64_t generation = 0;
  };

  // A new step: fresh counts (an earlier step of the same id is forgotten).
  void StepCreated(const std::string& step_id, absl::Time now);
  // Counted before the stream looks its step up, so a step being fetched
  // is never idle. The token goes back to StreamEnded.
  uint64_t StreamStarted(const std::string& step_id, absl::Time now);
  void StreamEnded(const std::string& step_id, uint64_t token, absl::Time now);
  void StepReleased(const std::string& step_id);

  // The step's entry; a step this server has not seen yet (recovered from
  // the log, or created through another cluster member) is first seen now.
  Entry Get(const std::string& step_id, absl::Time now);

  // Forgets steps not in `live` that have no open stream and no activity
  // since `cutoff` (taken before `live` was listed, so a step created or
  // fetched meanwhile is kept).
  void Retain(const std::vector<std::string>& live, absl::Time cutoff);

  // Of `live` (step ids), those with no open stream and no activity since
  // `now - ttl`: abandoned by their controller.
  std::vector<std::string> Idle(const std::vector<std::string>& live, absl::Time now,
                                absl::Duration ttl);
  // Idle() for one step, checked again right before it is released.
  bool StillIdle(const std::string& step_id, absl::Time now, absl::Duration ttl);

 private:
  Entry& At(const std::string& step_id, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IsIdle(const Entry& e, absl::Time now, absl::Duration ttl) const;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_STEP_ACTIVITY_H_
