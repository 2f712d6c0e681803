#include "scheduler/pipeline_layers.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace rollpack {
namespace {

absl::Status LayoutError(int num_layers, const Topology& t,
                         absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "pipeline layers: ", what, " (num_layers ", num_layers, ", pp ", t.pp,
      ", vpp ", t.vpp, ", num_layers_in_first_pipeline_stage ",
      t.num_layers_in_first_pipeline_stage,
      ", num_layers_in_last_pipeline_stage ",
      t.num_layers_in_last_pipeline_stage, ")"));
}

}  // namespace

absl::StatusOr<std::vector<std::vector<int>>> AssignPipelineLayers(
    int num_layers, const Topology& t) {
  const int n = num_layers;
  const int pp = t.pp;
  const int vpp = t.vpp;
  const int f = t.num_layers_in_first_pipeline_stage;
  const int z = t.num_layers_in_last_pipeline_stage;
  if (n < 1) return LayoutError(n, t, absl::StrCat("num_layers ", n, " must be >= 1"));
  if (pp < 1 || vpp < 1) {
    return LayoutError(n, t, "pp and vpp must be >= 1");
  }
  if (f < 0 || z < 0) {
    return LayoutError(n, t, "first/last stage layer counts must not be negative");
  }
  if (pp == 1 && (f > 0 || z > 0)) {
    return LayoutError(
        n, t, "num_layers_in_first/last_pipeline_stage need pp > 1");
  }
  if (pp == 1 && vpp > 1) {
    return LayoutError(n, t, absl::StrCat("vpp ", vpp, " > 1 needs pp > 1"));
  }
  // In 64 bits: the counts come from requests and records (fuzz_topology
  // found INT_MAX + 2).
  if (int64_t{f} + z > n) {
    return LayoutError(n, t,
                       absl::StrCat("first + last stage layers ", f, " + ", z,
                                    " = ", int64_t{f} + z, " exceed num_layers ", n));
  }
  if (vpp > 1 && f > 0 && z > 0 && pp == 2) {
    return LayoutError(
        n, t,
        "vpp > 1 with both first and last stage layer counts set needs a "
        "middle stage (pp > 2)");
  }

  // stage_layers[p]: layers of stage p over all its chunks.
  std::vector<int> stage_layers(pp);
  if (f == 0 && z == 0) {
    if (n % (int64_t{pp} * vpp) != 0) {
      return LayoutError(n, t,
                         absl::StrCat("num_layers ", n,
                                      " is not divisible by pp * vpp = ",
                                      int64_t{pp} * vpp));
    }
    std::fill(stage_layers.begin(), stage_layers.end(), n / pp);
  } else {
    const int middle_stages = pp - (f > 0 ? 1 : 0) - (z > 0 ? 1 : 0);
    const int middle_layers = n - f - z;
    int per_middle = 0;
    if (middle_stages == 0) {
      if (middle_layers != 0) {
        return LayoutError(
            n, t,
            absl::StrCat(middle_layers,
                         " layers left after the first and last stages but "
                         "no middle stage to hold them"));
      }
    } else {
      if (middle_layers % middle_stages != 0) {
        return LayoutError(
            n, t,
            absl::StrCat("middle layers ", middle_layers,
                         " are not divisible by the middle stages ",
                         middle_stages));
      }
      per_middle = middle_layers / middle_stages;
      if (per_middle == 0) {
        return LayoutError(
            n, t,
            absl::StrCat("no layer left for the ", middle_stages,
                         " middle stage(s) (", middle_layers,
                         " middle layers)"));
      }
    }
    for (int p = 0; p < pp; ++p) {
      if (p == 0 && f > 0) {
        stage_layers[p] = f;
      } else if (p == pp - 1 && z > 0) {
        stage_layers[p] = z;
      } else {
        stage_layers[p] = per_middle;
      }
    }
  }
  // Layers per chunk of each stage.
  std::vector<int> chunk(pp);
  for (int p = 0; p < pp; ++p) {
    if (stage_layers[p] == 0) {
      return LayoutError(n, t, absl::StrCat("pipeline stage ", p, " has no layer"));
    }
    if (stage_layers[p] % vpp != 0) {
      return LayoutError(
          n, t,
          absl::StrCat("pipeline stage ", p, "'s ", stage_layers[p],
                       " layers are not divisible by vpp ", vpp));
    }
    chunk[p] = stage_layers[p] / vpp;
  }
  const int per_virtual_stage = std::accumulate(chunk.begin(), chunk.end(), 0);
  std::vector<std::vector<int>> out(pp);
  for (int p = 0; p < pp; ++p) {
    const int prefix = std::accumulate(chunk.begin(), chunk.begin() + p, 0);
    out[p].reserve(stage_layers[p]);
    for (int v = 0; v < vpp; ++v) {
      const int start = v * per_virtual_stage + prefix;
      for (int i = 0; i < chunk[p]; ++i) out[p].push_back(start + i);
    }
  }
  return out;
}

