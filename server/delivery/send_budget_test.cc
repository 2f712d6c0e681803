#include "server/delivery/send_budget.h"

#include <atomic>
#include <functional>
#include <vector>

#include "gtest/gtest.h"

namespace rollpack {
namespace {

// Acquire without a cancellation flag: true when taken now.
bool Acq(SendBudget& budget, int64_t id, int64_t bytes, std::function<void()> resume) {
  return budget.Acquire(id, bytes, nullptr, std::move(resume)) == SendBudget::Acquired::kNow;
}

TEST(SendBudgetTest, UnboundedAlwaysGrants) {
  SendBudget budget(0);
  EXPECT_TRUE(Acq(budget, 1, int64_t{1} << 40, [] { FAIL(); }));
  EXPECT_TRUE(Acq(budget, 2, int64_t{1} << 40, [] { FAIL(); }));
  EXPECT_EQ(budget.waits(), 0);
}

TEST(SendBudgetTest, WaitersResumeInArrivalOrderAsBytesComeBack) {
  SendBudget budget(100);
  std::vector<int> resumed;
  EXPECT_TRUE(Acq(budget, 1, 60, [] { FAIL(); }));
  EXPECT_FALSE(Acq(budget, 2, 50, [&] { resumed.push_back(2); }));
  // 30 would fit, but does not overtake the waiter before it.
  EXPECT_FALSE(Acq(budget, 3, 30, [&] { resumed.push_back(3); }));
  EXPECT_EQ(budget.waiting(), 2);
  EXPECT_EQ(budget.in_use(), 60);
  budget.Release(60);
  EXPECT_EQ(resumed, (std::vector<int>{2, 3}));
  EXPECT_EQ(budget.in_use(), 80);
  EXPECT_EQ(budget.waits(), 2);
}

TEST(SendBudgetTest, OneRequestLargerThanTheBudgetPassesWhenNothingIsHeld) {
  SendBudget budget(100);
  EXPECT_TRUE(Acq(budget, 1, 500, [] { FAIL(); }));
  bool resumed = false;
  EXPECT_FALSE(Acq(budget, 2, 500, [&] { resumed = true; }));
  budget.Release(500);
  EXPECT_TRUE(resumed);
  EXPECT_EQ(budget.in_use(), 500);
}

TEST(SendBudgetTest, AWithdrawnWaiterIsNeverResumedAndUnblocksTheNext) {
  SendBudget budget(100);
  EXPECT_TRUE(Acq(budget, 1, 40, [] { FAIL(); }));
  EXPECT_FALSE(Acq(budget, 2, 90, [] { FAIL(); }));
  bool third = false;
  EXPECT_FALSE(Acq(budget, 3, 50, [&] { third = true; }));
  EXPECT_TRUE(budget.Withdraw(2));
  EXPECT_TRUE(third) << "the 90-byte waiter no longer holds the 50-byte one back";
  EXPECT_FALSE(budget.Withdraw(2));
  EXPECT_FALSE(budget.Withdraw(3)) << "already resumed";
  EXPECT_EQ(budget.in_use(), 90);
}

TEST(SendBudgetTest, ACancelledStreamIsNeitherGrantedNorQueued) {
  SendBudget budget(100);
  std::atomic<bool> cancelled{true};
  EXPECT_EQ(budget.Acquire(1, 10, &cancelled, [] { FAIL(); }), SendBudget::Acquired::kNever);
  cancelled = false;
  EXPECT_EQ(budget.Acquire(1, 10, &cancelled, [] { FAIL(); }), SendBudget::Acquired::kNow);
  EXPECT_EQ(budget.Acquire(2, 100, &cancelled, [] { FAIL(); }), SendBudget::Acquired::kLater);
  EXPECT_EQ(budget.waiting(), 1);
}

}  // namespace
}  // namespace rollpack
