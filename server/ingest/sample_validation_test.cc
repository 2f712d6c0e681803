// One test per validation rule of layout.md section 1: each asserts the
// status code and that the message names the sample, field and numbers.
#include "server/ingest/sample_validation.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/ndarrays.h"

namespace rollpack {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// 6 layers, MoE layers {1, 3, 4, 5}, E = 16, K = 2.
ModelSpec TestModel() {
  ModelSpec m;
  m.name = "tiny";
  m.num_layers = 6;
  m.moe_layers = {1, 3, 4, 5};
  m.num_experts = 16;
  m.topk = 2;
  return m;
}

// Expert ids of (row, layer) for a valid payload: distinct, in [0, 16).
int32_t Id(int64_t row, int layer, int j) { return static_cast<int32_t>((row * 3 + layer * 5 + j * 7) % 16); }

// A valid sample with n tokens and a full-layout int32 payload of `rows` rows.
v1::Sample ValidSample(int64_t n = 5, int64_t rows = 4, int64_t offset = 0) {
  v1::Sample s;
  s.set_sample_id("s17");
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>(100 + i);
  *s.mutable_tokens() = TestArray(v1::INT32, {n}, tokens);
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < rows; ++r)
    for (int l = 0; l < 6; ++l)
      for (int j = 0; j < 2; ++j) ids.push_back(Id(offset + r, l, j));
  *s.mutable_routed_experts() = TestArray(v1::INT32, {rows, 6, 2}, ids);
  s.set_routed_experts_row_offset(static_cast<int32_t>(offset));
  std::vector<float> logprobs(n, -0.5f);
  (*s.mutable_token_fields())["logprobs"] = TestArray(v1::FLOAT32, {n}, logprobs);
  return s;
}

// Writes id `value` at (row, layer, j) of an int32 full-layout payload.
void SetId(v1::Sample& s, int64_t row, int layer, int j, int32_t value) {
  std::memcpy(s.mutable_routed_experts()->mutable_data()->data() + ((row * 6 + layer) * 2 + j) * 4,
              &value, 4);
}

void ExpectInvalid(const v1::Sample& s, std::initializer_list<const char*> parts,
                   const ModelSpec& model = TestModel()) {
  absl::StatusOr<StoredSample> r = ValidateSample(s, model);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  for (const char* part : parts) EXPECT_THAT(r.status().message(), HasSubstr(part));
}

TEST(SampleValidationTest, AcceptsValidSampleAndStoresCompactUint8) {
  absl::StatusOr<StoredSample> r = ValidateSample(ValidSample(), TestModel());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->num_tokens(), 5);
  EXPECT_EQ(r->experts.size(), 5u * 4 * 2) << "compact [n, |M|, K] at 1 byte per id";
  EXPECT_EQ(r->row_valid, (std::vector<uint8_t>{1, 1, 1, 1, 0})) << "n-1 rows: last token missing";
  // Row 2, MoE layer 3 (position 1), j = 1.
  EXPECT_EQ(static_cast<uint8_t>(r->experts[(2 * 4 + 1) * 2 + 1]), Id(2, 3, 1));
}

TEST(SampleValidationTest, StoresUint16WhenMoreThan256Experts) {
  ModelSpec model = TestModel();
  model.num_experts = 300;
  absl::StatusOr<StoredSample> r = ValidateSample(ValidSample(), model);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->experts.size(), 5u * 4 * 2 * 2);
}

TEST(SampleValidationTest, AcceptsRowsEndingAtN) {
  EXPECT_TRUE(ValidateSample(ValidSample(5, 5), TestModel()).ok());
}

TEST(SampleValidationTest, AcceptsRowOffset) {
  absl::StatusOr<StoredSample> r = ValidateSample(ValidSample(6, 3, 2), TestModel());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->row_valid, (std::vector<uint8_t>{0, 0, 1, 1, 1, 0}));
  EXPECT_EQ(static_cast<uint8_t>(r->experts[(2 * 4 + 0) * 2 + 0]), Id(2, 1, 0));
}

TEST(SampleValidationTest, AcceptsZeroRowPayloadEndingAtN) {
  EXPECT_TRUE(ValidateSample(ValidSample(3, 0, 3), TestModel()).ok());
  EXPECT_TRUE(ValidateSample(ValidSample(3, 0, 2), TestModel()).ok());
}

