#include "server/cluster/incarnation.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace rollpack {
namespace {

class IncarnationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / "rollpack-incarnation-XXXXXX").string();
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST(Incarnation, OnlyThirtyTwoLowercaseHexDigitsAreOne) {
  EXPECT_TRUE(IsIncarnation(NewIncarnation()));
  EXPECT_NE(NewIncarnation(), NewIncarnation());
  EXPECT_TRUE(IsIncarnation("0123456789abcdef0123456789abcdef"));
  EXPECT_FALSE(IsIncarnation(""));
  EXPECT_FALSE(IsIncarnation("0123456789ABCDEF0123456789abcdef"));
  EXPECT_FALSE(IsIncarnation("0123456789abcdef0123456789abcde"));
  EXPECT_FALSE(IsIncarnation("0123456789abcdef0123456789abcdeg"));
}

TEST_F(IncarnationTest, KeptWhileTheLogHoldsRecordsNewWithout) {
  absl::StatusOr<std::string> first = DataDirIncarnation(dir_, /*log_had_records=*/false);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(IsIncarnation(*first));
  absl::StatusOr<std::string> again = DataDirIncarnation(dir_, /*log_had_records=*/true);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *first);  // restarted with its data
  absl::StatusOr<std::string> emptied = DataDirIncarnation(dir_, /*log_had_records=*/false);
  ASSERT_TRUE(emptied.ok()) << emptied.status();
  EXPECT_NE(*emptied, *first);  // the log is gone: so are the samples
  absl::StatusOr<std::string> kept = DataDirIncarnation(dir_, /*log_had_records=*/true);
  EXPECT_EQ(*kept, *emptied);
}

TEST_F(IncarnationTest, AFileThatHoldsNoIncarnationIsReplaced) {
  std::ofstream(dir_ + "/incarnation") << "not an incarnation\n";
  absl::StatusOr<std::string> read = DataDirIncarnation(dir_, /*log_had_records=*/true);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(IsIncarnation(*read));
  EXPECT_EQ(*DataDirIncarnation(dir_, true), *read);
}

TEST_F(IncarnationTest, AnUnwritableDirIsAnError) {
  absl::StatusOr<std::string> none = DataDirIncarnation(dir_ + "/missing/deeper", false);
  EXPECT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("missing/deeper/incarnation"), std::string::npos)
      << none.status();
}

}  // namespace
}  // namespace rollpack
