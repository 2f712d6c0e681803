// What every trainer rank (dp, cp, tp, pp) receives for every micro-batch of
// a step (layout.md sections 2 to 5, 7 and 8): the CP group, cu_seqlens, the
// CP-local zigzag stream and the sequence-parallel router rows, as runs of
// rows that the gather functions of layout_gather.h turn into bytes.
// Pure C++: no gRPC, no protobuf, no CUDA.
//
// Typical use (server):
//   ASSIGN_OR_RETURN(StepLayout layout,
//                    StepLayout::Create(plan, lengths, topology, model));
//   // ... for every request, concurrently:
//   RankMicrobatchLayout rank;            // reusable scratch, one per thread
//   RETURN_IF_ERROR(layout.Describe({dp, cp, tp, pp}, m, &rank));
//   GatherRows(rank.token_runs, sizeof(int32_t), token_source, tokens_out);
//   GatherReplay(rank.router_runs, replay_spec, replay_source, experts, mask);
#ifndef ROLLPACK_SCHEDULER_LAYOUT_H_
#define ROLLPACK_SCHEDULER_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/model_spec.h"
#include "scheduler/pipeline_layers.h"
#include "scheduler/plan.h"
#include "scheduler/topology.h"

namespace rollpack {

// Coordinates of one trainer rank.
struct RankCoords {
  int dp = 0;
  int cp = 0;
  int tp = 0;
  int pp = 0;
};

// A run of consecutive rows of one rank's output that come from consecutive
// positions of one padded sequence, all real or all padding.
struct RowRun {
  // Ordinal j of the sequence in the micro-batch's pack order (index into
  // GroupLayout::sequences / cu_seqlens).
  int ordinal = 0;
  // Index of the sequence in the step's sequence list (= sequences[ordinal]).
  int sequence = 0;
  // First position within the padded sequence, in [0, p_j).
  int64_t source_pos = 0;
  // Number of rows (>= 1).
  int64_t length = 0;
  // True when every position of the run is padding (>= n_j); false when
  // every position is a real token (< n_j). Runs never straddle n_j.
  bool padding = false;
  // Position q of the first row in the micro-batch's padded stream:
  // cu_seqlens_padded[ordinal] + source_pos. The replay filler uses it.
  int64_t stream_pos = 0;
  // First row of the run in the output it describes (the CP-local stream
  // for token runs, the router rows for router runs). Runs are in output
  // order and tile [0, total rows) without gaps.
  int64_t output_row = 0;
};

// One CP group of one micro-batch: shared by all its ranks (every cp, tp and
// pp rank inside the group).
struct GroupLayout {
  int microbatch = 0;
  // Index in the plan's PlanMicrobatch::groups.
  int group_index = 0;
  // DPxCP ranks [first_rank, first_rank + cp_size), rank id = dp*cp + cp.
  int first_rank = 0;
  int cp_size = 1;  // local_cp_size
  // Indices into the step's sequence list, in pack order.
  std::vector<int> sequences;
  // n_j and p_j (section 2 for this group's cp_size), in pack order.
  std::vector<int64_t> lengths;
  std::vector<int64_t> padded_lengths;
  // int32 [S + 1] over n_j and over p_j (section 3).
  std::vector<int32_t> cu_seqlens;
  std::vector<int32_t> cu_seqlens_padded;
  int32_t max_seqlen = 0;  // max p_j
  // T_r: rows of every rank's CP-local stream, sum(p_j) / cp_size.
  int64_t tokens_per_rank = 0;
  // Estimated work of each rank of the group (the plan's cost model).
  double work_per_rank = 0;
};

// Everything one rank receives for one micro-batch, except the bytes.
// Refers into the StepLayout that filled it (group, replay layers): valid as
// long as that StepLayout lives. Reuse one object across calls to Describe
// to avoid reallocating the run vectors.
struct RankMicrobatchLayout {
  RankCoords coords;
  int microbatch = 0;
  int num_microbatches = 0;
  const GroupLayout* group = nullptr;
  int local_cp_size = 1;
  int local_cp_rank = 0;
  // T_r: rows of the CP-local stream (= group->tokens_per_rank).
  int64_t local_tokens = 0;
  // The CP-local zigzag stream (section 4): `tokens` and every token field.
  // Tiles output rows [0, local_tokens).
  std::vector<RowRun> token_runs;
  // The router rows (section 5): local rows [router_row_begin,
  // router_row_begin + router_rows) of the CP-local stream; their output_row
  // counts from 0 (the row of replay_experts / replay_mask). With
  // sequence_parallel and tp > 1: [t*T_r/tp, (t+1)*T_r/tp); else all T_r.
  int64_t router_row_begin = 0;
  int64_t router_rows = 0;
  std::vector<RowRun> router_runs;
  // This pp rank's replay layers (global ids, ascending) and their positions
  // in M (the compact payload's layer index). Empty for a dense model or a
  // stage without MoE layers.
  absl::Span<const int> replay_layers;
  absl::Span<const int> replay_positions;
  // Whether this rank is the first / last pipeline stage (tokens go to the
  // first, token_fields to the last, unless the client asks for every stage).
  bool first_pipeline_stage = false;
  bool last_pipeline_stage = false;
};

// The layout of one step, built once from its plan; answers any rank and
// micro-batch in O(S + runs) without per-token work. Immutable after Create:
// every const method is thread-safe (no internal caching or mutation).
class StepLayout {
 public:
  // `lengths[i]` = n_i of the step's sequence i (the plan's indices).
  // Validates, returning INVALID_ARGUMENT naming the field and value:
  //  - the topology (ValidateTopologySizes) and the model (ValidateModelSpec);
  //  - the pipeline layer assignment (AssignPipelineLayers: section 6);
  //  - the plan against the layout's invariants: num_dpcp_ranks = dp*cp;
  //    micro-batch count >= 1 and a multiple of microbatch_group_size; every
  //    micro-batch's groups sorted, tiling [0, dp*cp) with sizes = cp
  //    (static CP) or powers of two in [min_cp, MaxCpGroupSize] starting at a
  //    multiple of their size (dynamic CP); no empty group; every sequence
  //    index in range and used exactly once in the step; n_i >= 1;
  //    padded_lengths equal section 2's; tokens_per_rank = sum(p_j)/cp_size
  //    and <= max_tokens_per_rank (section 9); cu_seqlens_padded fits int32.
  static absl::StatusOr<StepLayout> Create(const Plan& plan,
                                           absl::Span<const int64_t> lengths,
                                           const Topology& topology,
                                           const ModelSpec& model);

