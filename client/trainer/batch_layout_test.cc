// The per-sequence arrays (advantages, scalars; lifecycle.md section 6) in a
// batch's layout: slots after every array there was before them, bytes read
// from the metadata whichever form the message came in, views assigned, and
// a micro-batch whose fields do not fit its sequences refused before any
// slot is computed.
#include "client/trainer/batch_layout.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/ndarrays.h"

namespace rollpack::trainer_internal {
namespace {

using ::testing::HasSubstr;

v1::Microbatch TwoSequences() {
  v1::Microbatch m;
  m.set_step_id("s");
  m.set_index(2);
  m.add_sample_ids("a");
  m.add_sample_ids("b");
  m.add_group_ids("g");
  m.add_group_ids("g");
  m.add_policy_versions(1);
  m.add_policy_versions(1);
  *m.mutable_cu_seqlens() = TestArray<int32_t>(v1::INT32, {0, 3, 5});
  *m.mutable_cu_seqlens_padded() = TestArray<int32_t>(v1::INT32, {0, 4, 8});
  *m.mutable_tokens() = TestArray<int32_t>(v1::INT32, {1, 2, 3, 4, 5, 6, 7, 8});
  (*m.mutable_token_fields())["logprobs"] = TestArray<float>(v1::FLOAT32, std::vector<float>(8, .5f));
  (*m.mutable_scalars())["reward"] = TestArray<double>(v1::FLOAT64, {1.0, 0.0});
  (*m.mutable_scalars())["acc"] = TestArray<double>(v1::FLOAT64, {0.5, 0.25});
  *m.mutable_advantages() = TestArray<float>(v1::FLOAT32, {1.0f, -1.0f});
  return m;
}

std::vector<std::string> Names(const Layout& l) {
  std::vector<std::string> out;
  for (const Slot& s : l.slots) out.push_back(s.name);
  return out;
}

TEST(BatchLayoutTest, PerSequenceSlotsComeLast) {
  v1::Microbatch m = TwoSequences();
  absl::StatusOr<Layout> l = ComputeLayout(m, false);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(Names(*l), (std::vector<std::string>{"tokens", "cu_seqlens", "cu_seqlens_padded",
                                                 "replay_mask", "replay_experts",
                                                 "field:logprobs", "advantages", "scalar:acc",
                                                 "scalar:reward"}));
  EXPECT_EQ(FindSlot(*l, "advantages")->bytes, 8);
  EXPECT_EQ(FindSlot(*l, "scalar:reward")->bytes, 16);
  EXPECT_EQ(FindSlot(*l, "scalar:reward")->offset % kAlign, 0);
  EXPECT_TRUE(CheckBytes(m, *l).ok());
  EXPECT_TRUE(CheckMetaBytes(m, *l).ok());
  for (const char* n : {"cu_seqlens", "cu_seqlens_padded", "advantages", "scalar:acc"}) {
    EXPECT_TRUE(KeptInMeta(n)) << n;
  }
  for (const char* n : {"tokens", "replay_experts", "replay_mask", "field:logprobs"}) {
    EXPECT_FALSE(KeptInMeta(n)) << n;
  }
  EXPECT_TRUE(IsSequenceSlot("advantages"));
  EXPECT_FALSE(IsSequenceSlot("cu_seqlens"));

  // Without an estimator: the slot is there, empty and absent.
  m.clear_advantages();
  l = ComputeLayout(m, false);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(FindSlot(*l, "advantages")->bytes, 0);
  BatchState b;
  AssignViews(*l, nullptr, nullptr, false, &b);
  EXPECT_EQ(b.advantages.dtype, v1::DTYPE_UNSPECIFIED);
}

TEST(BatchLayoutTest, ViewsAndBytesOfBothMessageForms) {
  const v1::Microbatch m = TwoSequences();
  absl::StatusOr<Layout> l = ComputeLayout(m, false);
  ASSERT_TRUE(l.ok()) << l.status();
  std::vector<char> buffer(static_cast<size_t>(l->total));
  BatchState b;
  AssignViews(*l, buffer.data(), buffer.data() + l->ids_offset, false, &b);
  EXPECT_EQ(b.advantages.dtype, v1::FLOAT32);
  EXPECT_EQ(b.advantages.shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(b.advantages.data, buffer.data() + FindSlot(*l, "advantages")->offset);
  ASSERT_EQ(b.scalars.size(), 2u);
  EXPECT_EQ(b.scalars.at("reward").dtype, v1::FLOAT64);
  EXPECT_EQ(b.scalars.at("reward").nbytes(), 16);

  // A ReceivedMicrobatch holds these bytes in meta(): checked and copied
  // from there, as a v1::Microbatch's from its fields.
  const std::string bytes = m.SerializeAsString();
  grpc::Slice slice(bytes.data(), bytes.size());
  absl::StatusOr<ReceivedMicrobatch> r = ReceivedMicrobatch::Parse(grpc::ByteBuffer(&slice, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(CheckBytes(*r, *l).ok());
  for (const char* name : {"advantages", "scalar:reward", "scalar:acc"}) {
    const Slot* s = FindSlot(*l, name);
    std::string from_message(static_cast<size_t>(s->bytes), '\0');
    std::string from_received(static_cast<size_t>(s->bytes), '\0');
    CopyData(m, name, from_message.data());
    CopyData(*r, name, from_received.data());
    EXPECT_EQ(from_message, from_received) << name;
  }
  double reward[2];
  CopyData(*r, "scalar:reward", reward);
  EXPECT_EQ(reward[0], 1.0);
  EXPECT_EQ(reward[1], 0.0);
}

TEST(BatchLayoutTest, MetadataThatDoesNotFitIsRefusedFirst) {
  v1::Microbatch m = TwoSequences();
  (*m.mutable_scalars())["reward"] = TestArray<double>(v1::FLOAT64, {1.0, 0.0, 2.0});
  absl::StatusOr<Layout> l = ComputeLayout(m, false);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(l.status().message()), HasSubstr("scalars[\"reward\"] is FLOAT64 [3]"));

  // A TP header whose per-sequence bytes were cut is named.
  m = TwoSequences();
  l = ComputeLayout(m, false);
  ASSERT_TRUE(l.ok());
  m.mutable_advantages()->mutable_data()->resize(4);
  absl::Status s = CheckMetaBytes(m, *l);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("advantages holds 4 bytes, its shape needs 8"));
}

}  // namespace
}  // namespace rollpack::trainer_internal