absl::StatusOr<PayloadLayout> DetectPayloadLayout(
    int payload_layers, int num_layers, absl::Span<const int> moe_layers, int mtp_layers) {
  const int64_t full = int64_t{num_layers} + mtp_layers;
  const int64_t compact = static_cast<int64_t>(moe_layers.size()) + mtp_layers;
  if (payload_layers == full) return PayloadLayout::kFull;
  if (payload_layers == compact) return PayloadLayout::kCompact;
  if (mtp_layers == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "routed_experts has ", payload_layers,
        " layers, expected num_layers ", num_layers, " (full) or |moe_layers| ",
        moe_layers.size(), " (compact)"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "routed_experts has ", payload_layers, " layers, expected num_layers + num_mtp_layers ",
      num_layers, " + ", mtp_layers, " = ", full, " (full) or |moe_layers| + num_mtp_layers ",
      moe_layers.size(), " + ", mtp_layers, " = ", compact, " (compact)"));
}

absl::StatusOr<int> PayloadLayerIndex(PayloadLayout layout, int num_layers,
                                      absl::Span<const int> moe_layers,
                                      int global_layer, int mtp_layers) {
  if (global_layer < 0 || int64_t{global_layer} >= int64_t{num_layers} + mtp_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", global_layer, " is outside [0, num_layers",
        mtp_layers > 0 ? " + num_mtp_layers" : "", " = ", int64_t{num_layers} + mtp_layers,
        ")"));
  }
  if (global_layer >= num_layers) {  // MTP layer d = global_layer - N
    if (layout == PayloadLayout::kFull) return global_layer;
    return static_cast<int>(moe_layers.size()) + (global_layer - num_layers);
  }
  auto it = std::lower_bound(moe_layers.begin(), moe_layers.end(), global_layer);
  if (it == moe_layers.end() || *it != global_layer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layer ", global_layer, " is not a MoE layer: it has no routing payload"));
  }
  if (layout == PayloadLayout::kFull) return global_layer;
  return static_cast<int>(it - moe_layers.begin());
}

absl::StatusOr<PipelineLayers> PipelineLayers::Create(const ModelSpec& model,
                                                      const Topology& topology) {
  RETURN_IF_ERROR(ValidateModelSpec(model));
  auto assigned = AssignPipelineLayers(model.num_layers, topology);
  if (!assigned.ok()) return assigned.status();
  PipelineLayers out;
  out.moe_layers_ = model.ResolvedMoeLayers();
  const std::vector<int>& m = out.moe_layers_;
  out.stages_.resize(assigned->size());
  for (size_t p = 0; p < assigned->size(); ++p) {
    PipelineStage& stage = out.stages_[p];
    stage.pp_rank = static_cast<int>(p);
    stage.layers = std::move((*assigned)[p]);
    for (int l : stage.layers) {
      auto it = std::lower_bound(m.begin(), m.end(), l);
      if (it != m.end() && *it == l) {
        stage.replay_layers.push_back(l);
        stage.replay_positions.push_back(static_cast<int>(it - m.begin()));
      }
    }
  }
  // MTP routers are built after the decoder's, on the last stage only
  // (layout.md section 10).
  const int mtp = model.is_dense() ? 0 : model.routed_mtp_layers();
  PipelineStage& last = out.stages_.back();
  for (int d = 0; d < mtp; ++d) {
    last.replay_layers.push_back(model.num_layers + d);
    last.replay_positions.push_back(static_cast<int>(m.size()) + d);
  }
  out.stored_layers_ = static_cast<int>(m.size()) + mtp;
  return out;
}

absl::StatusOr<const PipelineStage*> PipelineLayers::Stage(int pp_rank) const {
  if (pp_rank < 0 || pp_rank >= num_stages()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pp rank ", pp_rank, " is outside [0, pp = ", num_stages(), ")"));
  }
  return &stages_[pp_rank];
}

}  // namespace rollpack
