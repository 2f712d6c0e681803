// CheckSequenceMetadata / ReadSequenceMetadata: what a micro-batch says about
// its sequences is decoded as sent, and every field that does not fit the
// number of sequences is refused, named, before anything reads it.
#include "client/cpp/sequence_metadata.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/ndarrays.h"

namespace rollpack {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Three sequences: two of group "q", one ungrouped.
v1::Microbatch ThreeSequences() {
  v1::Microbatch m;
  m.set_step_id("s7");
  m.set_index(4);
  for (const char* id : {"a", "b", "c"}) m.add_sample_ids(id);
  for (const char* g : {"q", "q", ""}) m.add_group_ids(g);
  for (int64_t v : {5, 6, 5}) m.add_policy_versions(v);
  (*m.mutable_scalars())["reward"] = TestArray<double>(v1::FLOAT64, {1.0, 0.0, 0.25});
  (*m.mutable_scalars())["len"] = TestArray<double>(v1::FLOAT64, {10, 20, 30});
  *m.mutable_advantages() = TestArray<float>(v1::FLOAT32, {1.0f, -1.0f, 0.0f});
  return m;
}

TEST(SequenceMetadataTest, DecodesWhatWasSent) {
  absl::StatusOr<SequenceMetadata> s = ReadSequenceMetadata(ThreeSequences());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->sent);
  EXPECT_EQ(s->group_ids, (std::vector<std::string>{"q", "q", ""}));
  EXPECT_EQ(s->policy_versions, (std::vector<int64_t>{5, 6, 5}));
  EXPECT_EQ(s->scalars.at("reward"), (std::vector<double>{1.0, 0.0, 0.25}));
  EXPECT_EQ(s->scalars.at("len"), (std::vector<double>{10, 20, 30}));
  EXPECT_TRUE(s->has_advantages);
  EXPECT_EQ(s->advantages, (std::vector<float>{1.0f, -1.0f, 0.0f}));
}

TEST(SequenceMetadataTest, NoEstimatorNoScalarsAndOlderServers) {
  v1::Microbatch m = ThreeSequences();
  m.clear_advantages();
  m.clear_scalars();
  absl::StatusOr<SequenceMetadata> s = ReadSequenceMetadata(m);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->has_advantages);
  EXPECT_TRUE(s->scalars.empty());
  // A rollpackd from before lifecycle.md section 6 sends neither list.
  m.clear_group_ids();
  m.clear_policy_versions();
  s = ReadSequenceMetadata(m);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->sent);
  EXPECT_TRUE(s->group_ids.empty());
  // No sequences at all: nothing missing.
  m.clear_sample_ids();
  s = ReadSequenceMetadata(m);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->sent);
}

void ExpectRefused(const v1::Microbatch& m, const std::vector<std::string>& parts) {
  absl::Status s = CheckSequenceMetadata(m);
  ASSERT_FALSE(s.ok()) << "accepted, expected: " << ::testing::PrintToString(parts);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("micro-batch 4 of step \"s7\"")) << s;
  for (const std::string& part : parts) {
    EXPECT_THAT(std::string(s.message()), HasSubstr(part)) << s;
  }
  EXPECT_FALSE(ReadSequenceMetadata(m).ok());
}

TEST(SequenceMetadataTest, RefusesWhatDoesNotFitTheSequences) {
  v1::Microbatch m = ThreeSequences();
  m.add_group_ids("extra");
  ExpectRefused(m, {"3 sequences but 4 group_ids and 3 policy_versions"});

  m = ThreeSequences();
  m.clear_policy_versions();
  ExpectRefused(m, {"3 sequences but 3 group_ids and 0 policy_versions"});

  m = ThreeSequences();
  (*m.mutable_scalars())["reward"] = TestArray<float>(v1::FLOAT32, {1, 0, 0.25});
  ExpectRefused(m, {"scalars[\"reward\"] is FLOAT32 [3] (12 bytes), not FLOAT64 [3] (24 bytes)",
                    "one value per sequence"});

  m = ThreeSequences();
  (*m.mutable_scalars())["len"] = TestArray<double>(v1::FLOAT64, {10, 20});
  ExpectRefused(m, {"scalars[\"len\"] is FLOAT64 [2] (16 bytes), not FLOAT64 [3]"});

  m = ThreeSequences();
  (*m.mutable_scalars())["len"].mutable_data()->pop_back();  // shape right, bytes short
  ExpectRefused(m, {"scalars[\"len\"] is FLOAT64 [3] (23 bytes)"});

  m = ThreeSequences();
  (*m.mutable_scalars())["len"].add_shape(1);  // [3, 1]
  ExpectRefused(m, {"scalars[\"len\"] is FLOAT64 [3, 1]"});

  m = ThreeSequences();
  *m.mutable_advantages() = TestArray<double>(v1::FLOAT64, {1, -1, 0});
  ExpectRefused(m, {"advantages is FLOAT64 [3] (24 bytes), not FLOAT32 [3] (12 bytes)"});

  m = ThreeSequences();
  m.mutable_advantages()->clear_dtype();  // set but empty
  m.mutable_advantages()->clear_shape();
  m.mutable_advantages()->clear_data();
  ExpectRefused(m, {"advantages is DTYPE_UNSPECIFIED [] (0 bytes)"});
}

}  // namespace
}  // namespace rollpack
