#include "server/store/step_request_validation.h"

#include <string>

#include "gtest/gtest.h"

namespace rollpack {
namespace {

StepRequest Valid() {
  StepRequest request;
  request.step_id = "s1";
  request.pool = "p";
  request.selection.num_samples = 4;
  request.topology.max_tokens_per_rank = 1024;
  return request;
}

void ExpectRefused(const StepRequest& request, absl::StatusCode code, const std::string& message) {
  const absl::Status status = ValidateStepRequest(request);
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_EQ(status.message(), message);
}

TEST(ValidateStepRequestTest, AcceptsEachSingleAmountAndExplicitIds) {
  EXPECT_TRUE(ValidateStepRequest(Valid()).ok()) << ValidateStepRequest(Valid());
  StepRequest ids = Valid();
  ids.selection.num_samples = 0;
  ids.sample_ids = {"a", "b"};
  EXPECT_TRUE(ValidateStepRequest(ids).ok()) << ValidateStepRequest(ids);
  StepRequest groups = Valid();
  groups.selection.num_samples = 0;
  groups.selection.num_groups = 2;
  EXPECT_TRUE(ValidateStepRequest(groups).ok()) << ValidateStepRequest(groups);
  StepRequest tokens = Valid();
  tokens.selection.num_samples = 0;
  tokens.selection.num_tokens = 4096;
  EXPECT_TRUE(ValidateStepRequest(tokens).ok()) << ValidateStepRequest(tokens);
}

TEST(ValidateStepRequestTest, RefusesBadNames) {
  StepRequest request = Valid();
  request.step_id.clear();
  ExpectRefused(request, absl::StatusCode::kInvalidArgument, "step_id is empty");
  request = Valid();
  request.pool = std::string(129, 'p');
  ExpectRefused(request, absl::StatusCode::kInvalidArgument, "pool name has 129 bytes, at most 128");
}

TEST(ValidateStepRequestTest, RefusesNoneOrTwoAmounts) {
  StepRequest none = Valid();
  none.selection.num_samples = 0;
  ExpectRefused(none, absl::StatusCode::kInvalidArgument,
                "step \"s1\": give exactly one of sample_ids, num_samples, num_groups, "
                "num_tokens (> 0); got 0 sample_ids, num_samples 0, num_groups 0, num_tokens 0");
  StepRequest two = Valid();
  two.sample_ids = {"a"};
  ExpectRefused(two, absl::StatusCode::kInvalidArgument,
                "step \"s1\": give exactly one of sample_ids, num_samples, num_groups, "
                "num_tokens (> 0); got 1 sample_ids, num_samples 4, num_groups 0, num_tokens 0");
}

TEST(ValidateStepRequestTest, RefusesNegativeAmountsAndBounds) {
  StepRequest request = Valid();
  request.selection.num_groups = -1;
  ExpectRefused(request, absl::StatusCode::kInvalidArgument,
                "step \"s1\": amounts, policy_version and max_staleness must be >= 0");
  request = Valid();
  request.selection.max_staleness = -1;
  ExpectRefused(request, absl::StatusCode::kInvalidArgument,
                "step \"s1\": amounts, policy_version and max_staleness must be >= 0");
}

TEST(ValidateStepRequestTest, RefusesTopologyAndAdvantageByField) {
  StepRequest request = Valid();
  request.topology.dp = 0;
  ExpectRefused(request, absl::StatusCode::kInvalidArgument, "topology: dp is 0, must be >= 1");
  request = Valid();
  request.advantage.eps = -1;
  const absl::Status status = ValidateStepRequest(request);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message().rfind("step \"s1\": advantage_eps is -1", 0), 0u) << status;
}

TEST(ValidateStepRequestTest, RefusesWhatItStatesOverTheStepLimit) {
  StepRequest asked = Valid();
  asked.selection.max_samples = 3;
  ExpectRefused(asked, absl::StatusCode::kResourceExhausted,
                "step \"s1\": the step would take 4 samples; the server plans at most 3 per step "
                "(--max-samples-per-step): ask for fewer");
  StepRequest listed = Valid();
  listed.selection.num_samples = 0;
  listed.sample_ids = {"a", "b", "c", "d", "e"};
  listed.selection.max_samples = 4;
  ExpectRefused(listed, absl::StatusCode::kResourceExhausted,
                "step \"s1\": the step would take 5 samples; the server plans at most 4 per step "
                "(--max-samples-per-step): ask for fewer");
  // Groups and tokens are counted when the samples are listed, not here.
  StepRequest groups = Valid();
  groups.selection.num_samples = 0;
  groups.selection.num_groups = 100;
  groups.selection.max_samples = 4;
  EXPECT_TRUE(ValidateStepRequest(groups).ok());
}

}  // namespace
}  // namespace rollpack