TEST(SampleValidationTest, CompactLayoutEqualsFullLayout) {
  v1::Sample full = ValidSample();
  v1::Sample compact = full;
  std::vector<uint8_t> ids;
  for (int64_t r = 0; r < 4; ++r)
    for (int l : {1, 3, 4, 5})
      for (int j = 0; j < 2; ++j) ids.push_back(static_cast<uint8_t>(Id(r, l, j)));
  *compact.mutable_routed_experts() = TestArray(v1::UINT8, {4, 4, 2}, ids);
  absl::StatusOr<StoredSample> a = ValidateSample(full, TestModel());
  absl::StatusOr<StoredSample> b = ValidateSample(compact, TestModel());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

TEST(SampleValidationTest, IgnoresDenseLayerEntriesOfFullLayout) {
  v1::Sample s = ValidSample();
  SetId(s, 0, 0, 0, 999);  // layer 0 is dense
  SetId(s, 0, 2, 1, -7);   // layer 2 is dense
  EXPECT_TRUE(ValidateSample(s, TestModel()).ok());
}

TEST(SampleValidationTest, AllMinusOneRowIsMissing) {
  v1::Sample s = ValidSample();
  for (int l : {1, 3, 4, 5})
    for (int j = 0; j < 2; ++j) SetId(s, 1, l, j, -1);
  absl::StatusOr<StoredSample> r = ValidateSample(s, TestModel());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->row_valid, (std::vector<uint8_t>{1, 0, 1, 1, 0}));
}

TEST(SampleValidationTest, RefusesEmptySampleId) {
  v1::Sample s = ValidSample();
  s.clear_sample_id();
  ExpectInvalid(s, {"sample_id is empty"});
}

TEST(SampleValidationTest, GroupSizeNeedsAGroupAndIsNotNegative) {
  v1::Sample s = ValidSample();
  s.set_group_size(-1);
  s.set_group_id("g");
  ExpectInvalid(s, {"sample \"s17\": group_size is -1, must be >= 0"});
  s.set_group_size(8);
  s.clear_group_id();
  ExpectInvalid(s, {"sample \"s17\": group_size is 8 but group_id is empty"});
  s.set_group_id("g");
  absl::StatusOr<StoredSample> stored = ValidateSample(s, TestModel());
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->group_size, 8);
}

// A piece (lifecycle.md section 5) is kept alone: its rows from their
// offset, checked as today except where they end (the store's check).
TEST(SampleValidationTest, APieceKeepsItsRowsAlone) {
  v1::Sample first = ValidSample(/*n=*/5, /*rows=*/2, /*offset=*/1);
  first.set_partial(true);
  absl::StatusOr<StoredSample> stored = ValidateSample(first, TestModel());
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_TRUE(stored->piece_message.has_value());
  EXPECT_EQ(stored->piece_message->index, 0);
  EXPECT_TRUE(stored->piece_message->partial);
  EXPECT_EQ(stored->piece_message->rows_begin, 1);
  EXPECT_EQ(stored->row_valid.size(), 2u);
  EXPECT_EQ(stored->experts.size(), 2u * 4 * 2);
  EXPECT_EQ(stored->num_tokens(), 5);
  // A first piece's rows stay inside its tokens.
  v1::Sample past = ValidSample(/*n=*/5, /*rows=*/5, /*offset=*/1);
  past.set_partial(true);
  ExpectInvalid(past, {"sample \"s17\": routed_experts has 5 rows from offset 1, ending at 6; "
                       "must end inside its 5 tokens"});
  // A later piece may carry no tokens and no rows (it only seals), and its
  // rows may start past its own tokens (whole-sample positions).
  v1::Sample seal;
  seal.set_sample_id("s17");
  seal.set_piece(3);
  absl::StatusOr<StoredSample> sealing = ValidateSample(seal, TestModel());
  ASSERT_TRUE(sealing.ok()) << sealing.status();
  EXPECT_EQ(sealing->num_tokens(), 0);
  EXPECT_FALSE(sealing->piece_message->partial);
  v1::Sample later = ValidSample(/*n=*/2, /*rows=*/3, /*offset=*/40);
  later.set_piece(1);
  ASSERT_TRUE(ValidateSample(later, TestModel()).ok());
  // Ids are checked as in a whole sample.
  SetId(later, 0, 1, 0, 16);
  ExpectInvalid(later, {"routed_experts row 0 (token 40) layer 1 has expert id 16"});
  v1::Sample negative = ValidSample();
  negative.set_piece(-1);
  ExpectInvalid(negative, {"piece is -1, must be >= 0"});
}

