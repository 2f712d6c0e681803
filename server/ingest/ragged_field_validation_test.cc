// Ragged per-token fields at ingest (layout.md section 13): what is stored,
// and one test per refusal, each naming the sample, field, token and value.
#include "server/ingest/ragged_field_validation.h"

#include <cstring>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ingest/sample_validation.h"
#include "testing/ndarrays.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

// Dense, V = `vocab`.
ModelSpec Model(int vocab) {
  ModelSpec m;
  m.name = "dense";
  m.num_layers = 2;
  m.vocab_size = vocab;
  return m;
}

// 4 tokens; "sampling_mask" lists {5, 9}, {}, {0}, {7, 8, 2}.
v1::Sample MaskedSample(v1::DType values_dtype = v1::INT32, v1::DType offsets_dtype = v1::INT32) {
  v1::Sample s;
  s.set_sample_id("s1");
  *s.mutable_tokens() = TestArray(v1::INT32, std::vector<int32_t>{10, 11, 12, 13});
  v1::RaggedArray& mask = (*s.mutable_ragged_token_fields())["sampling_mask"];
  const std::vector<int64_t> ids = {5, 9, 0, 7, 8, 2};
  if (values_dtype == v1::INT64) {
    *mask.mutable_values() = TestArray(v1::INT64, ids);
  } else if (values_dtype == v1::UINT16) {
    *mask.mutable_values() = TestArray(v1::UINT16, std::vector<uint16_t>(ids.begin(), ids.end()));
  } else {
    *mask.mutable_values() =
        TestArray(values_dtype, std::vector<int32_t>(ids.begin(), ids.end()));
  }
  const std::vector<int64_t> offsets = {0, 2, 2, 3, 6};
  if (offsets_dtype == v1::INT64) {
    *mask.mutable_offsets() = TestArray(v1::INT64, offsets);
  } else {
    *mask.mutable_offsets() =
        TestArray(offsets_dtype, std::vector<int32_t>(offsets.begin(), offsets.end()));
  }
  return s;
}

v1::RaggedArray& Mask(v1::Sample& s) { return (*s.mutable_ragged_token_fields())["sampling_mask"]; }

template <typename T>
std::vector<T> Values(const StoredRagged& f) {
  std::vector<T> out(f.values.size() / sizeof(T));
  std::memcpy(out.data(), f.values.data(), f.values.size());
  return out;
}

void ExpectInvalid(const v1::Sample& s, std::initializer_list<const char*> parts,
                   const ModelSpec& model = Model(1000),
                   std::vector<DeclaredTokenField> declared = {}) {
  absl::StatusOr<StoredSample> r = ValidateSample(s, model, declared);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("sample \"s1\": "));
  for (const char* part : parts) EXPECT_THAT(r.status().message(), HasSubstr(part));
}

TEST(RaggedFieldValidationTest, StoresUint16IdsAndInt64OffsetsWhateverCameIn) {
  for (v1::DType values : {v1::INT32, v1::INT64, v1::UINT16}) {
    for (v1::DType offsets : {v1::INT32, v1::INT64}) {
      absl::StatusOr<StoredSample> r = ValidateSample(MaskedSample(values, offsets), Model(1000));
      ASSERT_TRUE(r.ok()) << r.status();
      const StoredRagged& f = r->ragged_fields.at("sampling_mask");
      EXPECT_EQ(f.dtype, v1::UINT16) << "V = 1000 <= 65536";
      EXPECT_EQ(f.offsets, (std::vector<int64_t>{0, 2, 2, 3, 6}));
      EXPECT_EQ(Values<uint16_t>(f), (std::vector<uint16_t>{5, 9, 0, 7, 8, 2}));
      EXPECT_EQ(f.num_tokens(), 4);
    }
  }
}

TEST(RaggedFieldValidationTest, StoresInt32WithoutOrBeyondAUint16Vocabulary) {
  for (int vocab : {0, 65537, 151936}) {
    absl::StatusOr<StoredSample> r = ValidateSample(MaskedSample(v1::UINT16), Model(vocab));
    ASSERT_TRUE(r.ok()) << r.status();
    const StoredRagged& f = r->ragged_fields.at("sampling_mask");
    EXPECT_EQ(f.dtype, v1::INT32) << vocab;
    EXPECT_EQ(Values<int32_t>(f), (std::vector<int32_t>{5, 9, 0, 7, 8, 2}));
  }
  // The boundary: 65536 ids fit uint16.
  absl::StatusOr<StoredSample> r = ValidateSample(MaskedSample(), Model(65536));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ragged_fields.at("sampling_mask").dtype, v1::UINT16);
}

