#include "server/cluster/stall_watch.h"

#include <atomic>

#include "gtest/gtest.h"

namespace rollpack {
namespace {

TEST(StallWatchTest, CancelsOnceWhenNothingProgresses) {
  std::atomic<int> cancels{0};
  const absl::Time start = absl::Now();
  {
    StallWatch watch(absl::Milliseconds(100), [&] { cancels.fetch_add(1); });
    while (cancels.load() == 0 && absl::Now() - start < absl::Seconds(5)) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_TRUE(watch.stalled());
    absl::SleepFor(absl::Milliseconds(150));
  }
  EXPECT_EQ(cancels.load(), 1);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
}

TEST(StallWatchTest, ProgressKeepsASlowCallAlivePastTheStallTime) {
  std::atomic<int> cancels{0};
  StallWatch watch(absl::Milliseconds(200), [&] { cancels.fetch_add(1); });
  // 1 s in all, a message every 50 ms: five times the stall time.
  for (int i = 0; i < 20; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    watch.Progress();
  }
  EXPECT_EQ(cancels.load(), 0);
  EXPECT_FALSE(watch.stalled());
}

TEST(StallWatchTest, EndingBeforeTheStallNeverCancels) {
  std::atomic<int> cancels{0};
  { StallWatch watch(absl::Seconds(30), [&] { cancels.fetch_add(1); }); }
  EXPECT_EQ(cancels.load(), 0);
}

}  // namespace
}  // namespace rollpack