TEST(SampleValidationTest, RefusesMissingTokens) {
  v1::Sample s = ValidSample();
  s.clear_tokens();
  ExpectInvalid(s, {"sample \"s17\": tokens is missing"});
}

TEST(SampleValidationTest, RefusesNonInt32Tokens) {
  v1::Sample s = ValidSample();
  *s.mutable_tokens() = TestArray(v1::INT64, {5}, std::vector<int64_t>(5, 1));
  ExpectInvalid(s, {"sample \"s17\": tokens has dtype int64, must be int32"});
}

TEST(SampleValidationTest, RefusesTokensOfRankTwo) {
  v1::Sample s = ValidSample();
  *s.mutable_tokens() = TestArray(v1::INT32, {5, 1}, std::vector<int32_t>(5, 1));
  ExpectInvalid(s, {"tokens has rank 2, must be 1"});
}

TEST(SampleValidationTest, RefusesEmptyTokens) {
  v1::Sample s = ValidSample();
  *s.mutable_tokens() = TestArray(v1::INT32, {0}, std::vector<int32_t>());
  ExpectInvalid(s, {"tokens is empty"});
}

TEST(SampleValidationTest, RefusesTokensByteLengthMismatch) {
  v1::Sample s = ValidSample();
  s.mutable_tokens()->mutable_data()->pop_back();
  ExpectInvalid(s, {"sample \"s17\": tokens: 19 bytes of data", "needs 20"});
}

TEST(SampleValidationTest, RefusesRoutedExpertsForDenseModel) {
  ModelSpec dense = TestModel();
  dense.num_experts = 0;
  dense.topk = 0;
  dense.moe_layers.clear();
  ExpectInvalid(ValidSample(), {"routed_experts sent", "dense"}, dense);
}

TEST(SampleValidationTest, RefusesMissingRoutedExpertsForMoeModel) {
  v1::Sample s = ValidSample();
  s.clear_routed_experts();
  ExpectInvalid(s, {"sample \"s17\": routed_experts is missing"});
}

TEST(SampleValidationTest, RefusesFloatRoutedExperts) {
  v1::Sample s = ValidSample();
  *s.mutable_routed_experts() = TestArray(v1::FLOAT32, {4, 6, 2}, std::vector<float>(48, 1.0f));
  ExpectInvalid(s, {"routed_experts has dtype float32"});
}

TEST(SampleValidationTest, RefusesUint8WhenMoreThan256Experts) {
  ModelSpec model = TestModel();
  model.num_experts = 300;
  v1::Sample s = ValidSample();
  *s.mutable_routed_experts() = TestArray(v1::UINT8, {4, 6, 2}, std::vector<uint8_t>(48, 1));
  ExpectInvalid(s, {"routed_experts is uint8 but num_experts is 300"}, model);
}

TEST(SampleValidationTest, RefusesRoutedExpertsOfRankTwo) {
  v1::Sample s = ValidSample();
  *s.mutable_routed_experts() = TestArray(v1::INT32, {4, 12}, std::vector<int32_t>(48, 1));
  ExpectInvalid(s, {"routed_experts has rank 2, must be 3"});
}

TEST(SampleValidationTest, RefusesWrongLayerAxis) {
  v1::Sample s = ValidSample();
  *s.mutable_routed_experts() = TestArray(v1::INT32, {4, 5, 2}, std::vector<int32_t>(40, 1));
  ExpectInvalid(s, {"routed_experts has 5 layers, must be num_layers = 6 (full) or "
                    "len(moe_layers) = 4 (compact)"});
}

TEST(SampleValidationTest, RefusesWrongTopk) {
  v1::Sample s = ValidSample();
  *s.mutable_routed_experts() = TestArray(v1::INT32, {4, 6, 3}, std::vector<int32_t>(72, 1));
  ExpectInvalid(s, {"routed_experts has topk 3, model topk is 2"});
}

TEST(SampleValidationTest, RefusesNegativeRowOffset) {
  v1::Sample s = ValidSample();
  s.set_routed_experts_row_offset(-1);
  ExpectInvalid(s, {"routed_experts_row_offset is -1"});
}

TEST(SampleValidationTest, RefusesOneRowTooMany) {
  ExpectInvalid(ValidSample(5, 6),
                {"sample \"s17\": routed_experts has 6 rows from offset 0, ending at 6; must end at "
                 "n = 5 or n - 1 = 4"});
}

