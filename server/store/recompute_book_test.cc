#include "server/store/recompute_book.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rollpack/v1/member.pb.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;

TEST(RecomputeBookTest, StoreReplaceAndEraseCountMemoryAndDeadLogBytes) {
  RecomputeBook book;
  EXPECT_EQ(book.Find("a"), nullptr);
  EXPECT_EQ(book.BytesOf("a"), 0);
  RecomputeBook::Change added = book.Store("a", std::string(100, '\1'));
  EXPECT_EQ(added.bytes, 100);
  EXPECT_EQ(added.dead_log_bytes, 0);
  const int64_t logged = book.LoggedBytes();
  EXPECT_GT(logged, 100);  // the ids, the sample id and framing
  std::shared_ptr<const std::string> taken = book.Find("a");
  ASSERT_NE(taken, nullptr);

  RecomputeBook::Change replaced = book.Store("a", std::string(40, '\2'));
  EXPECT_EQ(replaced.bytes, -60);
  EXPECT_EQ(replaced.dead_log_bytes, logged);
  EXPECT_EQ(book.BytesOf("a"), 40);
  // What a step took stays as it was.
  EXPECT_EQ(*taken, std::string(100, '\1'));

  const int64_t logged_now = book.LoggedBytes();
  EXPECT_LT(logged_now, logged);
  RecomputeBook::Change erased = book.Erase("a");
  EXPECT_EQ(erased.bytes, -40);
  EXPECT_EQ(erased.dead_log_bytes, logged_now);
  EXPECT_EQ(book.LoggedBytes(), 0);
  EXPECT_TRUE(book.empty());
  RecomputeBook::Change none = book.Erase("a");
  EXPECT_EQ(none.bytes, 0);
  EXPECT_EQ(none.dead_log_bytes, 0);
}

TEST(RecomputeBookTest, CompactionRecordsAreSortedById) {
  RecomputeBook a, b;
  a.Store("y", "yy");
  a.Store("x", "x");
  b.Store("x", "x");
  b.Store("y", "yy");
  std::vector<std::string> records = a.EncodeRecords("p");
  EXPECT_EQ(records, b.EncodeRecords("p"));
  ASSERT_EQ(records.size(), 1u);
  v1::RecomputeRoutingRecord record;
  ASSERT_TRUE(record.ParseFromString(records[0]));
  EXPECT_EQ(record.pool(), "p");
  EXPECT_THAT(record.sample_ids(), ElementsAre("x", "y"));
  EXPECT_THAT(record.experts(), ElementsAre("x", "yy"));
  EXPECT_EQ(record.parts(), 0);
}

TEST(RecomputeBookTest, ACommitWithinTheRecordBoundIsOneUnnumberedRecord) {
  const std::string r1 = "abc", r2 = "de";
  const std::vector<std::string> ids = {"b", "a"};
  const std::vector<const std::string*> routing = {&r1, &r2};
  std::vector<std::string> commit = RecomputeBook::EncodeCommit("p", "s", ids, routing);
  ASSERT_EQ(commit.size(), 1u);
  v1::RecomputeRoutingRecord record;
  ASSERT_TRUE(record.ParseFromString(commit[0]));
  EXPECT_EQ(record.step_id(), "s");
  EXPECT_EQ(record.parts(), 0);
  // A commit keeps the step's order.
  EXPECT_THAT(record.sample_ids(), ElementsAre("b", "a"));
  EXPECT_THAT(record.experts(), ElementsAre("abc", "de"));
}

}  // namespace
}  // namespace rollpack
