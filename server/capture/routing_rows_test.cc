#include "server/capture/routing_rows.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/capture/capture_test_support.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

ModelSpec Model() { return MoeModel(6, 64, 4, {1, 2, 3, 4, 5}); }  // layer 0 dense

TEST(PlaceRoutingRowsTest, RowsEndAtTheLastForwardedTokenFromTheStartAsked) {
  const ModelSpec model = Model();
  // 100 tokens: rows for tokens [0, 99), full (6 layers) or compact (5).
  EXPECT_EQ(*PlaceRoutingRows({99, 6, 4}, 100, model, 0), 0);
  EXPECT_EQ(*PlaceRoutingRows({99, 5, 4}, 100, model, 0), 0);
  EXPECT_EQ(*PlaceRoutingRows({100, 6, 4}, 100, model, 0), 0) << "rows for all n tokens";
  // A session's later turn asked from 60: rows [60, 99).
  EXPECT_EQ(*PlaceRoutingRows({39, 6, 4}, 100, model, 60), 60);
  // An engine that ignored the start (SGLang builds) answers from 0.
  EXPECT_EQ(*PlaceRoutingRows({99, 6, 4}, 100, model, 60), 0);
}

TEST(PlaceRoutingRowsTest, RefusesShapesTheModelOrTheTokensDoNotAllow) {
  const ModelSpec model = Model();
  EXPECT_THAT(std::string(PlaceRoutingRows({99, 7, 4}, 100, model, 0).status().message()),
              HasSubstr("7 layers; model \"moe\" has 6 (full layout) or 5 (compact)"));
  EXPECT_THAT(std::string(PlaceRoutingRows({99, 6, 2}, 100, model, 0).status().message()),
              HasSubstr("2 experts per token"));
  EXPECT_THAT(std::string(PlaceRoutingRows({50, 6, 4}, 100, model, 0).status().message()),
              HasSubstr("50 rows; with 100 tokens from offset 0"));
  EXPECT_THAT(std::string(PlaceRoutingRows({50, 6, 4}, 100, model, 10).status().message()),
              HasSubstr("from offset 10 (or 0)"));
  EXPECT_FALSE(PlaceRoutingRows({99, 6}, 100, model, 0).ok());
  EXPECT_FALSE(PlaceRoutingRows({99, 6, 4}, 100, model, -1).ok());
  ModelSpec dense = model;
  dense.num_experts = 0;
  EXPECT_THAT(std::string(PlaceRoutingRows({99, 6, 4}, 100, dense, 0).status().message()),
              HasSubstr("dense"));
}

TEST(PlaceRoutingRowsTest, RoutedMtpLayersCountOnTheLayerAxis) {
  ModelSpec model = Model();
  model.num_mtp_layers = 1;
  model.mtp_routing = true;
  EXPECT_TRUE(PlaceRoutingRows({99, 7, 4}, 100, model, 0).ok());
  EXPECT_TRUE(PlaceRoutingRows({99, 6, 4}, 100, model, 0).ok()) << "compact + 1 MTP";
}

template <typename T>
NpyArray Array(const std::string& descr, const std::vector<T>& values, std::string& storage) {
  storage.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  NpyArray a;
  a.descr = descr;
  a.item_bytes = sizeof(T);
  a.is_signed = descr[1] == 'i';
  a.shape = {static_cast<int64_t>(values.size()), 1, 1};
  a.data = storage;
  return a;
}

TEST(RoutingNdArrayTest, KeepsTheDtypesSamplesTakeAndConvertsTheOthers) {
  std::string storage;
  absl::StatusOr<v1::NDArray> u8 = RoutingNdArray(Array<uint8_t>("|u1", {1, 2, 255}, storage));
  ASSERT_TRUE(u8.ok());
  EXPECT_EQ(u8->dtype(), v1::UINT8);
  EXPECT_EQ(u8->data(), storage);
  EXPECT_THAT(u8->shape(), ::testing::ElementsAre(3, 1, 1));

  absl::StatusOr<v1::NDArray> i16 = RoutingNdArray(Array<int16_t>("<i2", {-1, 300}, storage));
  ASSERT_TRUE(i16.ok());
  EXPECT_EQ(i16->dtype(), v1::INT16);

  absl::StatusOr<v1::NDArray> i64 =
      RoutingNdArray(Array<int64_t>("<i8", {-1, 7, 100000}, storage));
  ASSERT_TRUE(i64.ok()) << i64.status();
  EXPECT_EQ(i64->dtype(), v1::INT32);
  std::vector<int32_t> got(3);
  std::memcpy(got.data(), i64->data().data(), 12);
  EXPECT_THAT(got, ::testing::ElementsAre(-1, 7, 100000));

  absl::StatusOr<v1::NDArray> i8 = RoutingNdArray(Array<int8_t>("|i1", {-1, 5}, storage));
  ASSERT_TRUE(i8.ok());
  EXPECT_EQ(i8->dtype(), v1::INT16);
  EXPECT_EQ(i8->data().size(), 4u);

  absl::StatusOr<v1::NDArray> big =
      RoutingNdArray(Array<int64_t>("<i8", {1, int64_t{1} << 40}, storage));
  EXPECT_THAT(std::string(big.status().message()),
              HasSubstr("routed expert id 1099511627776 at element 1"));
}

}  // namespace
}  // namespace rollpack
