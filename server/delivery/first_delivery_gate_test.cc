#include "server/delivery/first_delivery_gate.h"

#include <vector>

#include "gtest/gtest.h"

namespace rollpack {
namespace {

TEST(FirstDeliveryGateTest, PrefetchWaitsUntilTheLastFirstWriteIsDone) {
  FirstDeliveryGate gate;
  uint64_t generation = 0;
  EXPECT_TRUE(gate.WaitForFirstWrites(1, &generation, [] { FAIL() << "not waiting"; }));
  gate.FirstWriteStarted();
  gate.FirstWriteStarted();
  std::vector<int> resumed;
  EXPECT_FALSE(gate.WaitForFirstWrites(7, &generation, [&] { resumed.push_back(7); }));
  uint64_t other = 0;
  EXPECT_FALSE(gate.WaitForFirstWrites(3, &other, [&] { resumed.push_back(3); }));
  EXPECT_EQ(gate.waiting(), 2);
  gate.FirstWriteDone();
  EXPECT_TRUE(resumed.empty());
  gate.FirstWriteDone();
  EXPECT_EQ(resumed, (std::vector<int>{3, 7}));  // earlier streams first
  EXPECT_EQ(gate.waiting(), 0);
  EXPECT_EQ(gate.pending_first_writes(), 0);
}

TEST(FirstDeliveryGateTest, AStreamWaitsOncePerNewFirstWrite) {
  // A rank that never reads keeps its first write pending forever; the
  // others must not wait on it again and again.
  FirstDeliveryGate gate;
  gate.FirstWriteStarted();  // the stuck one
  uint64_t generation = 0;
  EXPECT_FALSE(gate.WaitForFirstWrites(1, &generation, [] {}));
  ASSERT_TRUE(gate.Withdraw(1));  // the caller's timer
  EXPECT_TRUE(gate.WaitForFirstWrites(1, &generation, [] {}));
  EXPECT_TRUE(gate.WaitForFirstWrites(1, &generation, [] {}));
  gate.FirstWriteStarted();  // a new rank arrives: its first write has priority
  EXPECT_FALSE(gate.WaitForFirstWrites(1, &generation, [] {}));
}

TEST(FirstDeliveryGateTest, WithdrawnStreamIsNotResumed) {
  FirstDeliveryGate gate;
  gate.FirstWriteStarted();
  uint64_t generation = 0;
  bool resumed = false;
  EXPECT_FALSE(gate.WaitForFirstWrites(1, &generation, [&] { resumed = true; }));
  EXPECT_TRUE(gate.Withdraw(1));
  EXPECT_FALSE(gate.Withdraw(1));  // exactly one party continues the stream
  gate.FirstWriteDone();
  EXPECT_FALSE(resumed);
}

TEST(FirstDeliveryGateTest, ResumedStreamCannotBeWithdrawn) {
  FirstDeliveryGate gate;
  gate.FirstWriteStarted();
  uint64_t generation = 0;
  int resumed = 0;
  EXPECT_FALSE(gate.WaitForFirstWrites(1, &generation, [&] { ++resumed; }));
  gate.FirstWriteDone();
  EXPECT_EQ(resumed, 1);
  EXPECT_FALSE(gate.Withdraw(1));  // the timer firing late does nothing
}

}  // namespace
}  // namespace rollpack
