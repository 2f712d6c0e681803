// Declared token fields (PoolOptions.token_fields): each documented
// conversion, each refusal naming the field, token and value, and the pool's
// schema fixed at registration.
#include "server/ingest/token_field_conversion.h"

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ingest/sample_validation.h"
#include "server/store/convert.h"
#include "server/store/sample_store.h"
#include "testing/ndarrays.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

template <typename T>
std::vector<T> Decode(const std::string& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

template <typename T>
absl::StatusOr<std::string> Convert(v1::DType from, const std::vector<T>& values,
                                    v1::DType to, bool allow_narrowing = false) {
  const v1::NDArray array = TestArray(from, {static_cast<int64_t>(values.size())}, values);
  absl::StatusOr<ArrayView> view = ViewArray(array, "x");
  EXPECT_TRUE(view.ok()) << view.status();
  DeclaredTokenField declared{"loss_mask", to, {}, allow_narrowing};
  return ConvertTokenField(*view, declared, "token_fields[\"loss_mask\"]", 1);
}

TEST(TokenFieldConversionTest, IntegersIntoIntegersWhenTheyFit) {
  absl::StatusOr<std::string> out = Convert<int64_t>(v1::INT64, {0, 1, 1, 0}, v1::UINT8);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Decode<uint8_t>(*out), (std::vector<uint8_t>{0, 1, 1, 0}));
  out = Convert<uint8_t>(v1::UINT8, {0, 255}, v1::INT32);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(Decode<int32_t>(*out), (std::vector<int32_t>{0, 255}));

  absl::Status s = Convert<int64_t>(v1::INT64, {0, 1, 300}, v1::UINT8).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("token_fields[\"loss_mask\"] is 300 at token 2 (element 2), "
                                     "outside [0, 255] of the pool's uint8"));
  EXPECT_THAT(Convert<int16_t>(v1::INT16, {-1}, v1::UINT16).status().message(),
              HasSubstr("is -1 at token 0"));
}

TEST(TokenFieldConversionTest, IntegersAndHalvesIntoFloat32Exactly) {
  absl::StatusOr<std::string> out = Convert<int32_t>(v1::INT32, {0, 1, -7, 1 << 24}, v1::FLOAT32);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Decode<float>(*out), (std::vector<float>{0, 1, -7, 16777216.0f}));
  EXPECT_THAT(Convert<int32_t>(v1::INT32, {(1 << 24) + 1}, v1::FLOAT32).status().message(),
              HasSubstr("16777217 at token 0 (element 0), beyond 2^24, not exact in the pool's float32"));
  // float16: 1.0 = 0x3C00, -2.5 = 0xC100, 2^-24 (smallest subnormal) = 0x0001, inf = 0x7C00.
  out = Convert<uint16_t>(v1::FLOAT16, {0x3C00, 0xC100, 0x0001, 0x7C00}, v1::FLOAT32);
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<float> halves = Decode<float>(*out);
  EXPECT_EQ(halves[0], 1.0f);
  EXPECT_EQ(halves[1], -2.5f);
  EXPECT_EQ(halves[2], std::ldexp(1.0f, -24));
  EXPECT_EQ(halves[3], std::numeric_limits<float>::infinity());
  // bfloat16: the high half of a float32.
  out = Convert<uint16_t>(v1::BFLOAT16, {0x3F80, 0xC020}, v1::FLOAT32);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(Decode<float>(*out), (std::vector<float>{1.0f, -2.5f}));
}

TEST(TokenFieldConversionTest, Float64NeedsAllowNarrowing) {
  absl::Status s = Convert<double>(v1::FLOAT64, {0.1}, v1::FLOAT32).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is float64, the pool declares float32: float64 is rounded "
                                     "to float32 only where the pool's field says allow_narrowing"));
  absl::StatusOr<std::string> out =
      Convert<double>(v1::FLOAT64, {0.1, -3.0, std::numeric_limits<double>::quiet_NaN()},
                      v1::FLOAT32, /*allow_narrowing=*/true);
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<float> f = Decode<float>(*out);
  EXPECT_EQ(f[0], 0.1f);
  EXPECT_EQ(f[1], -3.0f);
  EXPECT_TRUE(std::isnan(f[2])) << "NaN is kept (finite_token_fields refuses it where asked)";
  EXPECT_THAT(Convert<double>(v1::FLOAT64, {1e39}, v1::FLOAT32, true).status().message(),
              HasSubstr("is 1e+39 at token 0 (element 0), overflowing the pool's float32"));
}

