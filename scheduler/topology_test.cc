#include "scheduler/topology.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

Topology Base() {
  Topology t;
  t.max_tokens_per_rank = 1024;
  return t;
}

TEST(ValidateTopologySizesTest, AcceptsDefaultsWithBudget) {
  EXPECT_TRUE(ValidateTopologySizes(Base()).ok());
}

TEST(ValidateTopologySizesTest, RefusesNonPositiveSizesNamingField) {
  for (auto set : std::vector<void (*)(Topology&)>{
           [](Topology& t) { t.dp = 0; }, [](Topology& t) { t.cp = -1; },
           [](Topology& t) { t.tp = 0; }, [](Topology& t) { t.pp = 0; },
           [](Topology& t) { t.vpp = 0; }, [](Topology& t) { t.pad_multiple = 0; },
           [](Topology& t) { t.microbatch_group_size = 0; },
           [](Topology& t) { t.min_cp = 0; }}) {
    Topology t = Base();
    set(t);
    const absl::Status s = ValidateTopologySizes(t);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("must be >= 1"));
  }
  Topology t = Base();
  t.dp = 0;
  EXPECT_THAT(std::string(ValidateTopologySizes(t).message()), HasSubstr("dp is 0"));
}

TEST(ValidateTopologySizesTest, RequiresTokenBudget) {
  Topology t = Base();
  t.max_tokens_per_rank = 0;
  const absl::Status s = ValidateTopologySizes(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("max_tokens_per_rank"));
}

