#include "server/cluster/etcd_reachability.h"

#include "gtest/gtest.h"

namespace rollpack {
namespace {

using Change = EtcdReachability::Change;

const absl::Time kT0 = absl::FromUnixSeconds(1000);

absl::Time At(double seconds) { return kT0 + absl::Seconds(seconds); }

TEST(EtcdReachabilityTest, FailuresShorterThanTheGraceAreNoOutage) {
  // A leader election: refused for a second and a half, then answers.
  EtcdReachability r(absl::Seconds(3));
  for (double t = 0; t < 1.5; t += 0.1) {
    EXPECT_EQ(r.Observe(At(t), At(t + 0.01), true, "connection refused"), Change::kNone);
  }
  EXPECT_EQ(r.Observe(At(1.5), At(1.6), false, ""), Change::kNone);
  EXPECT_TRUE(r.reachable());
  EXPECT_EQ(r.state().outages, 0);
  // The failing run starts again after the success.
  EXPECT_EQ(r.Observe(At(2), At(2.1), true, "refused"), Change::kNone);
  EXPECT_EQ(r.Observe(At(4.8), At(4.9), true, "refused"), Change::kNone);
  EXPECT_TRUE(r.reachable());
}

TEST(EtcdReachabilityTest, LostOnceAfterTheGraceAndRegainedAtTheFirstAnswer) {
  EtcdReachability r(absl::Seconds(3));
  EXPECT_EQ(r.Observe(At(0), At(0.01), true, "refused"), Change::kNone);
  EXPECT_EQ(r.Observe(At(1), At(1.01), true, "refused"), Change::kNone);
  EXPECT_EQ(r.Observe(At(3), At(3.01), true, "connection refused"), Change::kLost);
  EXPECT_FALSE(r.reachable());
  // Every later failure changes nothing: one line per outage, not per call.
  for (double t = 3.1; t < 60; t += 0.1) {
    ASSERT_EQ(r.Observe(At(t), At(t + 0.01), true, "refused"), Change::kNone);
  }
  EtcdReachability::State s = r.state();
  EXPECT_EQ(s.outages, 1);
  EXPECT_EQ(s.unreachable_since, At(0));
  EXPECT_EQ(s.last_error, "refused");
  EXPECT_EQ(r.UnreachableFor(At(62)), absl::Seconds(62));
  EXPECT_EQ(r.Observe(At(662), At(662.2), false, ""), Change::kRegained);
  EXPECT_TRUE(r.reachable());
  EXPECT_EQ(r.UnreachableFor(At(700)), absl::ZeroDuration());
  s = r.state();
  EXPECT_EQ(s.last_outage, absl::Seconds(662.2));
  EXPECT_EQ(s.outages, 1);
  EXPECT_EQ(r.Observe(At(663), At(663.1), false, ""), Change::kNone);
}

TEST(EtcdReachabilityTest, AStalledEtcdIsLostWhenItsFirstAttemptTimesOut) {
  // SIGSTOP: the attempt waits for its whole 3 s deadline.
  EtcdReachability r(absl::Seconds(3));
  EXPECT_EQ(r.Observe(At(0), At(3), true, "Deadline Exceeded"), Change::kLost);
  EXPECT_EQ(r.state().unreachable_since, At(0));
}

TEST(EtcdReachabilityTest, EachOutageIsCounted) {
  EtcdReachability r(absl::Seconds(1));
  for (int i = 0; i < 3; ++i) {
    const double base = 10.0 * i;
    EXPECT_EQ(r.Observe(At(base), At(base + 0.5), true, "x"), Change::kNone);
    EXPECT_EQ(r.Observe(At(base + 0.6), At(base + 1.1), true, "x"), Change::kLost);
    EXPECT_EQ(r.Observe(At(base + 2), At(base + 2.1), false, ""), Change::kRegained);
  }
  EXPECT_EQ(r.state().outages, 3);
}

TEST(EtcdReachabilityTest, OverlappingAttemptsCountFromTheEarliestFailure) {
  // Two threads: one attempt started at 0 fails at 3.5 after another that
  // started at 1 failed at 1.1.
  EtcdReachability r(absl::Seconds(3));
  EXPECT_EQ(r.Observe(At(1), At(1.1), true, "x"), Change::kNone);
  EXPECT_EQ(r.Observe(At(0), At(3.5), true, "deadline"), Change::kLost);
  EXPECT_EQ(r.state().unreachable_since, At(0));
}

}  // namespace
}  // namespace rollpack
