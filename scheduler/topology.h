// The trainer's parallel layout and the token budget, as the scheduler sees
// it (layout.md sections 1, 2 and 9). Pure C++: no gRPC, no CUDA.
#ifndef ROLLPACK_SCHEDULER_TOPOLOGY_H_
#define ROLLPACK_SCHEDULER_TOPOLOGY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "scheduler/scheduler_kind.h"

namespace rollpack {

// Work of one sequence of padded length L: linear * L + quadratic * L^2,
// shared equally by the ranks of its CP group.
struct CostModel {
  double linear = 6.0 * 4096;
  double quadratic = 1.0;

  double operator()(int64_t padded_length) const {
    const double l = static_cast<double>(padded_length);
    return linear * l + quadratic * l * l;
  }
};

// Forward FLOPs of one transformer sequence of length L, summed over
// `num_layers` layers: linear = layers * (8 h^2 + 4 h f) (QKV/O projections
// and the MLP, 2 FLOPs per multiply-add) and quadratic = layers * 4 h (QK^T and
// AV). ffn_hidden_size 0 means 4 h, which gives the default's 6h : 1 ratio.
// Only the ratio matters to the scheduler.
CostModel CostModelForTransformer(int64_t hidden_size, int num_layers,
                                  int64_t ffn_hidden_size = 0);

// Every size here is already normalised (>= 1); see NormalizeTopology in
// the server for how the wire's zeros and unset fields map to these.
struct Topology {
  int dp = 1;
  int cp = 1;
  int tp = 1;
  int pp = 1;
  int vpp = 1;
  bool sequence_parallel = true;
  int num_layers_in_first_pipeline_stage = 0;  // 0 = unset
  int num_layers_in_last_pipeline_stage = 0;   // 0 = unset
  int64_t max_tokens_per_rank = 0;             // T
  int pad_multiple = 1;
  int microbatch_group_size = 1;
  SchedulerKind scheduler = SchedulerKind::kStaticCp;
  int min_cp = 1;
  CostModel cost;

  // R: ranks of the DPxCP domain.
  int num_dpcp_ranks() const { return dp * cp; }
  // s of layout.md section 2.
  int sequence_parallel_size() const { return sequence_parallel ? tp : 1; }
};

// Checks the parts of a topology that do not depend on the model: positive
// sizes, the token budget, microbatch_group_size against vpp, min_cp for
// dynamic CP. Errors name the field and its value.
absl::Status ValidateTopologySizes(const Topology& topology);

// Alignment `a` of a sequence that runs on a CP group of size `cp_size`
// (layout.md section 2): lcm(2*c*s or s, pad_multiple).
int64_t SequenceAlignment(const Topology& topology, int cp_size);

inline int64_t CeilTo(int64_t x, int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

// Padded length of an n-token sequence on a CP group of size `cp_size`.
inline int64_t PaddedLength(const Topology& topology, int64_t n, int cp_size) {
  return CeilTo(n, SequenceAlignment(topology, cp_size));
}

// Smallest CP group the scheduler forms: min_cp for dynamic CP, cp for
// static CP. With MaxCpGroupSize, the sizes a plan's groups take are the
// powers-of-two multiples of this up to that.
int MinCpGroupSize(const Topology& topology);

// Largest allowed dynamic CP group: the largest power of two <= dp*cp.
// For static CP this is cp.
int MaxCpGroupSize(const Topology& topology);

// Longest sequence that fits on a CP group of `cp_size` ranks under the
// token budget: what a refusal of a too-long sequence names.
int64_t LargestLengthThatFits(const Topology& topology, int cp_size);

// Smallest CP group an n-token sequence fits on under the token budget, or 0
// when it fits on none (layout.md sections 8 and 9).
int MinCpGroupSizeFor(const Topology& topology, int64_t n);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_TOPOLOGY_H_