TEST(TokenFieldConversionTest, OtherPairsAreRefused) {
  EXPECT_THAT(Convert<float>(v1::FLOAT32, {1.0f}, v1::UINT8).status().message(),
              HasSubstr("is float32, the pool declares uint8: only integer inputs convert"));
  EXPECT_THAT(Convert<float>(v1::FLOAT32, {1.0f}, v1::BFLOAT16).status().message(),
              HasSubstr("a float16 or bfloat16 field takes its own dtype only"));
}

ModelSpec DenseModel() {
  ModelSpec m;
  m.name = "dense";
  m.num_layers = 2;
  m.num_experts = 0;
  m.finite_token_fields = {"logprobs"};
  return m;
}

v1::Sample DenseSample(const std::string& id, v1::NDArray loss_mask, v1::NDArray logprobs) {
  v1::Sample s;
  s.set_sample_id(id);
  *s.mutable_tokens() = TestArray(v1::INT32, {3}, std::vector<int32_t>{1, 2, 3});
  (*s.mutable_token_fields())["loss_mask"] = std::move(loss_mask);
  (*s.mutable_token_fields())["logprobs"] = std::move(logprobs);
  return s;
}

PoolOptions Declared() {
  v1::PoolOptions proto;
  v1::TokenFieldSchema* mask = proto.add_token_fields();
  mask->set_name("loss_mask");
  mask->set_dtype(v1::UINT8);
  v1::TokenFieldSchema* logprobs = proto.add_token_fields();
  logprobs->set_name("logprobs");
  logprobs->set_dtype(v1::FLOAT32);
  logprobs->set_allow_narrowing(true);
  absl::StatusOr<PoolOptions> options = FromProto(proto);
  EXPECT_TRUE(options.ok()) << options.status();
  return *options;
}

TEST(DeclaredTokenFieldsTest, ValidationConvertsAndTheStoreTakesMixedDtypes) {
  const PoolOptions options = Declared();
  ASSERT_EQ(options.token_fields.size(), 2u);
  EXPECT_EQ(options.token_fields[0].name, "logprobs") << "sorted by name";
  SampleStore store(1 << 20);
  ASSERT_TRUE(store.RegisterModel("p", DenseModel(), options).ok());
  // Three producers, three dtypes per field: all stored as uint8 / float32.
  std::vector<StoredSample> batch;
  for (const v1::Sample& s :
       {DenseSample("a", TestArray(v1::INT64, {3}, std::vector<int64_t>{0, 1, 1}),
                    TestArray(v1::FLOAT64, {3}, std::vector<double>{-0.5, -1, -2})),
        DenseSample("b", TestArray(v1::UINT8, {3}, std::vector<uint8_t>{1, 1, 0}),
                    TestArray(v1::FLOAT32, {3}, std::vector<float>{-0.5f, -1, -2})),
        DenseSample("c", TestArray(v1::INT32, {3}, std::vector<int32_t>{0, 0, 1}),
                    TestArray(v1::BFLOAT16, {3}, std::vector<uint16_t>{0xBF00, 0xBF80, 0xC000}))}) {
    absl::StatusOr<StoredSample> stored = ValidateSample(s, DenseModel(), options.token_fields);
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_EQ(stored->token_fields.at("loss_mask").dtype, v1::UINT8);
    EXPECT_EQ(stored->token_fields.at("logprobs").dtype, v1::FLOAT32);
    EXPECT_EQ(Decode<float>(stored->token_fields.at("logprobs").data),
              (std::vector<float>{-0.5f, -1, -2}));
    batch.push_back(*std::move(stored));
  }
  absl::StatusOr<PutResult> put = store.Put("p", std::move(batch));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->accepted, 3);
  absl::StatusOr<PoolStats> pool = store.GetPool("p");
  ASSERT_TRUE(pool.ok());

  // A field the pool does not declare, and a declared one missing.
  v1::Sample extra = DenseSample("d", TestArray(v1::UINT8, {3}, std::vector<uint8_t>{1, 1, 1}),
                                 TestArray(v1::FLOAT32, {3}, std::vector<float>{0, 0, 0}));
  (*extra.mutable_token_fields())["advantages"] =
      TestArray(v1::FLOAT32, {3}, std::vector<float>{0, 0, 0});
  absl::StatusOr<StoredSample> stored = ValidateSample(extra, DenseModel(), options.token_fields);
  ASSERT_TRUE(stored.ok());
  absl::Status refused = store.Put("p", {*std::move(stored)}).status();
  EXPECT_THAT(refused.message(),
              HasSubstr("token_fields[\"advantages\"] is not among the pool's fields {logprobs, "
                        "loss_mask} (declared at registration)"));
  // finite_token_fields sees the converted values.
  stored = ValidateSample(
      DenseSample("e", TestArray(v1::UINT8, {3}, std::vector<uint8_t>{1, 1, 1}),
                  TestArray(v1::FLOAT64, {3},
                            std::vector<double>{0, std::numeric_limits<double>::infinity(), 0})),
      DenseModel(), options.token_fields);
  EXPECT_THAT(stored.status().message(),
              HasSubstr("sample \"e\": token_fields[\"logprobs\"] is inf at token 1"));
}

