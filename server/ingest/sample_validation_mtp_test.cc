// Sample validation with MTP routing (layout.md section 10): payloads of
// N + D and |M| + D layers, every section 1 check applied to the MTP layers
// and named "MTP layer d (layer N+d)", storage [rows, |M| + D, K], and pieces
// stitched in the store with the MTP layers kept.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ingest/sample_validation.h"
#include "server/store/sample_store.h"
#include "testing/ndarrays.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// N = 6, MoE layers {1, 3, 5}, D = 2 (MTP layers 6 and 7), E = 16, K = 2:
// full payloads have 8 layers, compact ones 5.
constexpr int kFull = 8;
ModelSpec MtpModel(bool mtp_routing = true) {
  ModelSpec m;
  m.name = "mtp";
  m.num_layers = 6;
  m.moe_layers = {1, 3, 5};
  m.num_experts = 16;
  m.topk = 2;
  m.num_mtp_layers = 2;
  m.mtp_routing = mtp_routing;
  return m;
}
const std::vector<int> kStored = {1, 3, 5, 6, 7};  // global ids of the stored axis

int32_t Id(int64_t row, int layer, int j) {
  return static_cast<int32_t>((row * 3 + layer * 5 + j * 7) % 16);
}

// n tokens and an int32 full-layout payload [rows, 8, 2] from `offset`.
v1::Sample FullSample(int64_t n = 5, int64_t rows = 4, int64_t offset = 0) {
  v1::Sample s;
  s.set_sample_id("m1");
  std::vector<int32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), 100);
  *s.mutable_tokens() = TestArray(v1::INT32, {n}, tokens);
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < rows; ++r)
    for (int l = 0; l < kFull; ++l)
      for (int j = 0; j < 2; ++j) ids.push_back(Id(offset + r, l, j));
  *s.mutable_routed_experts() = TestArray(v1::INT32, {rows, kFull, 2}, ids);
  s.set_routed_experts_row_offset(static_cast<int32_t>(offset));
  return s;
}

// n = 5 tokens and an int32 payload [4, layers, 2] of valid ids.
v1::Sample ValidSampleWithLayers(int layers) {
  v1::Sample s = FullSample();
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < 4; ++r)
    for (int l = 0; l < layers; ++l)
      for (int j = 0; j < 2; ++j) ids.push_back(Id(r, l, j));
  *s.mutable_routed_experts() = TestArray(v1::INT32, {4, layers, 2}, ids);
  return s;
}

// The same rows in the compact layout [rows, 5, 2] of `dtype` (uint8 or int16).
template <typename T>
v1::Sample CompactSample(v1::DType dtype, int64_t n = 5, int64_t rows = 4) {
  v1::Sample s = FullSample(n, rows);
  std::vector<T> ids;
  for (int64_t r = 0; r < rows; ++r)
    for (int l : kStored)
      for (int j = 0; j < 2; ++j) ids.push_back(static_cast<T>(Id(r, l, j)));
  *s.mutable_routed_experts() = TestArray(dtype, {rows, 5, 2}, ids);
  return s;
}

void SetId(v1::Sample& s, int64_t row, int layer, int j, int32_t value) {
  std::memcpy(
      s.mutable_routed_experts()->mutable_data()->data() + ((row * kFull + layer) * 2 + j) * 4,
      &value, 4);
}

void ExpectInvalid(const v1::Sample& s, std::initializer_list<const char*> parts,
                   const ModelSpec& model = MtpModel()) {
  absl::StatusOr<StoredSample> r = ValidateSample(s, model);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  for (const char* part : parts) EXPECT_THAT(r.status().message(), HasSubstr(part));
}