TEST(RaggedFieldValidationTest, IngestsMovingVariantAgrees) {
  for (v1::DType values : {v1::INT32, v1::UINT16}) {
    for (int vocab : {0, 1000}) {
      const v1::Sample sample = MaskedSample(values);
      absl::StatusOr<StoredSample> copied = ValidateSample(sample, Model(vocab));
      v1::Sample owned = sample;
      absl::StatusOr<StoredSample> taken = ValidateAndTakeSample(&owned, Model(vocab));
      ASSERT_TRUE(copied.ok() && taken.ok()) << copied.status() << taken.status();
      EXPECT_EQ(*copied, *taken);
    }
  }
}

TEST(RaggedFieldValidationTest, EveryTokenMayHaveAnEmptyList) {
  v1::Sample s = MaskedSample();
  *Mask(s).mutable_values() = TestArray(v1::INT32, std::vector<int32_t>{});
  *Mask(s).mutable_offsets() = TestArray(v1::INT64, std::vector<int64_t>{0, 0, 0, 0, 0});
  absl::StatusOr<StoredSample> r = ValidateSample(s, Model(1000));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ragged_fields.at("sampling_mask").values.empty());
  EXPECT_EQ(r->ragged_fields.at("sampling_mask").offsets.size(), 5u);
}

TEST(RaggedFieldValidationTest, APieceCarriesTheListsOfItsNewTokens) {
  v1::Sample s = MaskedSample();
  s.set_piece(1);
  s.set_partial(true);
  absl::StatusOr<StoredSample> r = ValidateSample(s, Model(1000));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ragged_fields.at("sampling_mask").num_tokens(), 4);
  // A later piece without tokens (it only seals) needs no lists.
  v1::Sample seal;
  seal.set_sample_id("s1");
  seal.set_piece(2);
  (*seal.mutable_ragged_token_fields())["sampling_mask"];
  r = ValidateSample(seal, Model(1000));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ragged_fields.at("sampling_mask").offsets, (std::vector<int64_t>{0}));
  // With tokens, the offsets count them.
  s.mutable_tokens()->CopyFrom(TestArray(v1::INT32, std::vector<int32_t>{1, 2}));
  ExpectInvalid(s, {"ragged_token_fields[\"sampling_mask\"].offsets has 5 entries, must be n + 1 = 3"});
}

TEST(RaggedFieldValidationTest, RefusesBadNames) {
  v1::Sample s = MaskedSample();
  (*s.mutable_ragged_token_fields())[""] = Mask(s);
  ExpectInvalid(s, {"ragged_token_fields has an empty name"});

  s = MaskedSample();
  (*s.mutable_ragged_token_fields())[std::string(200, 'x')] = Mask(s);
  ExpectInvalid(s, {"ragged token field name"});

  s = MaskedSample();
  (*s.mutable_token_fields())["sampling_mask"] =
      TestArray(v1::UINT8, std::vector<uint8_t>{1, 1, 1, 1});
  ExpectInvalid(s, {"ragged_token_fields[\"sampling_mask\"] is also in token_fields"});

  DeclaredTokenField declared;
  declared.name = "sampling_mask";
  declared.dtype = v1::UINT8;
  ExpectInvalid(MaskedSample(), {"ragged_token_fields[\"sampling_mask\"] is a dense token field of the pool"},
                Model(1000), {declared});
}

TEST(RaggedFieldValidationTest, RefusesBadDtypesAndRanks) {
  v1::Sample s = MaskedSample(v1::FLOAT32);
  ExpectInvalid(s, {"ragged_token_fields[\"sampling_mask\"].values has dtype float32, must be int32, int64 or uint16"});

  s = MaskedSample();
  *Mask(s).mutable_values() = TestArray(v1::INT32, {3, 2}, std::vector<int32_t>{5, 9, 0, 7, 8, 2});
  ExpectInvalid(s, {".values has rank 2, must be 1"});

  s = MaskedSample(v1::INT32, v1::UINT16);
  *Mask(s).mutable_offsets() = TestArray(v1::UINT16, std::vector<uint16_t>{0, 2, 2, 3, 6});
  ExpectInvalid(s, {".offsets has dtype uint16, must be int32 or int64"});

  s = MaskedSample();
  *Mask(s).mutable_offsets() = TestArray(v1::INT32, {5, 1}, std::vector<int32_t>{0, 2, 2, 3, 6});
  ExpectInvalid(s, {".offsets has rank 2, must be 1"});

  s = MaskedSample();
  Mask(s).clear_offsets();
  ExpectInvalid(s, {".offsets is missing (n + 1 = 5 entries"});

  s = MaskedSample();
  Mask(s).mutable_values()->mutable_data()->resize(3);
  ExpectInvalid(s, {"ragged_token_fields[\"sampling_mask\"].values"});
}

