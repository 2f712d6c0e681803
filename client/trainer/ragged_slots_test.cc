// Ragged token fields (layout.md section 13) in a batch's layout: two slots
// per field after every other array, uint16 values widened to int32 as they
// are copied (from either message form, however gRPC sliced it), and a
// micro-batch whose offsets or sizes lie refused before anything is copied.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "client/cpp/ragged_field.h"
#include "client/trainer/batch_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/ndarrays.h"

namespace rollpack::trainer_internal {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

v1::RaggedArray Ragged(v1::DType dtype, const std::vector<int64_t>& offsets,
                       const std::vector<int32_t>& ids) {
  v1::RaggedArray a;
  if (dtype == v1::UINT16) {
    std::vector<uint16_t> narrow(ids.begin(), ids.end());
    *a.mutable_values() = TestArray<uint16_t>(v1::UINT16, narrow);
  } else {
    *a.mutable_values() = TestArray<int32_t>(v1::INT32, ids);
  }
  *a.mutable_offsets() = TestArray<int64_t>(v1::INT64, offsets);
  return a;
}

// Four token rows; "sampling_mask" with ids that need all 16 bits (a
// padding row's list empty), "kept" int32.
v1::Microbatch WithRagged() {
  v1::Microbatch m;
  m.set_step_id("s");
  m.set_index(5);
  m.add_sample_ids("a");
  *m.mutable_cu_seqlens() = TestArray<int32_t>(v1::INT32, {0, 3});
  *m.mutable_cu_seqlens_padded() = TestArray<int32_t>(v1::INT32, {0, 4});
  *m.mutable_tokens() = TestArray<int32_t>(v1::INT32, {1, 2, 3, 0});
  (*m.mutable_token_fields())["logprobs"] = TestArray<float>(v1::FLOAT32, {.1f, .2f, .3f, 0});
  (*m.mutable_ragged_token_fields())["sampling_mask"] =
      Ragged(v1::UINT16, {0, 2, 3, 6, 6}, {7, 65535, 40000, 0, 1, 32768});
  (*m.mutable_ragged_token_fields())["kept"] = Ragged(v1::INT32, {0, 1, 1, 1, 1}, {123456});
  return m;
}

ReceivedMicrobatch Received(const v1::Microbatch& m, std::mt19937& rng) {
  const std::string bytes = m.SerializeAsString();
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  while (at < bytes.size()) {  // odd cuts too: a uint16 may straddle two slices
    const size_t n = std::min(bytes.size() - at, size_t{1} + rng() % 7);
    slices.emplace_back(bytes.data() + at, n);
    at += n;
  }
  absl::StatusOr<ReceivedMicrobatch> r =
      ReceivedMicrobatch::Parse(grpc::ByteBuffer(slices.data(), slices.size()));
  EXPECT_TRUE(r.ok()) << r.status();
  return *std::move(r);
}

template <typename T>
std::vector<T> Copied(const v1::Microbatch& m, const Slot& s) {
  std::vector<T> out(static_cast<size_t>(s.bytes) / sizeof(T));
  CopySlot(m, s, out.data());
  return out;
}
template <typename T>
std::vector<T> Copied(const ReceivedMicrobatch& m, const Slot& s) {
  std::vector<T> out(static_cast<size_t>(s.bytes) / sizeof(T));
  CopySlot(m, s, out.data());
  return out;
}

TEST(RaggedSlotsTest, TwoSlotsPerFieldLastValuesAsInt32) {
  const v1::Microbatch m = WithRagged();
  absl::StatusOr<Layout> l = ComputeLayout(m, false);
  ASSERT_TRUE(l.ok()) << l.status();
  std::vector<std::string> names;
  for (const Slot& s : l->slots) names.push_back(s.name);
  EXPECT_THAT(names,
              testing::ElementsAre("tokens", "cu_seqlens", "cu_seqlens_padded", "replay_mask",
                                   "replay_experts", "field:logprobs", "advantages",
                                   "ragged_values:kept", "ragged_offsets:kept",
                                   "ragged_values:sampling_mask", "ragged_offsets:sampling_mask"));
  const Slot* values = FindSlot(*l, "ragged_values:sampling_mask");
  EXPECT_EQ(values->ref.dtype, v1::INT32);
  EXPECT_EQ(values->ref.shape, (std::vector<int64_t>{6}));
  EXPECT_EQ(values->bytes, 24);
  EXPECT_EQ(values->wire_bytes, 12);
  EXPECT_TRUE(values->widen_uint16);
  EXPECT_EQ(values->offset % kAlign, 0);
  const Slot* offsets = FindSlot(*l, "ragged_offsets:sampling_mask");
  EXPECT_EQ(offsets->ref.dtype, v1::INT64);
  EXPECT_EQ(offsets->ref.shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(offsets->bytes, 40);
  EXPECT_FALSE(FindSlot(*l, "ragged_values:kept")->widen_uint16);
  EXPECT_TRUE(SameOnEveryTpRank("ragged_values:kept"));
  EXPECT_TRUE(SameOnEveryTpRank("ragged_offsets:kept"));
  EXPECT_FALSE(SameOnEveryTpRank("replay_experts"));
  EXPECT_FALSE(KeptInMeta("ragged_offsets:kept"));

  BatchState b;
  std::vector<char> buffer(static_cast<size_t>(l->total));
  AssignViews(*l, buffer.data(), buffer.data() + l->ids_offset, false, &b);
  ASSERT_EQ(b.ragged_token_fields.size(), 2u);
  const RaggedArrayRef& mask = b.ragged_token_fields.at("sampling_mask");
  EXPECT_EQ(mask.values.data, buffer.data() + values->offset);
  EXPECT_EQ(mask.values.dtype, v1::INT32);
  EXPECT_EQ(mask.offsets.data, buffer.data() + offsets->offset);
  EXPECT_EQ(mask.offsets.shape, (std::vector<int64_t>{5}));

  v1::Microbatch cleared = m;
  ClearData(&cleared);
  for (const auto& [name, a] : cleared.ragged_token_fields()) {
    EXPECT_TRUE(a.values().data().empty() && a.offsets().data().empty()) << name;
    EXPECT_EQ(a.values().dtype(), m.ragged_token_fields().at(name).values().dtype());
  }
}

TEST(RaggedSlotsTest, CopySlotWidensUint16FromEitherForm) {
  std::mt19937 rng(8);
  const v1::Microbatch m = WithRagged();
  absl::StatusOr<Layout> l = ComputeLayout(m, false);
  ASSERT_TRUE(l.ok()) << l.status();
  const std::vector<int32_t> want{7, 65535, 40000, 0, 1, 32768};
  for (int trial = 0; trial < 50; ++trial) {
    const ReceivedMicrobatch r = Received(m, rng);
    ASSERT_TRUE(CheckBytes(r, *l).ok()) << CheckBytes(r, *l);
    const Slot& values = *FindSlot(*l, "ragged_values:sampling_mask");
    EXPECT_EQ(Copied<int32_t>(r, values), want);
    EXPECT_EQ(Copied<int32_t>(r, *FindSlot(*l, "ragged_values:kept")),
              std::vector<int32_t>{123456});
    EXPECT_EQ(Copied<int64_t>(r, *FindSlot(*l, "ragged_offsets:sampling_mask")),
              (std::vector<int64_t>{0, 2, 3, 6, 6}));
  }
  ASSERT_TRUE(CheckBytes(m, *l).ok());
  EXPECT_EQ(Copied<int32_t>(m, *FindSlot(*l, "ragged_values:sampling_mask")), want);
  EXPECT_EQ(Copied<int64_t>(m, *FindSlot(*l, "ragged_offsets:kept")),
            (std::vector<int64_t>{0, 1, 1, 1, 1}));
}

// `forge` applied to the field "sampling_mask"; refused by ComputeLayout or
// CheckBytes, with DATA_LOSS naming `parts`, in both message forms.
void ExpectRefused(const std::function<void(v1::Microbatch*)>& forge,
                   const std::vector<std::string>& parts) {
  std::mt19937 rng(9);
  v1::Microbatch m = WithRagged();
  forge(&m);
  absl::Status status;
  absl::StatusOr<Layout> l = ComputeLayout(m, false);
  for (int form = 0; form < 2; ++form) {
    if (!l.ok()) {
      status = l.status();
    } else {
      status = form == 0 ? CheckBytes(m, *l) : CheckBytes(Received(m, rng), *l);
    }
    ASSERT_FALSE(status.ok()) << ::testing::PrintToString(parts);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    for (const std::string& part : parts) {
      EXPECT_THAT(std::string(status.message()), HasSubstr(part)) << "form " << form;
    }
  }
}

void SetOffsets(v1::Microbatch* m, const std::vector<int64_t>& offsets) {
  *(*m->mutable_ragged_token_fields())["sampling_mask"].mutable_offsets() =
      TestArray<int64_t>(v1::INT64, offsets);
}

TEST(RaggedSlotsTest, ForgedFieldsAreRefusedBeforeAnyCopy) {
  const std::string field = "micro-batch 5: ragged_token_fields[\"sampling_mask\"]";
  ExpectRefused(
      [](v1::Microbatch* m) {
        SetOffsets(m, {0, 4, 3, 6, 6});
      },
      {field, "offsets[2] is 3, below offsets[1]"});
  ExpectRefused(
      [](v1::Microbatch* m) {
        SetOffsets(m, {1, 2, 3, 6, 6});
      },
      {field, "offsets[0] is 1, not 0"});
  ExpectRefused(
      [](v1::Microbatch* m) {
        SetOffsets(m, {0, 2, 3, 4, 5});
      },
      {field, "offsets[4] is 5, but values holds 6"});
  ExpectRefused(
      [](v1::Microbatch* m) {
        SetOffsets(m, {0, 2, 9, 6, 6});
      },
      {field, "offsets[2] is 9, past the 6 values"});
  // Rows that are not the micro-batch's.
  ExpectRefused(
      [](v1::Microbatch* m) {
        SetOffsets(m, {0, 2, 3, 6});
      },
      {field, "has 3 rows, tokens has 4"});
  ExpectRefused(
      [](v1::Microbatch* m) {
        m->clear_tokens();  // a later pipeline stage: the token fields' rows
        SetOffsets(m, {0, 2, 3, 6, 6, 6});
      },
      {field, "has 5 rows, token_fields[\"logprobs\"] has 4"});
  ExpectRefused(
      [](v1::Microbatch* m) {
        (*m->mutable_ragged_token_fields())["sampling_mask"]
            .mutable_values()
            ->mutable_data()
            ->append("xy");
      },
      {"micro-batch 5", "ragged_values:sampling_mask holds 14 bytes, its shape needs 12"});
  ExpectRefused(
      [](v1::Microbatch* m) {
        (*m->mutable_ragged_token_fields())["sampling_mask"]
            .mutable_offsets()
            ->mutable_data()
            ->resize(12);
      },
      {"micro-batch 5", "ragged_offsets:sampling_mask holds 12 bytes, its shape needs 40"});
  ExpectRefused(
      [](v1::Microbatch* m) {
        (*m->mutable_ragged_token_fields())["sampling_mask"].mutable_values()->set_dtype(
            v1::FLOAT32);
      },
      {field, "values is FLOAT32 [6]", "UINT16 or INT32"});
  ExpectRefused(
      [](v1::Microbatch* m) {
        (*m->mutable_ragged_token_fields())["sampling_mask"].mutable_offsets()->set_dtype(
            v1::INT32);
      },
      {field, "offsets is INT32 [5]"});
}

}  // namespace
}  // namespace rollpack::trainer_internal
