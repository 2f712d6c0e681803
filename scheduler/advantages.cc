#include "scheduler/advantages.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace rollpack {
namespace {

// Neumaier's compensated sum of `values` sorted ascending: the order is fixed
// by the values alone, and the compensation keeps a group of 10^5 rewards
// exact to the last bits that float32 keeps.
double SortedSum(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  double sum = 0;
  double compensation = 0;
  for (double x : values) {
    const double t = sum + x;
    compensation += std::fabs(sum) >= std::fabs(x) ? (sum - t) + x : (x - t) + sum;
    sum = t;
  }
  return sum + compensation;
}

// The step's groups in order of first appearance, each its samples' indices
// in step order; the group refusals of ComputeAdvantages.
absl::StatusOr<std::vector<std::vector<int32_t>>> StepGroups(
    absl::Span<const AdvantageSample> samples, const AdvantageRequest& request,
    absl::string_view what) {
  const std::string name = AdvantageEstimatorName(request.estimator);
  absl::flat_hash_map<absl::string_view, size_t> index;
  std::vector<std::vector<int32_t>> groups;
  for (size_t i = 0; i < samples.size(); ++i) {
    const AdvantageSample& s = samples[i];
    if (s.group_id.empty() || s.group_size <= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": sample \"", s.sample_id, "\" is ungrouped (group_id \"", s.group_id,
          "\", group_size ", s.group_size, "); ", name,
          " needs every sample in a group, with the whole group in the step"));
    }
    auto [it, inserted] = index.try_emplace(s.group_id, groups.size());
    if (inserted) groups.emplace_back();
    groups[it->second].push_back(static_cast<int32_t>(i));
  }
  for (const std::vector<int32_t>& group : groups) {
    const AdvantageSample& first = samples[group[0]];
    for (int32_t i : group) {
      if (samples[i].group_size != first.group_size) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": group \"", first.group_id, "\" has samples of group_size ",
            first.group_size, " (\"", first.sample_id, "\") and ", samples[i].group_size,
            " (\"", samples[i].sample_id, "\")"));
      }
    }
    if (static_cast<int64_t>(group.size()) != first.group_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": group \"", first.group_id, "\" has ", group.size(), " of its ",
          first.group_size, " samples in the step; ", name,
          " needs all of them (select with num_groups or whole_groups)"));
    }
    if (request.estimator == AdvantageEstimator::kRloo && group.size() < 2) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": group \"", first.group_id, "\" has ", group.size(), " sample; ", name,
          " needs groups of at least 2 (the mean of the other samples)"));
    }
  }
  return groups;
}

}  // namespace

std::string AdvantageEstimatorName(AdvantageEstimator estimator) {
  switch (estimator) {
    case AdvantageEstimator::kNone: return "ADVANTAGE_NONE";
    case AdvantageEstimator::kGrpo: return "ADVANTAGE_GRPO";
    case AdvantageEstimator::kGrpoMean: return "ADVANTAGE_GRPO_MEAN";
    case AdvantageEstimator::kRloo: return "ADVANTAGE_RLOO";
  }
  return absl::StrCat("AdvantageEstimator(", static_cast<int>(estimator), ")");
}

const std::string& AdvantageRequest::scalar_name() const {
  static const std::string* const kReward = new std::string("reward");
  return scalar.empty() ? *kReward : scalar;
}

absl::Status ValidateAdvantageRequest(const AdvantageRequest& request, absl::string_view what) {
  switch (request.estimator) {
    case AdvantageEstimator::kNone:
    case AdvantageEstimator::kGrpo:
    case AdvantageEstimator::kGrpoMean:
    case AdvantageEstimator::kRloo:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": advantage ", static_cast<int>(request.estimator),
          " is not an AdvantageEstimator"));
  }
  if (!std::isfinite(request.eps) || request.eps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": advantage_eps is ", request.eps,
        "; it must be finite and >= 0 (0 means ", AdvantageRequest::kDefaultEps, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckAdvantageGroups(absl::Span<const AdvantageSample> samples,
                                  const AdvantageRequest& request, absl::string_view what) {
  RETURN_IF_ERROR(ValidateAdvantageRequest(request, what));
  if (request.estimator == AdvantageEstimator::kNone) return absl::OkStatus();
  return StepGroups(samples, request, what).status();
}

absl::StatusOr<std::vector<float>> ComputeAdvantages(absl::Span<const AdvantageSample> samples,
                                                     const AdvantageRequest& request,
                                                     absl::string_view what) {
  RETURN_IF_ERROR(ValidateAdvantageRequest(request, what));
  if (request.estimator == AdvantageEstimator::kNone) return std::vector<float>();
  ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> groups, StepGroups(samples, request, what));
  const std::string& scalar = request.scalar_name();
  const std::string name = AdvantageEstimatorName(request.estimator);
  for (const AdvantageSample& s : samples) {
    if (s.value == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": sample \"", s.sample_id, "\" has no scalar \"", scalar, "\", which ", name,
          " reads (give it with the sample or by AnnotateSamples)"));
    }
    if (!std::isfinite(*s.value)) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": sample \"", s.sample_id, "\" has scalar \"", scalar, "\" = ", *s.value, "; ",
          name, " needs finite values (one would make its whole group's advantages NaN)"));
    }
  }
  std::vector<float> out(samples.size());
  const double eps = request.effective_eps();
  std::vector<double> values;
  std::vector<double> squares;
  for (const std::vector<int32_t>& group : groups) {
    const double n = static_cast<double>(group.size());
    values.clear();
    for (int32_t i : group) values.push_back(*samples[i].value);
    const double sum = SortedSum(values);
    const double mean = sum / n;
    double scale = 1;  // GRPO: 1 / (std + eps), applied as a division below
    if (request.estimator == AdvantageEstimator::kGrpo) {
      squares.clear();
      for (double r : values) squares.push_back((r - mean) * (r - mean));
      scale = std::sqrt(SortedSum(squares) / n) + eps;
      // Squares past 1e308 (rewards past 1e154) would divide every
      // advantage to 0: refused like any other that is not finite.
      if (!std::isfinite(scale)) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": group \"", samples[group[0]].group_id, "\": the standard deviation of its \"",
            scalar, "\" values is not finite in float64 (values too large)"));
      }
    }
    for (int32_t i : group) {
      const double r = *samples[i].value;
      double a = 0;
      switch (request.estimator) {
        case AdvantageEstimator::kGrpo:
          a = (r - mean) / scale;
          break;
        case AdvantageEstimator::kGrpoMean:
          a = r - mean;
          break;
        case AdvantageEstimator::kRloo:
          a = r - (sum - r) / (n - 1);
          break;
        case AdvantageEstimator::kNone:
          break;
      }
      out[i] = static_cast<float>(a);
      if (!std::isfinite(out[i])) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": group \"", samples[i].group_id, "\": the ", name, " advantage of sample \"",
            samples[i].sample_id, "\" is ", a, ", not a finite float32 (its \"", scalar,
            "\" values are too large)"));
      }
    }
  }
  return out;
}

}  // namespace rollpack
