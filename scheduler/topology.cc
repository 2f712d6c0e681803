#include "scheduler/topology.h"

#include <numeric>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace rollpack {
namespace {

bool IsPowerOfTwo(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

absl::Status RequirePositive(const char* field, int64_t value) {
  if (value < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology: ", field, " is ", value, ", must be >= 1"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTopologySizes(const Topology& t) {
  for (auto [field, value] : {std::pair<const char*, int64_t>{"dp", t.dp},
                              {"cp", t.cp},
                              {"tp", t.tp},
                              {"pp", t.pp},
                              {"vpp", t.vpp},
                              {"pad_multiple", t.pad_multiple},
                              {"microbatch_group_size", t.microbatch_group_size},
                              {"min_cp", t.min_cp}}) {
    RETURN_IF_ERROR(RequirePositive(field, value));
  }
  // The world size must fit the int arithmetic downstream (dp * cp is an
  // int): refuse absurd sizes instead of overflowing (found by
  // fuzz/topology_fuzzer: dp 4855592 x cp 38015).
  constexpr int64_t kMaxWorldSize = int64_t{1} << 24;
  int64_t world = 1;
  for (int64_t size : {int64_t{t.dp}, int64_t{t.cp}, int64_t{t.tp}, int64_t{t.pp}, int64_t{t.vpp}}) {
    world *= size;
    if (world > kMaxWorldSize) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topology: dp ", t.dp, " x cp ", t.cp, " x tp ", t.tp, " x pp ", t.pp, " x vpp ", t.vpp,
          " exceeds ", kMaxWorldSize, " ranks"));
    }
  }
  if (t.num_layers_in_first_pipeline_stage < 0 ||
      t.num_layers_in_last_pipeline_stage < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology: num_layers_in_first_pipeline_stage ",
        t.num_layers_in_first_pipeline_stage,
        " and num_layers_in_last_pipeline_stage ",
        t.num_layers_in_last_pipeline_stage, " must not be negative"));
  }
  if (t.max_tokens_per_rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology: max_tokens_per_rank is ", t.max_tokens_per_rank,
                     ", must be set (>= 1)"));
  }
  if (t.vpp > 1 && t.microbatch_group_size < t.pp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology: microbatch_group_size ", t.microbatch_group_size,
        " is below pp ", t.pp,
        "; interleaved pipelines (vpp ", t.vpp, ") need at least pp"));
  }
  switch (t.scheduler) {
    case SchedulerKind::kStaticCp:
      break;  // min_cp is not used: every group has cp ranks
    case SchedulerKind::kDynamicCp:
      if (const int r = t.num_dpcp_ranks(); !IsPowerOfTwo(t.min_cp) || r % t.min_cp != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "topology: min_cp ", t.min_cp,
            " must be a power of two that divides dp*cp = ", r));
      }
      break;
  }
  if (t.cost.linear < 0 || t.cost.quadratic < 0 ||
      t.cost.linear + t.cost.quadratic <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology: cost model linear ", t.cost.linear,
                     ", quadratic ", t.cost.quadratic,
                     " must be non-negative and not both 0"));
  }
  return absl::OkStatus();
}

int64_t SequenceAlignment(const Topology& t, int cp_size) {
  const int64_t s = t.sequence_parallel_size();
  const int64_t base = cp_size > 1 ? 2 * int64_t{cp_size} * s : s;
  return std::lcm(base, int64_t{t.pad_multiple});
}

CostModel CostModelForTransformer(int64_t hidden_size, int num_layers,
                                  int64_t ffn_hidden_size) {
  const double h = static_cast<double>(hidden_size);
  const double f = ffn_hidden_size > 0 ? static_cast<double>(ffn_hidden_size) : 4 * h;
  CostModel c;
  c.linear = num_layers * (8 * h * h + 4 * h * f);
  c.quadratic = num_layers * 4 * h;
  return c;
}

int MinCpGroupSize(const Topology& t) {
  switch (t.scheduler) {
    case SchedulerKind::kStaticCp:
      return t.cp;
    case SchedulerKind::kDynamicCp:
      return t.min_cp;
  }
  return t.cp;  // not reached: every kind has its case
}

int MaxCpGroupSize(const Topology& t) {
  switch (t.scheduler) {
    case SchedulerKind::kStaticCp:
      return t.cp;
    case SchedulerKind::kDynamicCp: {
      int c = 1;
      while (c * 2 <= t.num_dpcp_ranks()) c *= 2;
      return c;
    }
  }
  return t.cp;  // not reached: every kind has its case
}

int MinCpGroupSizeFor(const Topology& t, int64_t n) {
  // Static CP's one size, cp, need not be a power of two: the loop then runs once.
  const int max_c = MaxCpGroupSize(t);
  for (int c = MinCpGroupSize(t); c <= max_c; c *= 2) {
    if (PaddedLength(t, n, c) / c <= t.max_tokens_per_rank) return c;
  }
  return 0;
}

int64_t LargestLengthThatFits(const Topology& topology, int cp_size) {
  const int64_t a = SequenceAlignment(topology, cp_size);
  return (int64_t{cp_size} * topology.max_tokens_per_rank) / a * a;
}

}  // namespace rollpack
