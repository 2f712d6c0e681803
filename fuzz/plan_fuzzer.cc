// Plan creation: any lengths on any topology. Oracle: a plan ComputePlan
// returns passes ValidatePlan (every sequence exactly once, the token budget,
// group tiling, padded lengths) and is deterministic.
#include "fuzz/fuzz_common.h"
#include "scheduler/plan.h"
#include "scheduler/plan_validation.h"
#include "scheduler/planner.h"

using namespace rollpack;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const Topology topology = FuzzTopology(&in);
  const std::vector<int64_t> lengths = FuzzLengths(&in);
  if (!ValidateTopologySizes(topology).ok()) return 0;
  absl::StatusOr<Plan> plan = ComputePlan(lengths, topology);
  if (!plan.ok()) {
    FUZZ_CHECK(!plan.status().message().empty());
    return 0;
  }
  absl::Status valid = ValidatePlan(*plan, lengths, topology);
  if (!valid.ok()) std::fprintf(stderr, "%s\n", valid.ToString().c_str());
  FUZZ_CHECK(valid.ok());
  absl::StatusOr<Plan> again = ComputePlan(lengths, topology);
  FUZZ_CHECK(again.ok() && again->microbatches.size() == plan->microbatches.size());
  for (size_t m = 0; m < plan->microbatches.size(); ++m) {
    const auto& a = plan->microbatches[m].groups;
    const auto& b = again->microbatches[m].groups;
    FUZZ_CHECK(a.size() == b.size());
    for (size_t g = 0; g < a.size(); ++g) {
      FUZZ_CHECK(a[g].first_rank == b[g].first_rank && a[g].cp_size == b[g].cp_size &&
                 a[g].sequences == b[g].sequences && a[g].padded_lengths == b[g].padded_lengths);
    }
  }
  return 0;
}