TEST(SampleValidationTest, RefusesTwoRowsTooFew) {
  ExpectInvalid(ValidSample(5, 3), {"has 3 rows from offset 0, ending at 3"});
}

TEST(SampleValidationTest, RefusesExpertIdOutOfRange) {
  v1::Sample s = ValidSample();
  SetId(s, 2, 3, 1, 16);
  ExpectInvalid(s, {"routed_experts row 2 (token 2) layer 3 has expert id 16, must be in [0, 16)"});
}

TEST(SampleValidationTest, RefusesPartialMinusOneRow) {
  v1::Sample s = ValidSample();
  SetId(s, 1, 4, 0, -1);
  ExpectInvalid(s, {"row 1 (token 1) layer 4 has expert id -1", "whole row is -1"});
}

TEST(SampleValidationTest, RefusesDuplicateIdInRow) {
  v1::Sample s = ValidSample();
  SetId(s, 3, 5, 1, Id(3, 5, 0));
  ExpectInvalid(s, {"routed_experts row 3 (token 3) layer 5 repeats expert id"});
}

TEST(SampleValidationTest, RefusesAllZeroMoeLayerNamingIt) {
  v1::Sample s = ValidSample();
  for (int64_t r = 0; r < 4; ++r)
    for (int j = 0; j < 2; ++j) SetId(s, r, 4, j, 0);
  ExpectInvalid(s, {"MoE layer 4 is 0 for all 4 covered tokens", "broken capture"});
}

TEST(SampleValidationTest, RefusesAllZeroLayerWithTopkOne) {
  ModelSpec model = TestModel();
  model.topk = 1;
  v1::Sample s;
  s.set_sample_id("k1");
  *s.mutable_tokens() = TestArray(v1::INT32, {3}, std::vector<int32_t>{1, 2, 3});
  std::vector<int16_t> ids = {5, 6, 0, 7, 5, 6, 0, 7, 5, 6, 0, 7};  // [3, 4 (compact), 1]
  *s.mutable_routed_experts() = TestArray(v1::INT16, {3, 4, 1}, ids);
  ExpectInvalid(s, {"MoE layer 4 is 0 for all 3 covered tokens"}, model);
  model.allow_all_zero_layers = true;
  EXPECT_TRUE(ValidateSample(s, model).ok());
}

TEST(SampleValidationTest, ZeroLayerCheckNeedsMoreThanOneCoveredRow) {
  ModelSpec model = TestModel();
  model.topk = 1;
  v1::Sample s;
  s.set_sample_id("one-row");
  *s.mutable_tokens() = TestArray(v1::INT32, {2}, std::vector<int32_t>{1, 2});
  *s.mutable_routed_experts() = TestArray(v1::INT16, {1, 4, 1}, std::vector<int16_t>{0, 0, 0, 0});
  EXPECT_TRUE(ValidateSample(s, model).ok());
}

TEST(SampleValidationTest, RefusesTokenFieldOfWrongLength) {
  v1::Sample s = ValidSample();
  (*s.mutable_token_fields())["advantages"] = TestArray(v1::FLOAT32, {4}, std::vector<float>(4, 1));
  ExpectInvalid(s, {"sample \"s17\": token_fields[\"advantages\"] has first dimension 4, must be n = 5"});
}

TEST(SampleValidationTest, RefusesTokenFieldWithUnknownDtype) {
  v1::Sample s = ValidSample();
  v1::NDArray bad = TestArray(v1::FLOAT32, {5}, std::vector<float>(5, 1));
  bad.set_dtype(static_cast<v1::DType>(77));
  (*s.mutable_token_fields())["x"] = bad;
  ExpectInvalid(s, {"token_fields[\"x\"]: unknown dtype"});
}

TEST(SampleValidationTest, RefusesTokenFieldOfRankAboveWhatTheLogKeeps) {
  v1::Sample s = ValidSample();
  std::vector<int64_t> shape(18, 1);
  shape[0] = 5;
  (*s.mutable_token_fields())["deep"] = TestArray(v1::UINT8, shape, std::vector<uint8_t>(5, 1));
  ExpectInvalid(s, {"sample \"s17\": token_fields[\"deep\"] has rank 18, at most 17"});
  shape.pop_back();
  (*s.mutable_token_fields())["deep"] = TestArray(v1::UINT8, shape, std::vector<uint8_t>(5, 1));
  EXPECT_TRUE(ValidateSample(s, TestModel()).ok());
}

