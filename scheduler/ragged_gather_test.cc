// What GatherRagged refuses: sources or outputs that would make it read or
// write outside them. Its content is checked against the layout's
// reference in layout_property_test.
#include "scheduler/ragged_gather.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

// Sequence 0: 3 tokens with lists {1, 2}, {}, {3}; rows: its tokens 1..2,
// two padding rows, its token 0.
struct Fixture {
  std::vector<int64_t> offsets = {0, 2, 2, 3};
  std::vector<int32_t> values = {1, 2, 3};
  std::vector<RowRun> runs = {
      {0, 0, 1, 2, false, 1, 0},
      {0, 0, 3, 2, true, 3, 2},
      {0, 0, 0, 1, false, 0, 4},
  };
  RaggedSource Source() const { return {offsets, values.data(), values.size() * sizeof(int32_t)}; }
};

TEST(RaggedGatherTest, RowsGetTheirTokensListsAndPaddingRowsEmptyOnes) {
  const Fixture f;
  absl::StatusOr<int64_t> count = CountRaggedValues(f.runs, 4, [&](int) { return f.Source(); });
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 3);
  std::vector<int32_t> values(3, -1);
  std::vector<int64_t> offsets(6, -1);
  ASSERT_TRUE(GatherRagged(
                  f.runs, 4, [&](int) { return f.Source(); },
                  absl::MakeSpan(reinterpret_cast<uint8_t*>(values.data()), 12),
                  absl::MakeSpan(reinterpret_cast<uint8_t*>(offsets.data()), 48))
                  .ok());
  EXPECT_EQ(values, (std::vector<int32_t>{3, 1, 2}));
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 0, 1, 1, 1, 3}));
}

TEST(RaggedGatherTest, ASourceShorterThanTheRunsIsRefusedByName) {
  Fixture f;
  f.offsets.pop_back();  // 2 tokens' offsets; the run reads token 2
  absl::StatusOr<int64_t> count = CountRaggedValues(f.runs, 4, [&](int) { return f.Source(); });
  EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(count.status().message(), HasSubstr("run 0 (sequence 0) reads tokens [1, 3)"));

  Fixture fewer_values;
  fewer_values.values.pop_back();
  count = CountRaggedValues(fewer_values.runs, 4, [&](int) { return fewer_values.Source(); });
  EXPECT_EQ(count.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(count.status().message(), HasSubstr("reads values [2, 3), the source holds 2"));

  Fixture decreasing;
  decreasing.offsets = {0, 3, 3, 2};
  std::vector<int32_t> values(3);
  std::vector<int64_t> offsets(6);
  absl::Status status = GatherRagged(
      decreasing.runs, 4, [&](int) { return decreasing.Source(); },
      absl::MakeSpan(reinterpret_cast<uint8_t*>(values.data()), 12),
      absl::MakeSpan(reinterpret_cast<uint8_t*>(offsets.data()), 48));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("run 0 (sequence 0) reads values [3, 2)"));
}

TEST(RaggedGatherTest, OutputsOfAnotherSizeAndGapsInTheRunsAreRefused) {
  Fixture f;
  std::vector<uint8_t> values(12), offsets(48);
  auto gather = [&](absl::Span<uint8_t> v, absl::Span<uint8_t> o) {
    return GatherRagged(
        f.runs, 4, [&](int) { return f.Source(); }, v, o);
  };
  EXPECT_THAT(gather(absl::MakeSpan(values).subspan(1), absl::MakeSpan(offsets)).message(),
              HasSubstr("values have 11 bytes"));
  EXPECT_THAT(gather(absl::MakeSpan(values), absl::MakeSpan(offsets).subspan(8)).message(),
              HasSubstr("offsets have 40 bytes, expected (5 rows + 1) * 8 bytes"));
  values.resize(16);
  EXPECT_THAT(gather(absl::MakeSpan(values), absl::MakeSpan(offsets)).message(),
              HasSubstr("values have 16 bytes, the rows hold 3 values of 4 bytes"));
  values.resize(12);
  f.runs[1].output_row = 3;
  EXPECT_THAT(gather(absl::MakeSpan(values), absl::MakeSpan(offsets)).message(),
              HasSubstr("run 1 (output_row 3, length 2) does not continue the runs at row 2"));
}

}  // namespace
}  // namespace rollpack
