#include "scheduler/plan_validation.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace rollpack {
namespace {

bool IsPowerOfTwo(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

}  // namespace

absl::Status ValidatePlan(const Plan& plan, absl::Span<const int64_t> lengths,
                          const Topology& topology) {
  RETURN_IF_ERROR(ValidateTopologySizes(topology));
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
      switch (topology.scheduler) {
        case SchedulerKind::kStaticCp:
          if (g.cp_size != topology.cp) {
            return absl::InternalError(
                absl::StrCat(where, ": size ", g.cp_size, " != cp ", topology.cp));
          }
          break;
        case SchedulerKind::kDynamicCp:
          if (!IsPowerOfTwo(g.cp_size) || g.cp_size < topology.min_cp ||
              g.cp_size > max_c || g.first_rank % g.cp_size != 0) {
            return absl::InternalError(absl::StrCat(
                where, ": size ", g.cp_size,
                " must be an aligned power of two in [min_cp ", topology.min_cp,
                ", ", max_c, "]"));
          }
          break;
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

}  // namespace rollpack