TEST(DeclaredTokenFieldsTest, WideningIsBoundedPerMessage) {
  v1::PoolOptions proto;
  v1::TokenFieldSchema* wide = proto.add_token_fields();
  wide->set_name("loss_mask");
  wide->set_dtype(v1::INT64);
  v1::TokenFieldSchema* logprobs = proto.add_token_fields();
  logprobs->set_name("logprobs");
  logprobs->set_dtype(v1::FLOAT32);
  const PoolOptions options = *FromProto(proto);
  const v1::Sample s = DenseSample("w", TestArray(v1::UINT8, {3}, std::vector<uint8_t>{1, 1, 1}),
                                   TestArray(v1::FLOAT32, {3}, std::vector<float>{0, 0, 0}));
  int64_t budget = 21;  // 3 tokens x 7 more bytes each
  EXPECT_TRUE(ValidateSample(s, DenseModel(), options.token_fields, &budget).ok());
  EXPECT_EQ(budget, 0);
  absl::Status refused = ValidateSample(s, DenseModel(), options.token_fields, &budget).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(),
              HasSubstr("token_fields[\"loss_mask\"] is uint8: converting it to the pool's int64 "
                        "adds 21 bytes, past what this message's conversions may add (0 bytes left"));
}

TEST(DeclaredTokenFieldsTest, UndeclaredFloat64IsRefusedByName) {
  absl::StatusOr<StoredSample> stored = ValidateSample(
      DenseSample("a", TestArray(v1::UINT8, {3}, std::vector<uint8_t>{1, 1, 1}),
                  TestArray(v1::FLOAT64, {3}, std::vector<double>{0, 0, 0})),
      DenseModel());
  EXPECT_EQ(stored.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(stored.status().message(),
              HasSubstr("sample \"a\": token_fields[\"logprobs\"] is float64, which a pool takes "
                        "only into a field it declares float32 with allow_narrowing"));
}

TEST(DeclaredTokenFieldsTest, MalformedDeclarationsAreRefused) {
  auto refused = [](auto edit) {
    v1::PoolOptions proto;
    v1::TokenFieldSchema* f = proto.add_token_fields();
    f->set_name("m");
    f->set_dtype(v1::UINT8);
    edit(proto, f);
    absl::StatusOr<PoolOptions> options = FromProto(proto);
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(options.status().message());
  };
  EXPECT_THAT(refused([](v1::PoolOptions&, v1::TokenFieldSchema* f) { f->set_dtype(v1::FLOAT64); }),
              HasSubstr("options.token_fields[\"m\"].dtype is float64; a pool stores"));
  EXPECT_THAT(refused([](v1::PoolOptions&, v1::TokenFieldSchema* f) { f->set_dtype(v1::DTYPE_UNSPECIFIED); }),
              HasSubstr(".dtype is dtype(0)"));
  EXPECT_THAT(refused([](v1::PoolOptions& p, v1::TokenFieldSchema*) { *p.add_token_fields() = p.token_fields(0); }),
              HasSubstr("options.token_fields[\"m\"] is declared twice"));
  EXPECT_THAT(refused([](v1::PoolOptions&, v1::TokenFieldSchema* f) { f->set_allow_narrowing(true); }),
              HasSubstr(".allow_narrowing is for float32 fields"));
  EXPECT_THAT(refused([](v1::PoolOptions&, v1::TokenFieldSchema* f) { f->add_trailing_shape(0); }),
              HasSubstr(".trailing_shape has dimension 0, must be >= 1"));
  EXPECT_THAT(refused([](v1::PoolOptions&, v1::TokenFieldSchema* f) { f->set_name(""); }),
              HasSubstr("options.token_fields has an entry without a name"));
}

}  // namespace
}  // namespace rollpack
