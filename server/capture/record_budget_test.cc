#include "server/capture/record_budget.h"

#include <string>
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

// Chunked answers charged as they arrive: two of them, each waiting for
// more while the other holds the rest, would wait for good. The one holding
// the most goes on, over the budget, until it is whole and recorded.
TEST(RecordBudgetTest, GrowingAnswersThatHoldEverythingNeverWaitOnEachOther) {
  RecordBudget budget(100);
  std::vector<std::string> ran;
  budget.Grow(0, 50, [&] { ran.push_back("a50"); });
  budget.Grow(0, 40, [&] { ran.push_back("b40"); });
  budget.Grow(50, 30, [&] { ran.push_back("a80"); });  // 120 > 100; b holds 40: waits
  EXPECT_THAT(ran, ElementsAre("a50", "b40"));
  budget.Grow(40, 30, [&] { ran.push_back("b70"); });  // both wait, holding all: a goes
  EXPECT_THAT(ran, ElementsAre("a50", "b40", "a80"));
  EXPECT_EQ(budget.held(), 120);
  EXPECT_EQ(budget.waiting(), 1);
  budget.Grow(80, 30, [&] { ran.push_back("a110"); });  // a again, the one furthest along
  EXPECT_THAT(ran, ElementsAre("a50", "b40", "a80", "a110"));
  EXPECT_EQ(budget.held(), 150);
  budget.Release(110);  // a recorded: b's 30 fit
  EXPECT_THAT(ran, ElementsAre("a50", "b40", "a80", "a110", "b70"));
  EXPECT_EQ(budget.held(), 70);
  EXPECT_EQ(budget.waiting(), 0);
}

// Bytes held by an answer being recorded come back by themselves: growth
// waits for them, in order behind an answer of known length.
TEST(RecordBudgetTest, GrowthWaitsForRecordedAnswersAndBehindEarlierOnes) {
  RecordBudget budget(100);
  std::vector<std::string> ran;
  budget.Acquire(60, [&] { ran.push_back("recorded60"); });
  budget.Grow(0, 30, [&] { ran.push_back("g30"); });
  budget.Acquire(20, [&] { ran.push_back("sized20"); });  // 110: waits
  budget.Grow(30, 5, [&] { ran.push_back("g35"); });      // would fit, but waits behind it
  EXPECT_THAT(ran, ElementsAre("recorded60", "g30"));
  EXPECT_EQ(budget.waiting(), 2);
  budget.Release(60);
  EXPECT_THAT(ran, ElementsAre("recorded60", "g30", "sized20", "g35"));
  EXPECT_EQ(budget.held(), 55);
}

// An answer of known length waiting behind a growing one that holds all:
// the growing one goes on (the other holds nothing yet), then it.
TEST(RecordBudgetTest, ASizedAnswerWaitingDoesNotStallAGrowingOne) {
  RecordBudget budget(100);
  std::vector<std::string> ran;
  budget.Grow(0, 90, [&] { ran.push_back("g90"); });
  budget.Acquire(50, [&] { ran.push_back("sized50"); });
  budget.Grow(90, 20, [&] { ran.push_back("g110"); });
  EXPECT_THAT(ran, ElementsAre("g90", "g110"));
  budget.Release(110);
  EXPECT_THAT(ran, ElementsAre("g90", "g110", "sized50"));
  EXPECT_EQ(budget.held(), 50);
}

TEST(RecordBudgetTest, ZeroMeansNoBound) {
  RecordBudget budget(0);
  int ran = 0;
  for (int i = 0; i < 10; ++i) budget.Acquire(int64_t{1} << 40, [&] { ++ran; });
  EXPECT_EQ(ran, 10);
}

}  // namespace
}  // namespace rollpack
