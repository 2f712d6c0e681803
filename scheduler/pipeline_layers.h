// Which decoder layers every pipeline rank owns, and which of them it replays
// routing for (layout.md sections 6 and 10). Pure C++: no gRPC, no CUDA.
//
// Megatron-Core semantics (get_transformer_layer_offset /
// get_num_layers_to_build): stage p holds c_p * vpp layers in vpp model
// chunks of c_p consecutive layers each; chunk (p, v) starts at
//   v * sum_p(c_p) + sum_{q < p} c_q.
// Without F/Z every c_p = N / (pp * vpp), so the start is
// v*N/vpp + p*N/(pp*vpp). With F = num_layers_in_first_pipeline_stage and/or
// Z = num_layers_in_last_pipeline_stage (0 = unset), the first/last stage
// holds F/Z layers and the remaining layers are split evenly over the
// remaining ("middle") stages.
#ifndef ROLLPACK_SCHEDULER_PIPELINE_LAYERS_H_
#define ROLLPACK_SCHEDULER_PIPELINE_LAYERS_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/model_spec.h"
#include "scheduler/topology.h"

namespace rollpack {

// Global layer ids owned by each pipeline rank p = 0..pp-1, ascending (the
// union of the rank's vpp model chunks; ascending id = model chunk order).
// Uses only topology.pp, vpp, num_layers_in_first_pipeline_stage and
// num_layers_in_last_pipeline_stage (all assumed already >= 0 / >= 1 as
// ValidateTopologySizes checks).
//
// INVALID_ARGUMENT naming the numbers when: num_layers < 1; layers are not
// divisible as required (N by pp*vpp without F/Z; the middle layers by the
// middle stages; a stage's count by vpp); any stage or chunk gets no layer;
// F + Z > N; F or Z set with pp = 1; vpp > 1 with pp = 1; vpp > 1 with both F
// and Z set and pp = 2 (no middle stage, which Megatron cannot build).
absl::StatusOr<std::vector<std::vector<int>>> AssignPipelineLayers(
    int num_layers, const Topology& topology);

// Where a sample's `routed_experts` layer axis comes from (layout.md
// sections 1 and 10). `mtp_layers` is the model's routed MTP layers
// (ModelSpec::routed_mtp_layers(): D with mtp_routing, else 0); they follow
// the decoder's entries in both layouts.
enum class PayloadLayout {
  kFull,     // L_payload == N + D: axis index = global layer id.
  kCompact,  // L_payload == |M| + D: axis index = position in M, then |M| + d.
};

// The layout of a payload with `payload_layers` entries on its layer axis for
// a model with `num_layers` layers, resolved MoE layers `moe_layers` and
// `mtp_layers` routed MTP layers. When N == |M| (every layer is MoE) both
// layouts coincide and kFull is returned. INVALID_ARGUMENT naming the
// numbers when payload_layers is neither.
absl::StatusOr<PayloadLayout> DetectPayloadLayout(
    int payload_layers, int num_layers, absl::Span<const int> moe_layers,
    int mtp_layers = 0);

// Payload layer index of MoE layer `global_layer`: the layer itself (kFull)
// or its position in `moe_layers` (kCompact); for MTP layer d (global layer
// N + d, d < mtp_layers): N + d (kFull) or |M| + d (kCompact).
// INVALID_ARGUMENT when global_layer is neither in `moe_layers` (dense layers
// carry no routing) nor a routed MTP layer, or is outside
// [0, num_layers + mtp_layers).
absl::StatusOr<int> PayloadLayerIndex(PayloadLayout layout, int num_layers,
                                      absl::Span<const int> moe_layers,
                                      int global_layer, int mtp_layers = 0);

// The layers of one pipeline rank.
struct PipelineStage {
  int pp_rank = 0;
  // Owned decoder layers (global ids, ascending), MTP layers excluded
  // (layout.md section 6).
  std::vector<int> layers;
  // Owned layers that are MoE layers (in M), ascending, then on the last
  // stage with mtp_routing the MTP layers N..N+D-1 (section 10): the
  // `replay_layers` of the response, and the layer axis of its
  // `replay_experts`.
  std::vector<int> replay_layers;
  // Index of each replay layer in the stored layout [rows, |M| + D, K]:
  // its position in M, or |M| + d for MTP layer d (same length as
  // replay_layers).
  std::vector<int> replay_positions;
};

// Pipeline layer assignment of one model on one topology, computed once.
// Immutable after Create, so every const method is thread-safe.
class PipelineLayers {
 public:
  // Validates `model` (ValidateModelSpec) and runs AssignPipelineLayers;
  // returns their errors unchanged. A dense model (E = 0) has M empty: every
  // stage gets no replay layers. With mtp_routing the last stage's replay
  // layers end with the MTP layers.
  static absl::StatusOr<PipelineLayers> Create(const ModelSpec& model,
                                               const Topology& topology);

  int num_stages() const { return static_cast<int>(stages_.size()); }
  // Resolved M (empty for a dense model).
  const std::vector<int>& moe_layers() const { return moe_layers_; }
  // Layers on the stored layer axis, |M| + routed D (ModelSpec::
  // stored_layers()): the source payload_layers of a replay gather.
  int stored_layers() const { return stored_layers_; }
  const std::vector<PipelineStage>& stages() const { return stages_; }
  // Requires 0 <= pp_rank < num_stages() (checked by StepLayout; use
  // Stage() for an unchecked caller).
  const PipelineStage& stage(int pp_rank) const { return stages_[pp_rank]; }
  // INVALID_ARGUMENT naming pp_rank when it is outside [0, pp).
  absl::StatusOr<const PipelineStage*> Stage(int pp_rank) const;

 private:
  std::vector<int> moe_layers_;
  int stored_layers_ = 0;
  std::vector<PipelineStage> stages_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_PIPELINE_LAYERS_H_
