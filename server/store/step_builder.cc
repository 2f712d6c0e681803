#include "server/store/step_builder.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "scheduler/layout.h"
#include "scheduler/pipeline_layers.h"
#include "scheduler/plan.h"
#include "scheduler/planner.h"

namespace rollpack {

absl::StatusOr<std::shared_ptr<const Step>> BuildStep(
    const std::string& step_id, const std::string& pool, const ModelSpec& model,
    const Topology& topology, std::vector<std::shared_ptr<const StoredSample>> samples) {
  RETURN_IF_ERROR(PipelineLayers::Create(model, topology));
  std::vector<int64_t> lengths;
  lengths.reserve(samples.size());
  const int largest = MaxCpGroupSize(topology);
  for (const auto& sample : samples) {
    const int64_t n = sample->num_tokens();
    if (MinCpGroupSizeFor(topology, n) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample \"", sample->sample_id, "\" has ", n,
          " tokens; the longest that fits on the largest CP group (", largest, " ranks x ",
          topology.max_tokens_per_rank, " max_tokens_per_rank) is ",
          LargestLengthThatFits(topology, largest)));
    }
    lengths.push_back(n);
  }
  ASSIGN_OR_RETURN(Plan plan, ComputePlan(lengths, topology));
  ASSIGN_OR_RETURN(StepLayout layout, StepLayout::Create(plan, lengths, topology, model));
  return std::make_shared<const Step>(step_id, pool, model, topology, std::move(samples),
                                      std::move(plan), std::move(layout));
}

}  // namespace rollpack
