#include "scheduler/plan_stats.h"

#include <algorithm>
#include <vector>

#include "scheduler/packing.h"

namespace rollpack {

PlanStats ComputePlanStats(const Plan& plan, absl::Span<const int64_t> lengths,
                           const Topology& topology,
                           absl::FunctionRef<double(int64_t)> work) {
  PlanStats stats;
  const int r = plan.num_dpcp_ranks;
  stats.num_microbatches = static_cast<int>(plan.microbatches.size());
  stats.plan_ms = plan.stats.plan_ms;
  std::vector<int> min_width(lengths.size(), 1);
  bool all_fit = true;
  for (size_t i = 0; i < lengths.size(); ++i) {
    min_width[i] = MinCpGroupSizeFor(topology, lengths[i]);
    if (min_width[i] == 0) all_fit = false;
  }
  stats.min_microbatches =
      all_fit && topology.max_tokens_per_rank > 0
          ? internal::MicrobatchLowerBound(lengths, topology, min_width)
          : 0;
  std::vector<double> total(r, 0), step(r, 0);
  double sync_sum = 0;
  int64_t peak_tokens = 0;
  for (const PlanMicrobatch& mb : plan.microbatches) {
    std::fill(step.begin(), step.end(), 0);
    for (const PlanGroup& g : mb.groups) {
      double w = 0;
      int64_t tokens = 0;
      for (size_t k = 0; k < g.sequences.size(); ++k) {
        const int64_t p = g.padded_lengths[k];
        w += work(p);
        tokens += p;
        stats.num_padded_tokens += p;
        stats.num_tokens += lengths[g.sequences[k]];
      }
      peak_tokens = std::max(peak_tokens, tokens / std::max(g.cp_size, 1));
      for (int q = g.first_rank; q < g.first_rank + g.cp_size && q < r; ++q) {
        step[q] += w / g.cp_size;
      }
    }
    for (int q = 0; q < r; ++q) total[q] += step[q];
    sync_sum += r > 0 ? *std::max_element(step.begin(), step.end()) : 0;
  }
  double mean = 0;
  for (double x : total) mean += x;
  mean = r > 0 ? mean / r : 0;
  if (mean > 0) {
    stats.rank_imbalance = *std::max_element(total.begin(), total.end()) / mean;
    stats.sync = sync_sum / mean;
  }
  stats.peak = topology.max_tokens_per_rank > 0
                   ? static_cast<double>(peak_tokens) / topology.max_tokens_per_rank
                   : 0;
  stats.padding_overhead =
      stats.num_tokens > 0
          ? static_cast<double>(stats.num_padded_tokens - stats.num_tokens) /
                stats.num_tokens
          : 0;
  return stats;
}

}  // namespace rollpack
