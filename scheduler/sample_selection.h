// Which free samples a step takes (../shared/spec/lifecycle.md sections
// 1-3): by count, by whole groups, by a token budget, skipping stale
// samples, oldest or newest version first. Pure metadata, so a single
// server and a cluster's planner (over every member's listing) select
// alike.
#ifndef ROLLPACK_SCHEDULER_SAMPLE_SELECTION_H_
#define ROLLPACK_SCHEDULER_SAMPLE_SELECTION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace rollpack {

enum class SelectionOrder { kOldest = 0, kNewestVersion = 1 };

// A stored sample as selection sees it. Views into the caller's storage.
struct SampleCandidate {
  absl::string_view sample_id;
  int64_t num_tokens = 0;
  int64_t policy_version = 0;
  // Empty, or group_size 0: ungrouped.
  absl::string_view group_id;
  int32_t group_size = 0;
  // The first of the pool's required scalars the sample lacks (lifecycle.md
  // section 6); empty when it lacks none. Such a sample is never selected and
  // its group is not complete.
  absl::string_view missing_scalar;
  // When the sample became selectable (sealed with every required scalar),
  // on a clock that ascends in the candidates' order (the store's arrival
  // sequence, a cluster's arrival time): annotations can complete a group
  // after samples sealed later, and OLDEST orders groups by their members'
  // latest. 0 on every candidate: the candidates' order is that clock.
  int64_t ready_key = 0;
};

struct SelectionRequest {
  // Exactly one of these is set (> 0); explicit ids are checked by
  // CheckExplicitSelection instead.
  int64_t num_samples = 0;
  int64_t num_groups = 0;
  int64_t num_tokens = 0;
  bool whole_groups = false;
  // 0 = unknown: nothing is stale.
  int64_t policy_version = 0;
  std::optional<int64_t> max_staleness;
  SelectionOrder order = SelectionOrder::kOldest;
  // The most samples a step may take (the server's --max-samples-per-step);
  // 0 = no limit. A selection past it is refused, never cut short: a
  // smaller step than asked would change the run silently.
  int64_t max_samples = 0;

  bool selects_groups() const { return whole_groups || num_groups > 0; }
};

// RESOURCE_EXHAUSTED when a step of `samples` samples is over
// request.max_samples, naming both; OK otherwise (and when there is no
// limit). SelectSamples and CheckExplicitSelection apply it; callers apply
// it to what a request states outright (its ids, num_samples) before
// listing any sample.
absl::Status CheckStepSize(int64_t samples, const SelectionRequest& request,
                           absl::string_view what);

// True when `version` is stale under the request's policy version and bound.
bool IsStale(const SelectionRequest& request, int64_t policy_version);

struct Selection {
  // Indices into the candidates, in the step's order (selection order; a
  // group's samples together, in ingest order).
  std::vector<int32_t> chosen;
  int64_t num_tokens = 0;
  // Complete groups among the chosen samples.
  int32_t num_groups = 0;
  // With `prefix`: the prefix did not decide the selection (nothing chosen).
  bool needs_more = false;
};

// Selects from `free_candidates`: the pool's free, sealed samples in ingest
// order (index = ingest rank). FAILED_PRECONDITION, naming what is
// available, when the request cannot be met; INVALID_ARGUMENT when it
// selects nothing; RESOURCE_EXHAUSTED when it selects more than
// request.max_samples. `what` prefixes errors (e.g. `step "s1": pool "p"`).
//
// `prefix`: the candidates are only the oldest free samples (OLDEST order
// only). Items that complete within a prefix come first in the whole order
// too, so a selection the prefix meets is the whole pool's; when it falls
// short, the result has needs_more set and the caller asks again with more.
// A pool of 10^5 free samples then costs what the step takes, not the pool.
absl::StatusOr<Selection> SelectSamples(absl::Span<const SampleCandidate> free_candidates,
                                        const SelectionRequest& request, absl::string_view what,
                                        bool prefix = false);

// Explicit ids, already known to be free and stored (`chosen`, in the
// order given): RESOURCE_EXHAUSTED past request.max_samples;
// FAILED_PRECONDITION naming a stale sample and its version,
// or, with whole_groups, a group not covered whole and how many of its
// samples are missing. Returns the count of complete groups among them.
absl::StatusOr<int32_t> CheckExplicitSelection(absl::Span<const SampleCandidate> chosen,
                                               const SelectionRequest& request,
                                               absl::string_view what);

// Complete groups among `samples` (each group counted once, when all its
// group_size samples are among them).
int32_t CountCompleteGroups(absl::Span<const SampleCandidate> samples);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_SAMPLE_SELECTION_H_