TEST(SampleValidationMtpTest, FullLayoutStoresMoeThenMtpLayers) {
  absl::StatusOr<StoredSample> r = ValidateSample(FullSample(), MtpModel());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->experts.size(), 5u * 5 * 2) << "compact [n, |M| + D, K] at 1 byte per id";
  EXPECT_EQ(r->row_valid, (std::vector<uint8_t>{1, 1, 1, 1, 0}));
  for (int64_t row = 0; row < 4; ++row) {
    for (size_t p = 0; p < kStored.size(); ++p) {
      for (int j = 0; j < 2; ++j) {
        EXPECT_EQ(static_cast<uint8_t>(r->experts[(row * 5 + p) * 2 + j]), Id(row, kStored[p], j))
            << "row " << row << " stored layer " << p;
      }
    }
  }
  // The missing last token stays zero in every stored layer, MTP included.
  for (int i = 0; i < 10; ++i) EXPECT_EQ(r->experts[4 * 10 + i], '\0');
}

TEST(SampleValidationMtpTest, CompactAndNarrowFormsStoreTheSame) {
  absl::StatusOr<StoredSample> full = ValidateSample(FullSample(), MtpModel());
  ASSERT_TRUE(full.ok()) << full.status();
  absl::StatusOr<StoredSample> compact8 =
      ValidateSample(CompactSample<uint8_t>(v1::UINT8), MtpModel());
  absl::StatusOr<StoredSample> compact16 =
      ValidateSample(CompactSample<int16_t>(v1::INT16), MtpModel());
  ASSERT_TRUE(compact8.ok()) << compact8.status();
  ASSERT_TRUE(compact16.ok()) << compact16.status();
  EXPECT_EQ(*compact8, *full);
  EXPECT_EQ(*compact16, *full);
  // uint8 full layout: the word-at-a-time path gathers the MTP layers too.
  v1::Sample full8 = FullSample();
  std::vector<uint8_t> ids;
  for (int64_t r = 0; r < 4; ++r)
    for (int l = 0; l < kFull; ++l)
      for (int j = 0; j < 2; ++j) ids.push_back(static_cast<uint8_t>(Id(r, l, j)));
  *full8.mutable_routed_experts() = TestArray(v1::UINT8, {4, kFull, 2}, ids);
  v1::Sample owned = full8;
  absl::StatusOr<StoredSample> taken = ValidateAndTakeSample(&owned, MtpModel());
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, *full);
  // The compact uint8 payload is moved, not copied, and still equal.
  v1::Sample owned_compact = CompactSample<uint8_t>(v1::UINT8, 4, 4);
  absl::StatusOr<StoredSample> moved = ValidateAndTakeSample(&owned_compact, MtpModel());
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->experts, ValidateSample(CompactSample<uint8_t>(v1::UINT8, 4, 4), MtpModel())
                                ->experts);
}

TEST(SampleValidationMtpTest, DenseLayerEntriesAreIgnoredButMtpEntriesAreChecked) {
  v1::Sample s = FullSample();
  SetId(s, 0, 0, 0, 999);  // layers 0, 2, 4 are dense
  SetId(s, 1, 2, 1, -7);
  SetId(s, 2, 4, 0, 16);
  EXPECT_TRUE(ValidateSample(s, MtpModel()).ok());
  SetId(s, 2, 7, 1, 16);  // MTP layer 1
  ExpectInvalid(s, {"sample \"m1\": routed_experts row 2 (token 2) MTP layer 1 (layer 7) has "
                    "expert id 16, must be in [0, 16)"});
}

TEST(SampleValidationMtpTest, RefusesBadIdsInMtpLayersNamingThem) {
  v1::Sample dup = FullSample();
  SetId(dup, 3, 6, 1, Id(3, 6, 0));
  ExpectInvalid(dup, {"routed_experts row 3 (token 3) MTP layer 0 (layer 6) repeats expert id"});

  // Compact: the same MTP layer is at position |M| + d.
  v1::Sample compact = CompactSample<int16_t>(v1::INT16);
  const int16_t bad = 20;
  std::memcpy(compact.mutable_routed_experts()->mutable_data()->data() + ((1 * 5 + 4) * 2) * 2,
              &bad, 2);
  ExpectInvalid(compact, {"row 1 (token 1) MTP layer 1 (layer 7) has expert id 20"});

  // The decoder's layers keep their message.
  v1::Sample decoder = FullSample();
  SetId(decoder, 2, 3, 1, 16);
  ExpectInvalid(decoder, {"routed_experts row 2 (token 2) layer 3 has expert id 16"});
}

