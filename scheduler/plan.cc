#include "scheduler/plan.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/dynamic_cp_scheduler.h"
#include "scheduler/packing.h"
#include "scheduler/static_cp_scheduler.h"

namespace rollpack {
namespace {

bool IsPowerOfTwo(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

}  // namespace

absl::StatusOr<Plan> ComputePlan(absl::Span<const int64_t> lengths,
                                 const Topology& topology) {
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status s = ValidateTopologySizes(topology); !s.ok()) return s;
  if (lengths.empty()) {
    return absl::FailedPreconditionError(
        "no sequences: a plan needs at least one sequence per group");
  }
  absl::StatusOr<Plan> plan = topology.scheduler == SchedulerKind::kStaticCp
                                  ? ComputeStaticCpPlan(lengths, topology)
                                  : ComputeDynamicCpPlan(lengths, topology);
  if (!plan.ok()) return plan.status();
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  plan->stats.plan_ms = ms;
  plan->stats = ComputePlanStats(*plan, lengths, topology, topology.cost);
  return plan;
}

absl::Status ValidatePlan(const Plan& plan, absl::Span<const int64_t> lengths,
                          const Topology& topology) {
  if (absl::Status s = ValidateTopologySizes(topology); !s.ok()) return s;
  const int r = topology.num_dpcp_ranks();
  if (plan.num_dpcp_ranks != r) {
    return absl::InternalError(absl::StrCat("plan: num_dpcp_ranks ",
                                            plan.num_dpcp_ranks,
                                            ", topology has dp*cp = ", r));
  }
  const int n_mb = static_cast<int>(plan.microbatches.size());
  if (n_mb == 0 || n_mb % topology.microbatch_group_size != 0) {
    return absl::InternalError(absl::StrCat(
        "plan: ", n_mb, " micro-batches, must be a positive multiple of "
        "microbatch_group_size ", topology.microbatch_group_size));
  }
  const bool dynamic = topology.scheduler == SchedulerKind::kDynamicCp;
  const int max_c = MaxCpGroupSize(topology);
  std::vector<int> seen(lengths.size(), 0);
  for (int m = 0; m < n_mb; ++m) {
    int next_rank = 0;
    for (const PlanGroup& g : plan.microbatches[m].groups) {
      const std::string where =
          absl::StrCat("plan: micro-batch ", m, " group at rank ", g.first_rank);
      if (g.first_rank != next_rank) {
        return absl::InternalError(absl::StrCat(
            where, ": groups must tile the ranks in order, expected rank ",
            next_rank));
      }
      if (dynamic) {
        if (!IsPowerOfTwo(g.cp_size) || g.cp_size < topology.min_cp ||
            g.cp_size > max_c || g.first_rank % g.cp_size != 0) {
          return absl::InternalError(absl::StrCat(
              where, ": size ", g.cp_size,
              " must be an aligned power of two in [min_cp ", topology.min_cp,
              ", ", max_c, "]"));
        }
      } else if (g.cp_size != topology.cp) {
        return absl::InternalError(
            absl::StrCat(where, ": size ", g.cp_size, " != cp ", topology.cp));
      }
      next_rank += g.cp_size;
      if (next_rank > r) {
        return absl::InternalError(
            absl::StrCat(where, ": runs past dp*cp = ", r));
      }
      if (g.sequences.empty()) {
        return absl::InternalError(absl::StrCat(where, ": empty group"));
      }
      if (g.padded_lengths.size() != g.sequences.size()) {
        return absl::InternalError(
            absl::StrCat(where, ": padded_lengths size mismatch"));
      }
      int64_t tokens = 0;
      for (size_t k = 0; k < g.sequences.size(); ++k) {
        const int i = g.sequences[k];
        if (i < 0 || i >= static_cast<int>(lengths.size())) {
          return absl::InternalError(
              absl::StrCat(where, ": sequence index ", i, " out of range"));
        }
        if (++seen[i] > 1) {
          return absl::InternalError(
              absl::StrCat(where, ": sequence ", i, " appears twice"));
        }
        const int64_t p = PaddedLength(topology, lengths[i], g.cp_size);
        if (g.padded_lengths[k] != p) {
          return absl::InternalError(absl::StrCat(
              where, ": sequence ", i, " padded to ", g.padded_lengths[k],
              ", section 2 gives ", p));
        }
        tokens += p;
      }
      if (tokens % g.cp_size != 0 || tokens / g.cp_size != g.tokens_per_rank) {
        return absl::InternalError(absl::StrCat(
            where, ": tokens_per_rank ", g.tokens_per_rank, " but ", tokens,
            " padded tokens over ", g.cp_size, " ranks"));
      }
      if (g.tokens_per_rank > topology.max_tokens_per_rank) {
        return absl::InternalError(absl::StrCat(
            where, ": ", g.tokens_per_rank,
            " tokens per rank exceed max_tokens_per_rank ",
            topology.max_tokens_per_rank));
      }
    }
    if (next_rank != r) {
      return absl::InternalError(absl::StrCat(
          "plan: micro-batch ", m, " groups cover ", next_rank, " of ", r,
          " ranks"));
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (seen[i] != 1) {
      return absl::InternalError(
          absl::StrCat("plan: sequence ", i, " is in no group"));
    }
  }
  return absl::OkStatus();
}

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