TEST(SampleValidationTest, AcceptsTokenFieldWithTrailingDims) {
  v1::Sample s = ValidSample();
  (*s.mutable_token_fields())["topk_logprobs"] =
      TestArray(v1::BFLOAT16, {5, 4}, std::vector<uint16_t>(20, 3));
  absl::StatusOr<StoredSample> r = ValidateSample(s, TestModel());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->token_fields.at("topk_logprobs").trailing_shape, std::vector<int64_t>{4});
  EXPECT_EQ(r->token_fields.at("topk_logprobs").row_bytes(), 8);
}

// Payloads of the stored id width (uint8 when E <= 256; uint16, and int16
// without a negative id, when E > 256) take a word-at-a-time path
// (server/ingest/expert_id_check.h) and ingest moves their bytes; the same
// ids as int32 take the per-id path. Both must give the same result, errors
// included, over random models, layouts and corruptions.
void ExpectFastPathAgreesWithPerIdPath(v1::DType dtype, unsigned seed) {
  std::mt19937 rng(seed);
  const bool wide_ids = dtype != v1::UINT8;
  int refused = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    ModelSpec model;
    model.name = "random";
    model.num_layers = 1 + static_cast<int>(rng() % 6);
    if (rng() % 2) {
      for (int l = 0; l < model.num_layers; ++l) {
        if (rng() % 2) model.moe_layers.push_back(l);
      }
      if (model.moe_layers.empty()) model.moe_layers.push_back(model.num_layers - 1);
    }
    model.topk = 1 + static_cast<int>(rng() % 10);
    model.num_experts = wide_ids ? 257 + static_cast<int>(rng() % 1500)
                                 : model.topk + static_cast<int>(rng() % (257 - model.topk));
    model.allow_all_zero_layers = rng() % 4 == 0;
    const std::vector<int> moe = model.ResolvedMoeLayers();
    const bool full = rng() % 2;
    const int layers = full ? model.num_layers : static_cast<int>(moe.size());
    const int64_t n = 1 + rng() % 40;
    const int64_t offset = rng() % 3 == 0 ? rng() % n : 0;
    const int64_t rows = std::max<int64_t>(0, (rng() % 2 ? n : n - 1) - offset);
    const int k = model.topk;
    std::vector<int32_t> ids(rows * layers * k);
    std::vector<int> perm(model.num_experts);
    for (int64_t g = 0; g < rows * layers; ++g) {
      std::iota(perm.begin(), perm.end(), 0);
      for (int j = 0; j < k; ++j) {
        std::swap(perm[j], perm[j + rng() % (model.num_experts - j)]);
        ids[g * k + j] = perm[j];
      }
    }
    const int corruption = static_cast<int>(rng() % 6);
    const int id_range = wide_ids ? 2048 : 256;
    if (!ids.empty() && corruption == 1) ids[rng() % ids.size()] = static_cast<int32_t>(rng() % id_range);
    if (!ids.empty() && corruption == 2 && k > 1) {
      const int64_t g = rng() % (rows * layers);
      ids[g * k + rng() % k] = ids[g * k + rng() % k];
    }
    if (corruption == 3) {  // one layer all zero
      const int l = static_cast<int>(rng() % layers);
      for (int64_t r = 0; r < rows; ++r)
        for (int j = 0; j < k; ++j) ids[(r * layers + l) * k + j] = 0;
    }
    if (corruption == 4 && rows > 0 && dtype == v1::INT16) {  // a missing row
      const int64_t r = rng() % rows;
      for (int64_t i = 0; i < int64_t{layers} * k; ++i) ids[r * layers * k + i] = -1;
    }
    v1::Sample wide;
    wide.set_sample_id(absl::StrCat("r", iter));
    *wide.mutable_tokens() = TestArray(v1::INT32, {n}, std::vector<int32_t>(n, 7));
    (*wide.mutable_token_fields())["mask"] = TestArray(v1::UINT8, {n}, std::vector<uint8_t>(n, 1));
    wide.set_routed_experts_row_offset(static_cast<int32_t>(offset));
    *wide.mutable_routed_experts() = TestArray(v1::INT32, {rows, layers, k}, ids);
    v1::Sample narrow = wide;
    if (dtype == v1::UINT8) {
      *narrow.mutable_routed_experts() =
          TestArray(v1::UINT8, {rows, layers, k}, std::vector<uint8_t>(ids.begin(), ids.end()));
    } else if (dtype == v1::UINT16) {
      *narrow.mutable_routed_experts() =
          TestArray(v1::UINT16, {rows, layers, k}, std::vector<uint16_t>(ids.begin(), ids.end()));
    } else {
      *narrow.mutable_routed_experts() =
          TestArray(v1::INT16, {rows, layers, k}, std::vector<int16_t>(ids.begin(), ids.end()));
    }
    const absl::StatusOr<StoredSample> reference = ValidateSample(wide, model);
    const absl::StatusOr<StoredSample> copied = ValidateSample(narrow, model);
    v1::Sample owned = narrow;
    const absl::StatusOr<StoredSample> taken = ValidateAndTakeSample(&owned, model);
    ASSERT_EQ(copied.status(), reference.status()) << "iteration " << iter;
    ASSERT_EQ(taken.status(), reference.status()) << "iteration " << iter;
    if (reference.ok()) {
      ASSERT_TRUE(*copied == *reference) << "iteration " << iter;
      ASSERT_TRUE(*taken == *reference) << "iteration " << iter;
    } else {
      ++refused;
    }
  }
  EXPECT_GT(refused, 300) << "the corruptions reach the error paths";
}