TEST(SampleValidationMtpTest, MissingRowsNeedMinusOneOnEveryRoutedLayerIncludingMtp) {
  v1::Sample all = FullSample();
  for (int l : kStored)
    for (int j = 0; j < 2; ++j) SetId(all, 1, l, j, -1);
  absl::StatusOr<StoredSample> r = ValidateSample(all, MtpModel());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->row_valid, (std::vector<uint8_t>{1, 0, 1, 1, 0}));

  // -1 on the decoder's MoE layers only: the MTP layers were captured.
  v1::Sample decoder_only = FullSample();
  for (int l : {1, 3, 5})
    for (int j = 0; j < 2; ++j) SetId(decoder_only, 1, l, j, -1);
  ExpectInvalid(decoder_only, {"row 1 (token 1) layer 1 has expert id -1", "whole row is -1"});

  // -1 on an MTP layer only.
  v1::Sample mtp_only = FullSample();
  for (int j = 0; j < 2; ++j) SetId(mtp_only, 2, 7, j, -1);
  ExpectInvalid(mtp_only, {"row 2 (token 2) MTP layer 1 (layer 7) has expert id -1",
                           "whole row is -1"});
}

TEST(SampleValidationMtpTest, RefusesAllZeroMtpLayerNamingIt) {
  v1::Sample s = FullSample();
  for (int64_t r = 0; r < 4; ++r)
    for (int j = 0; j < 2; ++j) SetId(s, r, 6, j, 0);
  ExpectInvalid(s, {"routed_experts MTP layer 0 (layer 6) is 0 for all 4 covered tokens",
                    "broken capture"});
  // With K = 2 a zero layer also repeats id 0: allowing zero layers leaves
  // that refusal.
  ModelSpec lenient = MtpModel();
  lenient.allow_all_zero_layers = true;
  ExpectInvalid(s, {"row 0 (token 0) MTP layer 0 (layer 6) repeats expert id 0"}, lenient);
  // The uint8 path names it the same way.
  v1::Sample narrow = CompactSample<uint8_t>(v1::UINT8);
  for (int64_t r = 0; r < 4; ++r)
    for (int j = 0; j < 2; ++j) (*narrow.mutable_routed_experts()->mutable_data())[(r * 5 + 4) * 2 + j] = 0;
  ExpectInvalid(narrow, {"routed_experts MTP layer 1 (layer 7) is 0 for all 4 covered tokens"});
}

TEST(SampleValidationMtpTest, LayerCountsFollowMtpRouting) {
  // With mtp_routing, the decoder-only counts are refused, naming the sums.
  ExpectInvalid(ValidSampleWithLayers(6), {"routed_experts has 6 layers",
                                          "num_layers + num_mtp_layers = 6 + 2 = 8",
                                          "len(moe_layers) + num_mtp_layers = 3 + 2 = 5"});
  ExpectInvalid(ValidSampleWithLayers(3), {"routed_experts has 3 layers"});
  // Without it, N + D and |M| + D are refused, pointing at mtp_routing.
  const ModelSpec live = MtpModel(false);
  ExpectInvalid(FullSample(),
                {"routed_experts has 8 layers, must be num_layers = 6 (full) or "
                 "len(moe_layers) = 3 (compact)",
                 "needs the model registered with mtp_routing"},
                live);
  ExpectInvalid(CompactSample<uint8_t>(v1::UINT8), {"routed_experts has 5 layers", "mtp_routing"},
                live);
  // ... and the decoder-only payloads are what it takes, stored [n, |M|, K].
  absl::StatusOr<StoredSample> r = ValidateSample(ValidSampleWithLayers(6), live);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->experts.size(), 5u * 3 * 2);
  // A count unrelated to MTP gets the message of a model without MTP layers.
  absl::StatusOr<StoredSample> other = ValidateSample(ValidSampleWithLayers(4), live);
  EXPECT_THAT(other.status().message(), Not(HasSubstr("mtp")));
}

