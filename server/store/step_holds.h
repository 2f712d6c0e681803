// The samples a cluster member holds for steps other members planned
// (sample_store.h, "Cluster mode"), by step id: what each hold took, from
// whom, and whether the planner confirmed it.
//
// Not thread-safe: SampleStore owns one as a member guarded by its mutex
// (ABSL_GUARDED_BY) and calls it only under that lock. It keeps the holds'
// bookkeeping alone: the samples stay in their pool, which the store takes
// out of and gives back to its free set around these calls.
#ifndef ROLLPACK_SERVER_STORE_STEP_HOLDS_H_
#define ROLLPACK_SERVER_STORE_STEP_HOLDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace rollpack {

class StepHolds {
 public:
  struct Hold {
    std::string pool;
    std::vector<std::string> sample_ids;
    std::string coordinator;
    // The planner's attempt at the step (its record's created_unix_nanos):
    // only that attempt confirms or drops the hold.
    int64_t attempt = 0;
    absl::Time held_at;
    bool confirmed = false;
    bool reuse_samples = false;
    // RECOMPUTE holds: each sample's recompute routing when it was taken
    // (shared; a later commit replaces the store's, never this hold's).
    bool recompute = false;
    std::vector<std::shared_ptr<const std::string>> recompute_routing;
  };
  using Map = absl::flat_hash_map<std::string, Hold>;

  bool contains(const std::string& step_id) const { return holds_.contains(step_id); }
  bool empty() const { return holds_.empty(); }
  size_t size() const { return holds_.size(); }
  // Every hold, in no particular order.
  Map::const_iterator begin() const { return holds_.begin(); }
  Map::const_iterator end() const { return holds_.end(); }

  // The hold of `step_id`, or null.
  const Hold* Find(const std::string& step_id) const;
  // The hold of `step_id` (with `attempt` != 0: of that attempt only), or
  // NOT_FOUND naming the step.
  absl::StatusOr<const Hold*> Get(const std::string& step_id, int64_t attempt = 0) const;
  // Records a hold; `step_id` must hold nothing yet.
  void Add(const std::string& step_id, Hold hold);
  void Erase(const std::string& step_id) { holds_.erase(step_id); }
  // NOT_FOUND naming the step when it holds nothing.
  absl::Status Confirm(const std::string& step_id);
  // The attempt of the hold of `step_id`, 0 when there is none.
  int64_t Attempt(const std::string& step_id) const;

  // Unconfirmed holds taken at or before `cutoff`, sorted.
  std::vector<std::string> Unconfirmed(absl::Time cutoff) const;
  // Step ids of every hold (of `pool`; "" = every pool), sorted.
  std::vector<std::string> Ids(const std::string& pool = "") const;
  // The step holding sample `sample_id` of `pool`, or "" (a scan: for an
  // error's words).
  std::string HolderOf(const std::string& pool, const std::string& sample_id) const;

  // Where each of `sample_ids` sits in the hold of `step_id`'s sample_ids:
  // NOT_FOUND naming the step, or the first sample it does not hold.
  absl::StatusOr<std::vector<size_t>> Positions(const std::string& step_id,
                                                absl::Span<const std::string> sample_ids) const;
  // The recompute routing the RECOMPUTE hold of `step_id` took with
  // `sample_ids`, in their order: Positions' errors, or FAILED_PRECONDITION
  // when the hold replays rollout routing.
  absl::StatusOr<std::vector<std::shared_ptr<const std::string>>> RecomputeRouting(
      const std::string& step_id, absl::Span<const std::string> sample_ids) const;

  // The kHoldSamples log record of the hold (its dead bytes once it ends,
  // and what compaction writes for it).
  static std::string Record(const std::string& step_id, const Hold& hold);

 private:
  Map holds_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_STEP_HOLDS_H_
