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
  const uint64_t first = activity.StreamStarted("s", kT0 + absl::Seconds(1));
  activity.StreamStarted("s", kT0 + absl::Seconds(2));
  activity.StreamEnded("s", first, kT0 + absl::Seconds(5));
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
  const uint64_t token = activity.StreamStarted("finished", kT0 + absl::Seconds(1));
  activity.StreamEnded("finished", token, kT0 + absl::Seconds(45));
  const std::vector<std::string> live{"finished", "fresh", "streaming", "untouched"};
  EXPECT_THAT(activity.Idle(live, kT0 + absl::Seconds(60), absl::Seconds(30)),
              ElementsAre("untouched"));
  EXPECT_THAT(activity.Idle(live, kT0 + absl::Seconds(80), absl::Seconds(30)),
              ElementsAre("finished", "fresh", "untouched"));
  EXPECT_TRUE(activity.StillIdle("untouched", kT0 + absl::Seconds(80), absl::Seconds(30)));
  activity.StreamStarted("untouched", kT0 + absl::Seconds(81));
  EXPECT_FALSE(activity.StillIdle("untouched", kT0 + absl::Seconds(200), absl::Seconds(30)));
  // A step recovered from the log (never seen) starts its clock when first seen.
  EXPECT_THAT(activity.Idle({"recovered"}, kT0 + absl::Seconds(100), absl::Seconds(30)), IsEmpty());
  EXPECT_THAT(activity.Idle({"recovered"}, kT0 + absl::Seconds(130), absl::Seconds(30)),
              ElementsAre("recovered"));
}

TEST(StepActivity, ReleaseAndRetainForgetSteps) {
  StepActivity activity;
  activity.StepCreated("a", kT0);
  const uint64_t old_stream = activity.StreamStarted("a", kT0);
  activity.StepReleased("a");
  // The id is reused; the old step's stream ends later and does not touch
  // the new step's counts.
  activity.StepCreated("a", kT0 + absl::Seconds(1));
  const uint64_t new_stream = activity.StreamStarted("a", kT0 + absl::Seconds(2));
  EXPECT_NE(old_stream, new_stream);
  activity.StreamEnded("a", old_stream, kT0 + absl::Seconds(3));
  EXPECT_EQ(activity.Get("a", kT0 + absl::Seconds(4)).streams_open, 1);
  EXPECT_EQ(activity.Get("a", kT0 + absl::Seconds(4)).streams_started, 1);
  // Retain keeps what is live, streaming, or active since the cutoff.
  activity.StepCreated("gone", kT0);
  activity.StepCreated("new", kT0 + absl::Seconds(10));
  activity.Retain({}, kT0 + absl::Seconds(5));
  EXPECT_EQ(activity.Get("a", kT0 + absl::Seconds(20)).streams_started, 1);  // open stream
  EXPECT_EQ(activity.Get("new", kT0 + absl::Seconds(20)).first_seen, kT0 + absl::Seconds(10));
  EXPECT_EQ(activity.Get("gone", kT0 + absl::Seconds(20)).first_seen, kT0 + absl::Seconds(20));
}

}  // namespace
}  // namespace rollpack