// The uint8 word-at-a-time path and the per-id path agree on random MTP
// models, payloads and corruptions, errors included.
TEST(SampleValidationMtpTest, Uint8FastPathAgreesWithPerIdPath) {
  std::mt19937 rng(29);
  int refused = 0, accepted = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    ModelSpec model;
    model.name = "random";
    model.num_layers = 1 + static_cast<int>(rng() % 6);
    if (rng() % 2) {
      for (int l = 0; l < model.num_layers; ++l) {
        if (rng() % 2) model.moe_layers.push_back(l);
      }
      if (model.moe_layers.empty()) model.moe_layers.push_back(model.num_layers - 1);
    }
    model.topk = 1 + static_cast<int>(rng() % 6);
    model.num_experts = model.topk + static_cast<int>(rng() % (257 - model.topk));
    model.num_mtp_layers = 1 + static_cast<int>(rng() % 3);
    model.mtp_routing = true;
    model.allow_all_zero_layers = rng() % 4 == 0;
    const int d = model.num_mtp_layers;
    const int layers = (rng() % 2 ? model.num_layers : model.num_moe_layers()) + d;
    const int64_t n = 1 + rng() % 30;
    const int64_t rows = std::max<int64_t>(0, rng() % 2 ? n : n - 1);
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
    // Corrupt one of the last d layers (the MTP layers) most of the time.
    const int corruption = static_cast<int>(rng() % 4);
    const int bad_layer = layers - 1 - static_cast<int>(rng() % d);
    if (rows > 0 && corruption == 1) {
      ids[((rng() % rows) * layers + bad_layer) * k] = static_cast<int32_t>(rng() % 256);
    }
    if (rows > 0 && corruption == 2) {
      for (int64_t r = 0; r < rows; ++r)
        for (int j = 0; j < k; ++j) ids[(r * layers + bad_layer) * k + j] = 0;
    }
    v1::Sample wide;
    wide.set_sample_id(absl::StrCat("r", iter));
    *wide.mutable_tokens() = TestArray(v1::INT32, {n}, std::vector<int32_t>(n, 7));
    *wide.mutable_routed_experts() = TestArray(v1::INT32, {rows, layers, k}, ids);
    v1::Sample narrow = wide;
    *narrow.mutable_routed_experts() =
        TestArray(v1::UINT8, {rows, layers, k}, std::vector<uint8_t>(ids.begin(), ids.end()));
    const absl::StatusOr<StoredSample> reference = ValidateSample(wide, model);
    v1::Sample owned = narrow;
    const absl::StatusOr<StoredSample> taken = ValidateAndTakeSample(&owned, model);
    ASSERT_EQ(taken.status(), reference.status()) << "iteration " << iter;
    if (!reference.ok()) {
      ++refused;
      continue;
    }
    ++accepted;
    ASSERT_TRUE(*taken == *reference) << "iteration " << iter;
    ASSERT_EQ(reference->experts.size(),
              static_cast<size_t>(n) * (model.num_moe_layers() + d) * k);
  }
  EXPECT_GT(refused, 200);
  EXPECT_GT(accepted, 200);
}

