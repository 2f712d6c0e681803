#include "server/capture/record_budget.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;

TEST(RecordBudgetTest, AnswersThatFitGoAtOnceOthersWaitInOrder) {
  RecordBudget budget(100);
  std::vector<int> ran;
  budget.Acquire(60, [&] { ran.push_back(1); });
  budget.Acquire(30, [&] { ran.push_back(2); });
  EXPECT_THAT(ran, ElementsAre(1, 2));
  budget.Acquire(50, [&] { ran.push_back(3); });  // 140 > 100: waits
  budget.Acquire(5, [&] { ran.push_back(4); });   // fits, but waits behind 3
  EXPECT_THAT(ran, ElementsAre(1, 2));
  EXPECT_EQ(budget.waiting(), 2);
  budget.Release(30);  // 60 + 50 still does not fit
  EXPECT_THAT(ran, ElementsAre(1, 2));
  budget.Release(60);  // 0 + 50 fits, then 50 + 5
  EXPECT_THAT(ran, ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(budget.held(), 55);
}

TEST(RecordBudgetTest, AnAnswerLargerThanTheBudgetGoesWhenNothingElseIsHeld) {
  RecordBudget budget(100);
  std::vector<int> ran;
  budget.Acquire(10, [&] { ran.push_back(1); });
  budget.Acquire(500, [&] { ran.push_back(2); });
  EXPECT_THAT(ran, ElementsAre(1));
  budget.Release(10);
  EXPECT_THAT(ran, ElementsAre(1, 2));
  budget.Release(500);
  EXPECT_EQ(budget.held(), 0);
}

TEST(RecordBudgetTest, ZeroMeansNoBound) {
  RecordBudget budget(0);
  int ran = 0;
  for (int i = 0; i < 10; ++i) budget.Acquire(int64_t{1} << 40, [&] { ++ran; });
  EXPECT_EQ(ran, 10);
}

}  // namespace
}  // namespace rollpack
