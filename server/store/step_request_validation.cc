#include "server/store/step_request_validation.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "scheduler/advantages.h"
#include "scheduler/sample_selection.h"
#include "scheduler/topology.h"
#include "server/store/names.h"

namespace rollpack {

absl::Status ValidateStepRequest(const StepRequest& request) {
  RETURN_IF_ERROR(ValidateName("step_id", request.step_id, kMaxStepIdBytes));
  RETURN_IF_ERROR(ValidateName("pool name", request.pool, kMaxPoolNameBytes));
  const std::string step_name = absl::StrCat("step \"", request.step_id, "\"");
  const SelectionRequest& s = request.selection;
  const int given = !request.sample_ids.empty() + (s.num_samples > 0) + (s.num_groups > 0) +
                    (s.num_tokens > 0);
  if (given != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        step_name,
        ": give exactly one of sample_ids, num_samples, num_groups, num_tokens (> 0); got ",
        request.sample_ids.size(), " sample_ids, num_samples ", s.num_samples, ", num_groups ",
        s.num_groups, ", num_tokens ", s.num_tokens));
  }
  if (s.num_samples < 0 || s.num_groups < 0 || s.num_tokens < 0 ||
      (s.max_staleness.has_value() && *s.max_staleness < 0) || s.policy_version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(step_name, ": amounts, policy_version and max_staleness must be >= 0"));
  }
  RETURN_IF_ERROR(ValidateTopologySizes(request.topology));
  RETURN_IF_ERROR(ValidateAdvantageRequest(request.advantage, step_name));
  // What the request states outright is over the limit before any sample
  // is listed, on this server or a peer.
  RETURN_IF_ERROR(CheckStepSize(static_cast<int64_t>(request.sample_ids.size()), s, step_name));
  return CheckStepSize(s.num_samples, s, step_name);
}

}  // namespace rollpack