// A rollout sent in pieces is stored as the same sample sent whole, MTP
// layers included (the store stitches rows of |M| + D layers).
TEST(SampleValidationMtpTest, PiecesStitchMtpLayers) {
  SampleStore store(int64_t{1} << 30);
  ASSERT_TRUE(store.RegisterModel("p", MtpModel()).ok());
  const int64_t n = 9;
  auto piece = [&](int index, bool partial, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
    v1::Sample s = FullSample(n, n - 1);
    s.set_piece(index);
    s.set_partial(partial);
    std::vector<int32_t> tokens(t1 - t0);
    std::iota(tokens.begin(), tokens.end(), 100 + static_cast<int32_t>(t0));
    *s.mutable_tokens() = TestArray(v1::INT32, {t1 - t0}, tokens);
    std::vector<int32_t> ids;
    for (int64_t r = r0; r < r1; ++r)
      for (int l = 0; l < kFull; ++l)
        for (int j = 0; j < 2; ++j) ids.push_back(Id(r, l, j));
    *s.mutable_routed_experts() = TestArray(v1::INT32, {r1 - r0, kFull, 2}, ids);
    s.set_routed_experts_row_offset(static_cast<int32_t>(r0));
    return s;
  };
  for (const v1::Sample& s : {piece(0, true, 0, 4, 0, 3), piece(1, true, 4, 7, 3, 6),
                              piece(2, false, 7, 9, 6, 8)}) {
    absl::StatusOr<StoredSample> v = ValidateSample(s, MtpModel());
    ASSERT_TRUE(v.ok()) << v.status();
    std::vector<StoredSample> batch;
    batch.push_back(*std::move(v));
    absl::StatusOr<PutResult> put = store.Put("p", std::move(batch));
    ASSERT_TRUE(put.ok()) << put.status();
  }
  Topology t;
  t.max_tokens_per_rank = 1 << 16;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep("s", "p", {"m1"}, 0, t);
  ASSERT_TRUE(step.ok()) << step.status();
  absl::StatusOr<StoredSample> whole = ValidateSample(FullSample(n, n - 1), MtpModel());
  ASSERT_TRUE(whole.ok()) << whole.status();
  const StoredSample& stored = *(*step)->samples.at(0);
  EXPECT_EQ(stored.experts, whole->experts);
  EXPECT_EQ(stored.row_valid, whole->row_valid);
  EXPECT_EQ(stored.tokens, whole->tokens);
}

// A sealed sample in pieces whose MTP layer is all zero is refused naming it
// (K = 1: the zero layer repeats no id, so only the seal's check sees it).
TEST(SampleValidationMtpTest, PieceSealRefusesAllZeroMtpLayer) {
  ModelSpec model = MtpModel();
  model.topk = 1;
  SampleStore store(int64_t{1} << 30);
  ASSERT_TRUE(store.RegisterModel("p", model).ok());
  auto piece = [&](int index, bool partial, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
    v1::Sample s;
    s.set_sample_id("z");
    s.set_piece(index);
    s.set_partial(partial);
    std::vector<int32_t> tokens(t1 - t0, 5);
    *s.mutable_tokens() = TestArray(v1::INT32, {t1 - t0}, tokens);
    std::vector<int32_t> ids;
    for (int64_t r = r0; r < r1; ++r)
      for (int l = 0; l < kFull; ++l) ids.push_back(l == 7 ? 0 : Id(r, l, 0));
    *s.mutable_routed_experts() = TestArray(v1::INT32, {r1 - r0, kFull, 1}, ids);
    s.set_routed_experts_row_offset(static_cast<int32_t>(r0));
    return s;
  };
  int index = 0;
  for (const v1::Sample& s : {piece(0, true, 0, 3, 0, 2), piece(1, false, 3, 4, 2, 3)}) {
    absl::StatusOr<StoredSample> v = ValidateSample(s, model);
    ASSERT_TRUE(v.ok()) << v.status();
    std::vector<StoredSample> batch;
    batch.push_back(*std::move(v));
    absl::StatusOr<PutResult> put = store.Put("p", std::move(batch));
    if (index++ == 0) {
      ASSERT_TRUE(put.ok()) << put.status();
    } else {
      EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument) << put.status();
      EXPECT_THAT(put.status().message(),
                  HasSubstr("routed_experts MTP layer 1 (layer 7) is 0 for all 3 covered tokens"));
    }
  }
  // The same sample sent whole is refused with the same words.
  v1::Sample whole = piece(0, false, 0, 4, 0, 3);
  ExpectInvalid(whole, {"routed_experts MTP layer 1 (layer 7) is 0 for all 3 covered tokens"},
                model);
}

}  // namespace
}  // namespace rollpack
