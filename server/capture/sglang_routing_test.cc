#include "server/capture/sglang_routing.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/capture/capture_test_support.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ModelSpec Model() { return MoeModel(6, 64, 4, {1, 2, 3, 4, 5}); }  // layer 0 dense

TEST(EngineDtypeTest, ReadsTheNamesEnginesUse) {
  EXPECT_EQ(EngineDtype("int32")->descr, "<i4");
  EXPECT_EQ(EngineDtype("torch.int16")->descr, "<i2");
  EXPECT_EQ(EngineDtype("np.uint8")->item_bytes, 1);
  EXPECT_EQ(EngineDtype("long")->descr, "<i8");
  EXPECT_EQ(EngineDtype(" <i4 ")->descr, "<i4");
  EXPECT_FALSE(EngineDtype("uint16")->is_signed);
  EXPECT_THAT(std::string(EngineDtype("float32").status().message()),
              HasSubstr("\"float32\" is not an integer dtype"));
  EXPECT_FALSE(EngineDtype(">i4").ok());
}

TEST(PlaceSglangRoutingTest, ShapesTheFlatValuesFromTheModelAndTheTokens) {
  const ModelSpec model = Model();
  // 100 tokens, int32 by default: 99 rows x 6 layers x 4 (full).
  const std::string full(99 * 6 * 4 * 4, '\0');
  absl::StatusOr<PlacedRouting> placed = PlaceSglangRouting(full, "", 100, model, 0);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_THAT(placed->array.shape, ElementsAre(99, 6, 4));
  EXPECT_EQ(placed->array.descr, "<i4");
  EXPECT_EQ(placed->row_offset, 0);
  // Compact (5 MoE layers), uint8.
  placed = PlaceSglangRouting(std::string(99 * 5 * 4, '\0'), "uint8", 100, model, 0);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_THAT(placed->array.shape, ElementsAre(99, 5, 4));
  // A later turn asked from 60: 39 rows.
  placed = PlaceSglangRouting(std::string(39 * 6 * 4 * 4, '\0'), "int32", 100, model, 60);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->row_offset, 60);
  // A build that ignored the start answers all 99 rows from token 0.
  placed = PlaceSglangRouting(full, "int32", 100, model, 60);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->row_offset, 0);
  EXPECT_THAT(placed->array.shape, ElementsAre(99, 6, 4));
}

TEST(PlaceSglangRoutingTest, RefusesByteCountsThatFitNoShape) {
  const ModelSpec model = Model();
  absl::StatusOr<PlacedRouting> placed =
      PlaceSglangRouting(std::string(98 * 6 * 4 * 4, '\0'), "int32", 100, model, 0);
  ASSERT_FALSE(placed.ok());
  EXPECT_THAT(std::string(placed.status().message()),
              HasSubstr("holds 2352 <i4 values; with 100 tokens, start 0, topk 4 and 6 or 5 "
                        "layers it should hold 2376 or 1980 or 2400 or 2000"));
  EXPECT_THAT(std::string(PlaceSglangRouting("abc", "int16", 100, model, 0).status().message()),
              HasSubstr("not a multiple"));
  ModelSpec dense = model;
  dense.num_experts = 0;
  EXPECT_FALSE(PlaceSglangRouting(std::string(16, '\0'), "", 100, dense, 0).ok());
}

}  // namespace
}  // namespace rollpack
