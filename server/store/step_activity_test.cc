#include "server/store/step_activity.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

TEST(StepActivity, CountsStreamsAndTheirLastActivity) {
  StepActivity activity;
  activity.StepCreated("s", kT0);
  activity.StreamStarted("s", kT0 + absl::Seconds(1));
  activity.StreamStarted("s", kT0 + absl::Seconds(2));
  activity.StreamEnded("s", kT0 + absl::Seconds(5));
  const StepActivity::Entry e = activity.Get("s", kT0 + absl::Seconds(9));
  EXPECT_EQ(e.streams_started, 2);
  EXPECT_EQ(e.streams_open, 1);
  EXPECT_EQ(e.last_stream, kT0 + absl::Seconds(5));
  EXPECT_EQ(e.first_seen, kT0);
}

TEST(StepActivity, IdleStepsHaveNoOpenStreamAndNoActivityForTheTtl) {
  StepActivity activity;
  activity.StepCreated("fresh", kT0 + absl::Seconds(50));
  activity.StepCreated("untouched", kT0);
  activity.StepCreated("streaming", kT0);
  activity.StreamStarted("streaming", kT0 + absl::Seconds(1));
  activity.StepCreated("finished", kT0);
  activity.StreamStarted("finished", kT0 + absl::Seconds(1));
  activity.StreamEnded("finished", kT0 + absl::Seconds(45));
  const std::vector<std::string> live{"finished", "fresh", "streaming", "untouched"};
  EXPECT_THAT(activity.Idle(live, kT0 + absl::Seconds(60), absl::Seconds(30)),
              ElementsAre("untouched"));
  EXPECT_THAT(activity.Idle(live, kT0 + absl::Seconds(80), absl::Seconds(30)),
              ElementsAre("finished", "fresh", "untouched"));
  // A step recovered from the log (never seen) starts its clock when first seen.
  EXPECT_THAT(activity.Idle({"recovered"}, kT0 + absl::Seconds(100), absl::Seconds(30)), IsEmpty());
  EXPECT_THAT(activity.Idle({"recovered"}, kT0 + absl::Seconds(130), absl::Seconds(30)),
              ElementsAre("recovered"));
}

TEST(StepActivity, ReleaseAndRetainForgetSteps) {
  StepActivity activity;
  activity.StepCreated("a", kT0);
  activity.StreamStarted("a", kT0);
  activity.StepReleased("a");
  // A stream that outlives its step's release ends without recreating it.
  activity.StreamEnded("a", kT0 + absl::Seconds(1));
  EXPECT_EQ(activity.Get("a", kT0 + absl::Seconds(2)).streams_started, 0);
  activity.StepCreated("b", kT0);
  activity.StreamStarted("b", kT0);
  activity.Retain({"a"});
  EXPECT_EQ(activity.Get("b", kT0).streams_started, 0);
}

}  // namespace
}  // namespace rollpack
