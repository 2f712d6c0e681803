#include "base/status_macros.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

int evaluations = 0;

absl::Status Fail(absl::StatusCode code) {
  ++evaluations;
  return absl::Status(code, "broken");
}

absl::StatusOr<std::unique_ptr<int>> MakeInt(bool ok) {
  ++evaluations;
  if (!ok) return absl::InvalidArgumentError("no int");
  return std::make_unique<int>(7);
}

absl::Status ReturnsFirstError(bool first_ok) {
  RETURN_IF_ERROR(first_ok ? absl::OkStatus() : Fail(absl::StatusCode::kNotFound));
  RETURN_IF_ERROR(Fail(absl::StatusCode::kDataLoss));
  return absl::OkStatus();
}

absl::StatusOr<int> AssignsMoveOnlyValues(bool ok) {
  ASSIGN_OR_RETURN(std::unique_ptr<int> value, MakeInt(ok));
  ASSIGN_OR_RETURN(auto again, MakeInt(true));  // two in one scope
  return *value + *again;
}

TEST(StatusMacrosTest, ReturnIfErrorReturnsTheFirstErrorAndEvaluatesOnce) {
  evaluations = 0;
  EXPECT_EQ(ReturnsFirstError(false).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(evaluations, 1);
  EXPECT_EQ(ReturnsFirstError(true).code(), absl::StatusCode::kDataLoss);
}

TEST(StatusMacrosTest, ReturnIfErrorTakesAStatusOr) {
  auto f = []() -> absl::Status {
    RETURN_IF_ERROR(MakeInt(false));
    return absl::OkStatus();
  };
  EXPECT_EQ(f().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StatusMacrosTest, AssignOrReturnAssignsOrReturns) {
  absl::StatusOr<int> ok = AssignsMoveOnlyValues(true);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 14);
  absl::StatusOr<int> refused = AssignsMoveOnlyValues(false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "no int");
}

TEST(StatusMacrosTest, AnnotateKeepsCodeAndPayloads) {
  absl::Status s = absl::UnavailableError("member down");
  s.SetPayload("rollpack/resume", absl::Cord("3"));
  const absl::Status annotated = Annotate(s, "fetch step \"s1\"");
  EXPECT_EQ(annotated.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(annotated.message(), "fetch step \"s1\": member down");
  EXPECT_EQ(annotated.GetPayload("rollpack/resume"), absl::Cord("3"));
  EXPECT_TRUE(Annotate(absl::OkStatus(), "anything").ok());
}

}  // namespace
}  // namespace rollpack