TEST(RaggedFieldValidationTest, RefusesOffsetsThatAreNotOneListPerToken) {
  v1::Sample s = MaskedSample();
  *Mask(s).mutable_offsets() = TestArray(v1::INT32, std::vector<int32_t>{0, 2, 3, 6});
  ExpectInvalid(s, {".offsets has 4 entries, must be n + 1 = 5 (one list per token)"});

  s = MaskedSample();
  *Mask(s).mutable_offsets() = TestArray(v1::INT32, std::vector<int32_t>{1, 2, 2, 3, 6});
  ExpectInvalid(s, {".offsets[0] is 1, must be 0"});

  s = MaskedSample();
  *Mask(s).mutable_offsets() = TestArray(v1::INT32, std::vector<int32_t>{0, 2, 1, 3, 6});
  ExpectInvalid(s, {".offsets decreases at token 1: offsets[2] = 1 < offsets[1] = 2"});

  s = MaskedSample();
  *Mask(s).mutable_offsets() = TestArray(v1::INT32, std::vector<int32_t>{0, 2, 2, 3, 5});
  ExpectInvalid(s, {".offsets ends at 5, must end at len(values) = 6"});
}

TEST(RaggedFieldValidationTest, RefusesIdsOutsideTheVocabulary) {
  v1::Sample s = MaskedSample();
  int32_t bad = -1;
  std::memcpy(Mask(s).mutable_values()->mutable_data()->data() + 4 * 3, &bad, 4);
  ExpectInvalid(s, {"ragged_token_fields[\"sampling_mask\"] has id -1 at token 3 (element 3), "
                    "must be in [0, 1000) (ModelSpec.vocab_size)"});
  // Negative ids are refused without a vocabulary too.
  ExpectInvalid(s, {"has id -1 at token 3 (element 3), must be in [0, 2147483648)"}, Model(0));

  s = MaskedSample();
  bad = 1000;
  std::memcpy(Mask(s).mutable_values()->mutable_data()->data() + 4 * 1, &bad, 4);
  ExpectInvalid(s, {"has id 1000 at token 0 (element 1), must be in [0, 1000)"});
  EXPECT_TRUE(ValidateSample(s, Model(1001)).ok());

  s = MaskedSample(v1::INT64);
  const int64_t huge = int64_t{1} << 40;
  std::memcpy(Mask(s).mutable_values()->mutable_data()->data() + 8 * 5, &huge, 8);
  ExpectInvalid(s, {"has id 1099511627776 at token 3 (element 5)", "declares no vocab_size"},
                Model(0));
}

TEST(RaggedFieldValidationTest, RefusesAnIdTwiceInOneTokensSamplingMaskOnly) {
  // Token 3's list {7, 8, 2} arrives unsorted: still distinct.
  ASSERT_TRUE(ValidateSample(MaskedSample(), Model(1000)).ok());
  for (v1::DType dtype : {v1::INT32, v1::UINT16}) {
    v1::Sample s = MaskedSample(dtype);
    // Token 0's sorted list {5, 9} becomes {5, 5}.
    const size_t item = dtype == v1::UINT16 ? 2 : 4;
    std::memcpy(Mask(s).mutable_values()->mutable_data()->data() + item,
                Mask(s).mutable_values()->data().data(), item);
    ExpectInvalid(s, {"sample \"s1\": ragged_token_fields[\"sampling_mask\"] repeats id 5 in the "
                      "list of token 0: a sampling mask holds each kept id once"});
    // Token 3's unsorted list {7, 8, 2} becomes {7, 8, 7}.
    s = MaskedSample(dtype);
    std::memcpy(Mask(s).mutable_values()->mutable_data()->data() + 5 * item,
                Mask(s).mutable_values()->data().data() + 3 * item, item);
    ExpectInvalid(s, {"repeats id 7 in the list of token 3"});
  }
  // Another ragged field may repeat a value in a list.
  v1::Sample other = MaskedSample();
  v1::RaggedArray top = Mask(other);
  std::memcpy(top.mutable_values()->mutable_data()->data() + 4, top.values().data().data(), 4);
  other.mutable_ragged_token_fields()->erase("sampling_mask");
  (*other.mutable_ragged_token_fields())["top_ids"] = top;
  absl::StatusOr<StoredSample> repeated = ValidateSample(other, Model(1000));
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  EXPECT_EQ(Values<uint16_t>(repeated->ragged_fields.at("top_ids"))[1], 5);  // V = 1000: uint16
}

TEST(RaggedFieldValidationTest, WideningIsChargedToTheMessagesGrowthBudget) {
  // uint16 ids kept as int32 (V = 0) and int32 offsets kept as int64: 12 +
  // 20 bytes more than the 12 + 20 sent.
  int64_t budget = 31;
  absl::StatusOr<StoredSample> r = ValidateSample(MaskedSample(v1::UINT16), Model(0), {}, &budget);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("32 more than sent"));
  budget = 32;
  r = ValidateSample(MaskedSample(v1::UINT16), Model(0), {}, &budget);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(budget, 0);
}

}  // namespace
}  // namespace rollpack
