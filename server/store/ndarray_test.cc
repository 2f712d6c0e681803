#include "server/store/ndarray.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

v1::NDArray Make(v1::DType dtype, std::vector<int64_t> shape, size_t bytes) {
  v1::NDArray a;
  a.set_dtype(dtype);
  for (int64_t d : shape) a.add_shape(d);
  a.mutable_data()->assign(bytes, '\x01');
  return a;
}

TEST(DTypeSizeTest, CoversEveryWireType) {
  EXPECT_EQ(DTypeSize(v1::UINT8), 1);
  EXPECT_EQ(DTypeSize(v1::UINT16), 2);
  EXPECT_EQ(DTypeSize(v1::INT16), 2);
  EXPECT_EQ(DTypeSize(v1::INT32), 4);
  EXPECT_EQ(DTypeSize(v1::INT64), 8);
  EXPECT_EQ(DTypeSize(v1::FLOAT32), 4);
  EXPECT_EQ(DTypeSize(v1::FLOAT16), 2);
  EXPECT_EQ(DTypeSize(v1::BFLOAT16), 2);
  EXPECT_EQ(DTypeSize(v1::DTYPE_UNSPECIFIED), 0);
  EXPECT_EQ(DTypeSize(static_cast<v1::DType>(99)), 0);
}

TEST(ViewArrayTest, AcceptsExactByteLength) {
  const v1::NDArray a = Make(v1::INT32, {3, 2}, 24);
  absl::StatusOr<ArrayView> v = ViewArray(a, "x");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->num_elements(), 6);
  EXPECT_EQ(v->rank(), 2);
  EXPECT_EQ(v->data.size(), 24u);
  EXPECT_EQ(v->data.data(), a.data().data()) << "the view must not copy";
}

TEST(ViewArrayTest, RefusesByteLengthMismatchNamingTheNumbers) {
  absl::StatusOr<ArrayView> v = ViewArray(Make(v1::INT32, {3, 2}, 23), "sample \"a\": tokens");
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr("sample \"a\": tokens: 23 bytes"));
  EXPECT_THAT(v.status().message(), HasSubstr("needs 24"));
}

TEST(ViewArrayTest, RefusesUnknownDtype) {
  absl::StatusOr<ArrayView> v = ViewArray(Make(static_cast<v1::DType>(42), {1}, 1), "f");
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr("unknown dtype dtype(42)"));
}

TEST(ViewArrayTest, RefusesNegativeDimension) {
  absl::StatusOr<ArrayView> v = ViewArray(Make(v1::UINT8, {4, -1}, 0), "f");
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr("negative dimension 1"));
}

TEST(ViewArrayTest, RefusesHugeShapeWithoutOverflow) {
  absl::StatusOr<ArrayView> v =
      ViewArray(Make(v1::INT64, {int64_t{1} << 40, int64_t{1} << 40}, 8), "f");
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr("too large"));
}

TEST(ViewArrayTest, ZeroSizedDimensionNeedsNoBytes) {
  absl::StatusOr<ArrayView> v = ViewArray(Make(v1::UINT16, {0, 48, 8}, 0), "f");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->num_elements(), 0);
}

TEST(ResizeArrayTest, SizesDataForShape) {
  v1::NDArray a;
  char* p = ResizeArray(&a, v1::UINT16, {5, 3, 2});
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(a.data().size(), 60u);
  EXPECT_THAT(a.shape(), ::testing::ElementsAre(5, 3, 2));
  EXPECT_TRUE(ViewArray(a, "a").ok());
}

TEST(SetInt32ArrayTest, RoundTrips) {
  v1::NDArray a;
  SetInt32Array(&a, {0, 7, 19});
  ASSERT_EQ(a.dtype(), v1::INT32);
  int32_t v[3];
  std::memcpy(v, a.data().data(), 12);
  EXPECT_EQ(v[0], 0);
  EXPECT_EQ(v[1], 7);
  EXPECT_EQ(v[2], 19);
}

TEST(IsEmptyArrayTest, OnlyTheDefaultMessageIsEmpty) {
  EXPECT_TRUE(IsEmptyArray(v1::NDArray()));
  EXPECT_FALSE(IsEmptyArray(Make(v1::UINT8, {0}, 0)));
}

}  // namespace
}  // namespace rollpack
