#include "server/store/step_holds.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

StepHolds::Hold MakeHold(const std::string& pool, std::vector<std::string> ids, int64_t attempt,
                         absl::Time held_at) {
  StepHolds::Hold hold;
  hold.pool = pool;
  hold.sample_ids = std::move(ids);
  hold.coordinator = "m0";
  hold.attempt = attempt;
  hold.held_at = held_at;
  return hold;
}

TEST(StepHoldsTest, GetNamesTheStepAndTheAttempt) {
  StepHolds holds;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  holds.Add("s1", MakeHold("p", {"a", "b"}, 7, t0));
  ASSERT_TRUE(holds.contains("s1"));
  EXPECT_EQ(holds.Attempt("s1"), 7);
  EXPECT_EQ(holds.Attempt("s2"), 0);
  EXPECT_EQ(holds.Find("s2"), nullptr);
  ASSERT_TRUE(holds.Get("s1").ok());
  ASSERT_TRUE(holds.Get("s1", 7).ok());
  absl::StatusOr<const StepHolds::Hold*> other = holds.Get("s1", 8);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(other.status().message(), HasSubstr("\"s1\" holds no samples here for this attempt"));
  EXPECT_EQ(holds.Get("s2").status().code(), absl::StatusCode::kNotFound);
  holds.Erase("s1");
  EXPECT_TRUE(holds.empty());
}

TEST(StepHoldsTest, UnconfirmedHoldsAreThoseTakenBeforeTheCutoff) {
  StepHolds holds;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  holds.Add("old", MakeHold("p", {"a"}, 1, t0));
  holds.Add("new", MakeHold("p", {"b"}, 1, t0 + absl::Seconds(10)));
  holds.Add("confirmed", MakeHold("p", {"c"}, 1, t0));
  ASSERT_TRUE(holds.Confirm("confirmed").ok());
  EXPECT_EQ(holds.Confirm("none").code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(holds.Unconfirmed(t0 + absl::Seconds(5)), ElementsAre("old"));
  EXPECT_THAT(holds.Unconfirmed(t0 + absl::Seconds(10)), ElementsAre("new", "old"));
  EXPECT_THAT(holds.Ids(), ElementsAre("confirmed", "new", "old"));
}

TEST(StepHoldsTest, IdsAndHolderByPool) {
  StepHolds holds;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  holds.Add("s2", MakeHold("p", {"a"}, 1, t0));
  holds.Add("s1", MakeHold("p", {"b", "c"}, 1, t0));
  holds.Add("s3", MakeHold("q", {"c"}, 1, t0));
  EXPECT_THAT(holds.Ids("p"), ElementsAre("s1", "s2"));
  EXPECT_THAT(holds.Ids("q"), ElementsAre("s3"));
  EXPECT_TRUE(holds.Ids("r").empty());
  EXPECT_EQ(holds.HolderOf("p", "c"), "s1");
  EXPECT_EQ(holds.HolderOf("q", "c"), "s3");
  EXPECT_EQ(holds.HolderOf("q", "a"), "");
}

TEST(StepHoldsTest, PositionsFollowTheAskedOrderAndNameAMissingSample) {
  StepHolds holds;
  holds.Add("s", MakeHold("p", {"a", "b", "c"}, 1, absl::UnixEpoch()));
  absl::StatusOr<std::vector<size_t>> at = holds.Positions("s", {"c", "a"});
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_THAT(*at, ElementsAre(2, 0));
  absl::StatusOr<std::vector<size_t>> missing = holds.Positions("s", {"a", "x"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("sample \"x\" is not held here for step \"s\""));
  EXPECT_EQ(holds.Positions("t", {"a"}).status().code(), absl::StatusCode::kNotFound);
}

TEST(StepHoldsTest, RecomputeRoutingOnlyForRecomputeHolds) {
  StepHolds holds;
  StepHolds::Hold rollout = MakeHold("p", {"a"}, 1, absl::UnixEpoch());
  holds.Add("rollout", rollout);
  StepHolds::Hold recompute = MakeHold("p", {"a", "b"}, 1, absl::UnixEpoch());
  recompute.recompute = true;
  recompute.recompute_routing = {std::make_shared<const std::string>("ra"),
                                 std::make_shared<const std::string>("rb")};
  holds.Add("recompute", recompute);
  EXPECT_EQ(holds.RecomputeRouting("rollout", {"a"}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::vector<std::shared_ptr<const std::string>>> routing =
      holds.RecomputeRouting("recompute", {"b", "a"});
  ASSERT_TRUE(routing.ok()) << routing.status();
  ASSERT_EQ(routing->size(), 2u);
  EXPECT_EQ(*(*routing)[0], "rb");
  EXPECT_EQ(*(*routing)[1], "ra");
  EXPECT_EQ(holds.RecomputeRouting("recompute", {"c"}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(StepHoldsTest, RecordIsTheHoldSamplesRecordOfItsFields) {
  StepHolds::Hold a = MakeHold("p", {"a", "b"}, 3, absl::UnixEpoch());
  StepHolds::Hold b = a;
  b.reuse_samples = true;
  EXPECT_FALSE(StepHolds::Record("s", a).empty());
  EXPECT_NE(StepHolds::Record("s", a), StepHolds::Record("s", b));
  EXPECT_NE(StepHolds::Record("s", a), StepHolds::Record("t", a));
}

}  // namespace
}  // namespace rollpack
