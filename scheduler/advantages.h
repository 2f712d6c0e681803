// Per-sequence advantages of a step (../shared/spec/lifecycle.md section 6,
// "Advantages"): each sample's scalar r against the samples of its group in
// the step. Pure metadata math, like sample_selection.h: a single server and
// a cluster's planner (which learns the scalars from the members' holds)
// compute alike, and a step replayed from the durable log gets the same
// bytes again.
//
// Computed in float64, sent as float32. Every sum runs over the group's
// values in ascending order with Neumaier's compensation, so a group's
// advantages depend neither on the order its samples sit in the step nor on
// the machine (IEEE 754 binary64 throughout; no long double).
#ifndef ROLLPACK_SCHEDULER_ADVANTAGES_H_
#define ROLLPACK_SCHEDULER_ADVANTAGES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace rollpack {

// The wire's AdvantageEstimator, value for value.
enum class AdvantageEstimator {
  kNone = 0,
  kGrpo = 1,      // (r - mean_g) / (std_g + eps), population std
  kGrpoMean = 2,  // r - mean_g
  kRloo = 3,      // r - mean of the group's other samples (groups >= 2)
};

// "ADVANTAGE_GRPO", ...; "AdvantageEstimator(N)" for other values.
std::string AdvantageEstimatorName(AdvantageEstimator estimator);

// What a CreateStep asks for, as it asked (the durable log keeps it so).
struct AdvantageRequest {
  AdvantageEstimator estimator = AdvantageEstimator::kNone;
  // Empty: "reward".
  std::string scalar;
  // 0: 1e-6.
  double eps = 0;

  const std::string& scalar_name() const;
  double effective_eps() const { return eps == 0 ? kDefaultEps : eps; }
  static constexpr double kDefaultEps = 1e-6;
  friend bool operator==(const AdvantageRequest& a, const AdvantageRequest& b) {
    return a.estimator == b.estimator && a.scalar == b.scalar && a.eps == b.eps;
  }
};

// INVALID_ARGUMENT naming the field: an estimator that is not one of the
// enum's, a negative or non-finite advantage_eps. `what` prefixes errors
// (e.g. `step "s1"`).
absl::Status ValidateAdvantageRequest(const AdvantageRequest& request, absl::string_view what);

// One sample of the step as the estimator sees it. Views into the caller's
// storage.
struct AdvantageSample {
  absl::string_view sample_id;
  // Empty, or group_size 0: ungrouped.
  absl::string_view group_id;
  int32_t group_size = 0;
  // Null: the sample lacks the scalar.
  const double* value = nullptr;
};

// The advantage of each of `samples` (the step's samples, in its order),
// float32, for an estimator other than kNone (kNone: empty). Refusals, all
// FAILED_PRECONDITION, checked in this order and naming the first found in
// step order: an ungrouped sample; a group that has not all group_size of
// its samples in the step (how many are); with kRloo a group of fewer than
// 2; a sample without the scalar; a sample whose scalar is not finite (it
// would make its whole group NaN); a group whose standard deviation (GRPO)
// or advantages in float32 are not finite (values too large). INVALID_ARGUMENT as
// ValidateAdvantageRequest.
absl::StatusOr<std::vector<float>> ComputeAdvantages(absl::Span<const AdvantageSample> samples,
                                                     const AdvantageRequest& request,
                                                     absl::string_view what);

// The group checks of ComputeAdvantages alone (everything but the scalar):
// what a cluster's planner can refuse before it holds any sample.
absl::Status CheckAdvantageGroups(absl::Span<const AdvantageSample> samples,
                                  const AdvantageRequest& request, absl::string_view what);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_ADVANTAGES_H_