  const Topology& topology() const { return topology_; }
  const ModelSpec& model() const { return model_; }
  const PipelineLayers& pipeline() const { return pipeline_; }
  int num_microbatches() const { return num_microbatches_; }
  absl::Span<const int64_t> lengths() const { return lengths_; }

  // Groups of micro-batch m, sorted by first_rank. Requires a valid m.
  absl::Span<const GroupLayout> groups(int microbatch) const;

  // INVALID_ARGUMENT naming the coordinate and its value when a coordinate
  // is outside [0, dp), [0, cp), [0, tp), [0, pp).
  absl::Status ValidateCoords(const RankCoords& coords) const;

  // The group of micro-batch m that holds DPxCP rank id `dpcp_rank`
  // (= dp*cp + cp). OUT_OF_RANGE naming m when it is outside
  // [0, num_microbatches); INVALID_ARGUMENT when dpcp_rank is outside
  // [0, dp*cp).
  absl::StatusOr<const GroupLayout*> GroupOf(int microbatch,
                                             int dpcp_rank) const;

  // Fills `out` for rank `coords` and micro-batch m (reusing its vectors'
  // capacity). Errors as ValidateCoords and GroupOf; `out` is unspecified
  // after an error.
  absl::Status Describe(const RankCoords& coords, int microbatch,
                        RankMicrobatchLayout* out) const;
  // Same, returning a fresh object.
  absl::StatusOr<RankMicrobatchLayout> Describe(const RankCoords& coords,
                                                int microbatch) const;

 private:
  StepLayout() = default;

  Topology topology_;
  ModelSpec model_;
  PipelineLayers pipeline_;
  std::vector<int64_t> lengths_;
  int num_microbatches_ = 0;
  // groups_[group_begin_[m] .. group_begin_[m + 1]) are micro-batch m's.
  std::vector<GroupLayout> groups_;
  std::vector<int> group_begin_;
};

// The CP-local zigzag runs of CP rank `local_cp_rank` in a group of size
// `cp_size` (section 4), appended to `out` (which is cleared first).
// Exposed for the scheduler, the CLI and tests; Describe uses it.
void AppendZigzagRuns(const GroupLayout& group, int local_cp_rank,
                      std::vector<RowRun>* out);

// The runs covering output rows [begin, begin + count) of `runs` (which tile
// [0, total)), re-based so the first has output_row 0; appended to `out`
// (cleared first). Used for the sequence-parallel router rows.
void SliceRuns(absl::Span<const RowRun> runs, int64_t begin, int64_t count,
               std::vector<RowRun>* out);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_LAYOUT_H_
