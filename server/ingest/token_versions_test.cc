// Per-token policy versions (lifecycle.md section 3): a sample's version is
// its oldest generated token's, through validation and the store's
// staleness rules.
#include "server/ingest/token_versions.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ingest/sample_validation.h"
#include "server/store/sample_store.h"
#include "testing/ndarrays.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

ModelSpec DenseModel() {
  ModelSpec m;
  m.name = "dense";
  m.num_layers = 2;
  return m;
}

v1::Sample WithVersions(const std::string& id, int64_t policy_version,
                        const std::vector<int64_t>& token_versions) {
  v1::Sample s;
  s.set_sample_id(id);
  s.set_policy_version(policy_version);
  const int64_t n = static_cast<int64_t>(token_versions.size());
  std::vector<int32_t> tokens(n, 7);
  *s.mutable_tokens() = TestArray(v1::INT32, {n}, tokens);
  (*s.mutable_token_fields())["token_version"] = TestArray(v1::INT64, {n}, token_versions);
  return s;
}

TEST(TokenVersionsTest, TheLowestGeneratedTokenVersionIsTheSamplesVersion) {
  // Prompt tokens (-1) have none; generation spanned versions 4 to 6.
  absl::StatusOr<StoredSample> s = ValidateSample(WithVersions("a", 6, {-1, -1, 5, 4, 6}), DenseModel());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->policy_version, 4);
  // A producer that only fills per-token versions (policy_version left 0).
  s = ValidateSample(WithVersions("b", 0, {-1, 9, 9}), DenseModel());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->policy_version, 9);
  // No generated token: the sample's own version stands.
  s = ValidateSample(WithVersions("c", 3, {-1, -1}), DenseModel());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->policy_version, 3);
}

TEST(TokenVersionsTest, NarrowIntegerDtypesAreReadAndOthersRefusedByName) {
  v1::Sample narrow = WithVersions("n", 8, {0, 0, 0});
  (*narrow.mutable_token_fields())["token_version"] =
      TestArray(v1::INT16, {3}, std::vector<int16_t>{-1, 7, 2});
  absl::StatusOr<StoredSample> s = ValidateSample(narrow, DenseModel());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->policy_version, 2);

  v1::Sample floats = narrow;
  (*floats.mutable_token_fields())["token_version"] =
      TestArray(v1::FLOAT32, {3}, std::vector<float>{1, 2, 3});
  absl::Status refused = ValidateSample(floats, DenseModel()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("sample \"n\": token_fields[\"token_version\"] is FLOAT32 [n]"));

  v1::Sample wide = narrow;
  (*wide.mutable_token_fields())["token_version"] =
      TestArray(v1::INT64, {3, 2}, std::vector<int64_t>{1, 1, 2, 2, 3, 3});
  refused = ValidateSample(wide, DenseModel()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("is INT64 [n, 2]: per-token policy versions"));
}

TEST(TokenVersionsTest, StalenessSelectionJudgesTheOldestToken) {
  SampleStore store(int64_t{1} << 24);
  PoolOptions options;
  options.max_staleness = 1;
  ASSERT_TRUE(store.RegisterModel("p", DenseModel(), options).ok());
  // Both were put as version 5; "mixed" began its generation under 3.
  std::vector<StoredSample> samples;
  for (const v1::Sample& sent : {WithVersions("fresh", 5, {-1, 5, 5}),
                                 WithVersions("mixed", 5, {-1, 3, 5})}) {
    absl::StatusOr<StoredSample> s = ValidateSample(sent, DenseModel());
    ASSERT_TRUE(s.ok()) << s.status();
    samples.push_back(*std::move(s));
  }
  ASSERT_TRUE(store.Put("p", std::move(samples)).ok());
  ASSERT_TRUE(store.SetPolicyVersion("p", 5).ok());
  EXPECT_EQ(store.GetPool("p")->num_stale_samples, 1);
  SampleStore::SamplePageRequest page;
  absl::StatusOr<SampleStore::SamplePage> listed = store.ListSamplePage("p", page);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->samples.size(), 2u);
  EXPECT_EQ(listed->samples[1].sample_id(), "mixed");
  EXPECT_EQ(listed->samples[1].policy_version(), 3);
  EXPECT_EQ(listed->samples[1].state(), v1::SAMPLE_STATE_STALE);
}

}  // namespace
}  // namespace rollpack