TEST(ValidateTopologySizesTest, NegativeStageLayersRefused) {
  Topology t = Base();
  t.num_layers_in_first_pipeline_stage = -1;
  EXPECT_EQ(ValidateTopologySizes(t).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateTopologySizesTest, InterleavedNeedsGroupOfAtLeastPp) {
  Topology t = Base();
  t.pp = 4;
  t.vpp = 2;
  t.microbatch_group_size = 2;
  EXPECT_THAT(std::string(ValidateTopologySizes(t).message()),
              HasSubstr("microbatch_group_size 2 is below pp 4"));
  t.microbatch_group_size = 4;
  EXPECT_TRUE(ValidateTopologySizes(t).ok());
  t.vpp = 1;
  t.microbatch_group_size = 1;  // not interleaved: any group size
  EXPECT_TRUE(ValidateTopologySizes(t).ok());
}

TEST(ValidateTopologySizesTest, DynamicMinCpMustBePowerOfTwoDividingR) {
  Topology t = Base();
  t.scheduler = SchedulerKind::kDynamicCp;
  t.dp = 3;
  t.cp = 2;  // R = 6
  t.min_cp = 2;
  EXPECT_TRUE(ValidateTopologySizes(t).ok());
  t.min_cp = 3;
  EXPECT_THAT(std::string(ValidateTopologySizes(t).message()),
              HasSubstr("min_cp 3 must be a power of two"));
  t.min_cp = 4;  // does not divide 6
  EXPECT_EQ(ValidateTopologySizes(t).code(), absl::StatusCode::kInvalidArgument);
  t.scheduler = SchedulerKind::kStaticCp;  // ignored for static CP
  EXPECT_TRUE(ValidateTopologySizes(t).ok());
}

TEST(ValidateTopologySizesTest, CostModelMustBeNonNegative) {
  Topology t = Base();
  t.cost.linear = -1;
  EXPECT_EQ(ValidateTopologySizes(t).code(), absl::StatusCode::kInvalidArgument);
  t.cost.linear = 0;
  t.cost.quadratic = 0;
  EXPECT_EQ(ValidateTopologySizes(t).code(), absl::StatusCode::kInvalidArgument);
  t.cost.quadratic = 1;
  EXPECT_TRUE(ValidateTopologySizes(t).ok());
}

TEST(CostModelTest, DefaultIsHidden4096) {
  CostModel c;
  EXPECT_DOUBLE_EQ(c(0), 0);
  EXPECT_DOUBLE_EQ(c(1000), 24576.0 * 1000 + 1e6);
  CostModel q{0, 2};
  EXPECT_DOUBLE_EQ(q(3), 18);
}

TEST(CostModelTest, FromTransformerDimensions) {
  // 24 h^2 + 4 h L per token and layer: the ratio is the default's 6h.
  const CostModel c = CostModelForTransformer(/*hidden_size=*/4096, /*num_layers=*/2);
  EXPECT_DOUBLE_EQ(c.linear / c.quadratic, 6.0 * 4096);
  EXPECT_DOUBLE_EQ(c.quadratic, 4.0 * 4096 * 2);
  const CostModel wide = CostModelForTransformer(1024, 1, /*ffn_hidden_size=*/8192);
  // attention projections 8 h^2 + MLP 4 h f, over 4 h.
  EXPECT_DOUBLE_EQ(wide.linear / wide.quadratic,
                   (8.0 * 1024 * 1024 + 4.0 * 1024 * 8192) / (4.0 * 1024));
}

TEST(SequenceAlignmentTest, Section2) {
  Topology t = Base();
  EXPECT_EQ(SequenceAlignment(t, 1), 1);
  EXPECT_EQ(SequenceAlignment(t, 2), 4);
  EXPECT_EQ(SequenceAlignment(t, 8), 16);
  t.tp = 4;  // sequence parallel by default
  EXPECT_EQ(SequenceAlignment(t, 1), 4);
  EXPECT_EQ(SequenceAlignment(t, 2), 16);
  t.sequence_parallel = false;
  EXPECT_EQ(SequenceAlignment(t, 1), 1);
  EXPECT_EQ(SequenceAlignment(t, 2), 4);
  t.pad_multiple = 16;
  EXPECT_EQ(SequenceAlignment(t, 1), 16);
  EXPECT_EQ(SequenceAlignment(t, 2), 16);
  t.pad_multiple = 6;
  EXPECT_EQ(SequenceAlignment(t, 2), 12);  // lcm(4, 6)
}

TEST(PaddedLengthTest, RoundsUpToAlignment) {
  Topology t = Base();
  t.tp = 2;
  EXPECT_EQ(PaddedLength(t, 1, 1), 2);
  EXPECT_EQ(PaddedLength(t, 8, 2), 8);
  EXPECT_EQ(PaddedLength(t, 9, 2), 16);
  EXPECT_EQ(CeilTo(0, 4), 0);
  EXPECT_EQ(CeilTo(5, 1), 5);
}

TEST(MaxCpGroupSizeTest, StaticIsCpDynamicIsLargestPowerOfTwo) {
  Topology t = Base();
  t.dp = 3;
  t.cp = 2;
  EXPECT_EQ(MaxCpGroupSize(t), 2);
  t.scheduler = SchedulerKind::kDynamicCp;
  EXPECT_EQ(MaxCpGroupSize(t), 4);
  t.dp = 8;
  EXPECT_EQ(MaxCpGroupSize(t), 16);
  t.dp = 1;
  t.cp = 1;
  EXPECT_EQ(MaxCpGroupSize(t), 1);
}

TEST(MinCpGroupSizeTest, StaticIsCpDynamicIsMinCp) {
  Topology t = Base();
  t.dp = 4;
  t.cp = 3;
  t.min_cp = 2;  // not used by static CP
  EXPECT_EQ(MinCpGroupSize(t), 3);
  t.scheduler = SchedulerKind::kDynamicCp;
  EXPECT_EQ(MinCpGroupSize(t), 2);
}

TEST(MinCpGroupSizeForTest, StaticFitsOrNot) {
  Topology t = Base();
  t.cp = 2;
  t.max_tokens_per_rank = 8;
  EXPECT_EQ(MinCpGroupSizeFor(t, 16), 2);
  EXPECT_EQ(MinCpGroupSizeFor(t, 17), 0);  // pads to 20 > 2 * 8
}

TEST(MinCpGroupSizeForTest, StaticCpNeedNotBeAPowerOfTwo) {
  Topology t = Base();
  t.cp = 3;
  t.max_tokens_per_rank = 8;
  EXPECT_EQ(MinCpGroupSizeFor(t, 18), 3);  // aligns to 6: 18 / 3 = 6 <= 8
  EXPECT_EQ(MinCpGroupSizeFor(t, 25), 0);  // pads to 30 > 3 * 8
}

TEST(MinCpGroupSizeForTest, DynamicSmallestFittingPowerOfTwo) {
  Topology t = Base();
  t.scheduler = SchedulerKind::kDynamicCp;
  t.dp = 4;
  t.cp = 2;
  t.max_tokens_per_rank = 100;
  EXPECT_EQ(MinCpGroupSizeFor(t, 100), 1);
  EXPECT_EQ(MinCpGroupSizeFor(t, 101), 2);
  EXPECT_EQ(MinCpGroupSizeFor(t, 200), 2);
  EXPECT_EQ(MinCpGroupSizeFor(t, 201), 4);
  EXPECT_EQ(MinCpGroupSizeFor(t, 800), 8);
  EXPECT_EQ(MinCpGroupSizeFor(t, 801), 0);
  t.min_cp = 4;
  EXPECT_EQ(MinCpGroupSizeFor(t, 1), 4);
  // Alignment counts: on 2 ranks 199 pads to 200 = 2 * 100, fits; with
  // pad_multiple 16 it pads to 208 > 200.
  t.min_cp = 1;
  t.pad_multiple = 16;
  EXPECT_EQ(MinCpGroupSizeFor(t, 199), 4);
}

}  // namespace
}  // namespace rollpack