TEST(SampleValidationTest, Uint8FastPathAgreesWithPerIdPath) {
  ExpectFastPathAgreesWithPerIdPath(v1::UINT8, 17);
}

TEST(SampleValidationTest, Uint16AndInt16FastPathAgreesWithPerIdPath) {
  ExpectFastPathAgreesWithPerIdPath(v1::UINT16, 18);
  ExpectFastPathAgreesWithPerIdPath(v1::INT16, 19);
}

TEST(SampleValidationTest, FiniteTokenFieldsRefuseNanAndInfinityNamingTheToken) {
  ModelSpec model = TestModel();
  model.finite_token_fields = {"logprobs", "advantages"};
  v1::Sample s = ValidSample();
  // Without the option a NaN passes (as before); with it, it is refused.
  std::vector<float> logprobs(5, -0.5f);
  logprobs[3] = std::nanf("");
  (*s.mutable_token_fields())["logprobs"] = TestArray(v1::FLOAT32, {5}, logprobs);
  EXPECT_TRUE(ValidateSample(s, TestModel()).ok());
  ExpectInvalid(s, {"sample \"s17\"", "token_fields[\"logprobs\"]", "nan at token 3",
                    "finite_token_fields"},
                model);
  logprobs[3] = -std::numeric_limits<float>::infinity();
  (*s.mutable_token_fields())["logprobs"] = TestArray(v1::FLOAT32, {5}, logprobs);
  ExpectInvalid(s, {"-inf at token 3"}, model);
  // A field not named is not checked.
  logprobs[3] = -0.5f;
  (*s.mutable_token_fields())["logprobs"] = TestArray(v1::FLOAT32, {5}, logprobs);
  std::vector<float> values(5, std::nanf(""));
  (*s.mutable_token_fields())["values"] = TestArray(v1::FLOAT32, {5}, values);
  EXPECT_TRUE(ValidateSample(s, model).ok());
  // 16-bit floats, and the token of an element of a 2-D field: [5, 2],
  // element 7 is token 3. 0x7C00 is +inf in float16, 0x7FC0 NaN in bfloat16.
  std::vector<uint16_t> half(10, 0x3C00);
  half[7] = 0x7C00;
  (*s.mutable_token_fields())["advantages"] = TestArray(v1::FLOAT16, {5, 2}, half);
  ExpectInvalid(s, {"token_fields[\"advantages\"] is inf at token 3 (element 7)"}, model);
  std::vector<uint16_t> bf16(10, 0x3F80);
  bf16[0] = 0x7FC0;
  (*s.mutable_token_fields())["advantages"] = TestArray(v1::BFLOAT16, {5, 2}, bf16);
  ExpectInvalid(s, {"is nan at token 0"}, model);
  bf16[0] = 0x7F7F;  // the largest finite bfloat16
  (*s.mutable_token_fields())["advantages"] = TestArray(v1::BFLOAT16, {5, 2}, bf16);
  EXPECT_TRUE(ValidateSample(s, model).ok());
  // The spec itself: a field named twice or empty is refused.
  model.finite_token_fields = {"a", "a"};
  EXPECT_THAT(ValidateModelSpec(model).message(), HasSubstr("names \"a\" twice"));
}

}  // namespace
}  // namespace rollpack
