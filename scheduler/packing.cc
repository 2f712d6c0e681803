#include "scheduler/packing.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/packer.h"

namespace rollpack {
namespace internal {
namespace {

// starts with the best-fit tail.
constexpr double kTightFill = 0.998;

}  // namespace

absl::Status ComputeMinWidths(absl::Span<const int64_t> lengths,
                              const Topology& topology, int max_width,
                              std::vector<int>* min_width) {
  // MinCpGroupSizeFor with the alignments computed once.
  const int last = MaxCpGroupSize(topology);
  std::vector<std::pair<int, int64_t>> widths;  // (c, alignment)
  for (int c = MinCpGroupSize(topology); c <= last; c *= 2) {
    widths.emplace_back(c, SequenceAlignment(topology, c));
  }
  min_width->assign(lengths.size(), 0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", i, " has length ", lengths[i], ", must be >= 1"));
    }
    int c = 0;
    for (const auto& [w, a] : widths) {
      if (CeilTo(lengths[i], a) / w <= topology.max_tokens_per_rank) {
        c = w;
        break;
      }
    }
    if (c == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", i, " has length ", lengths[i],
          " which fits on no allowed CP group (largest group ", max_width,
          " ranks, max_tokens_per_rank ", topology.max_tokens_per_rank,
          "); the largest length that fits is ",
          LargestLengthThatFits(topology, max_width)));
    }
    (*min_width)[i] = c;
  }
  return absl::OkStatus();
}

namespace {

int64_t PaddedVolume(absl::Span<const int64_t> lengths, const Topology& topology,
                     absl::Span<const int> min_width) {
  // By width: a static CP group of cp = 3 aligns for 3 ranks, not 2.
  std::map<int, int64_t> align;
  int64_t total = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int w = std::max(min_width[i], 1);
    auto it = align.find(w);
    if (it == align.end()) it = align.emplace(w, SequenceAlignment(topology, w)).first;
    total += CeilTo(lengths[i], it->second);
  }
  return total;
}

}  // namespace

int MicrobatchLowerBound(absl::Span<const int64_t> lengths,
                         const Topology& topology,
                         absl::Span<const int> min_width) {
  const int64_t total = PaddedVolume(lengths, topology, min_width);
  const int64_t per_step =
      int64_t{topology.num_dpcp_ranks()} * topology.max_tokens_per_rank;
  return static_cast<int>((total + per_step - 1) / per_step);
}

absl::StatusOr<Plan> PackIntoMicrobatches(absl::Span<const int64_t> lengths,
                                          const Topology& topology,
                                          const PackOptions& options,
                                          int num_microbatches) {
  // Nearly full steps leave too little slack for levelling all the way
  // down; close the gaps with best fit over the last 5% of the volume first.
  const int64_t volume = PaddedVolume(lengths, topology, options.min_width);
  const double fill = static_cast<double>(volume) /
                      (static_cast<double>(num_microbatches) *
                       topology.num_dpcp_ranks() * topology.max_tokens_per_rank);
  const std::vector<double> tails = fill > kTightFill
                                        ? std::vector<double>{0.05, 0.0, 0.1, 0.2}
                                        : std::vector<double>{0.0, 0.05, 0.1, 0.2};
  absl::Status last;
  for (double tail : tails) {
    Packer packer(lengths, topology, options, num_microbatches, tail);
    absl::StatusOr<Plan> plan = packer.Run();
    if (plan.ok() || !absl::IsResourceExhausted(plan.status())) return plan;
    last = plan.status();
  }
  return last;
}

absl::StatusOr<Plan> PackWithFewestMicrobatches(
    absl::Span<const int64_t> lengths, const Topology& topology,
    const PackOptions& options) {
  const int g = topology.microbatch_group_size;
  const int bound = MicrobatchLowerBound(lengths, topology, options.min_width);
  int n_mb = std::max(bound, 1);
  n_mb = (n_mb + g - 1) / g * g;
  absl::Status last = absl::OkStatus();
  const int n = static_cast<int>(lengths.size());
  for (; n_mb <= std::max(n, g); n_mb += g) {
    absl::StatusOr<Plan> plan =
        PackIntoMicrobatches(lengths, topology, options, n_mb);
    if (plan.ok()) {
      plan->stats.min_microbatches = bound;
      return plan;
    }
    if (!absl::IsResourceExhausted(plan.status())) return plan.status();
    last = plan.status();
  }
  const int groups = options.unit_width == options.max_width
                         ? topology.num_dpcp_ranks() / options.unit_width
                         : PopCount(topology.num_dpcp_ranks() / options.unit_width);
  return absl::FailedPreconditionError(absl::StrCat(
      "too few sequences: ", n, " sequences cannot be packed into ",
      "micro-batches that give every rank a non-empty one (", last.message(),
      "); need at least ", int64_t{groups} * std::max(bound, g)));
}

}  // namespace internal
}  // namespace rollpack
