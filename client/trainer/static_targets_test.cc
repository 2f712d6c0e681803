// Static replay buffers (static_targets.h) on host batches: the eager write
// and the staged pair give the same buffer, the micro-batch's rows equal its
// received ids, rows past it hold the filler, a smaller micro-batch after a
// larger one leaves no stale id, and shape mismatches are refused naming
// both numbers. The CUDA versions are compared with these in the GPU tests
// (kernels/unpack_static_gpu_test.cu, client/python/tests/gpu_static_targets.py).
#include "client/trainer/static_targets.h"

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/trainer/batch_state.h"
#include "client/trainer/device_batch.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

constexpr int kLayers = 3, kK = 4, kE = 16, kMaxRows = 40;

// A host batch viewing `ids` [rows, kLayers, kK] uint8 and `mask`.
std::unique_ptr<DeviceBatch> HostBatch(int index, std::vector<uint8_t>* ids,
                                       std::vector<uint8_t>* mask, int64_t layers = kLayers) {
  auto s = std::make_unique<trainer_internal::BatchState>();
  s->meta.set_index(index);
  const int64_t rows = static_cast<int64_t>(mask->size());
  s->replay_experts.data = ids->data();
  s->replay_experts.dtype = v1::UINT8;
  s->replay_experts.shape = {rows, layers, kK};
  s->replay_mask.data = mask->data();
  s->replay_mask.dtype = v1::UINT8;
  s->replay_mask.shape = {rows};
  return std::make_unique<DeviceBatch>(std::move(s));
}

void RandomBatch(std::mt19937* rng, int64_t rows, std::vector<uint8_t>* ids,
                 std::vector<uint8_t>* mask) {
  ids->resize(rows * kLayers * kK);
  mask->resize(rows);
  for (auto& v : *ids) v = uint8_t((*rng)() % kE);
  for (auto& m : *mask) m = uint8_t((*rng)() % 3 != 0);
}

// What the buffer must hold after writing a batch of `rows` rows.
void ExpectTargets(const std::vector<int64_t>& buf, const std::vector<uint8_t>& ids,
                   const std::vector<uint8_t>& mask, bool minus_one) {
  const int64_t rows = static_cast<int64_t>(mask.size());
  for (int64_t r = 0; r < kMaxRows; ++r) {
    for (int l = 0; l < kLayers; ++l) {
      for (int j = 0; j < kK; ++j) {
        const int64_t i = (r * kLayers + l) * kK + j;
        int64_t want;
        if (r >= rows) want = (r * kK + j) % kE;
        else if (minus_one && mask[r] == 0) want = -1;
        else want = ids[i];
        ASSERT_EQ(buf[i], want) << "row " << r << " layer " << l << " j " << j << " of " << rows;
      }
    }
  }
}

TEST(StaticTargets, EagerAndStagedWriteTheSameBuffer) {
  std::mt19937 rng(5);
  std::vector<int64_t> eager(kMaxRows * kLayers * kK, 77), staged(eager.size(), 77);
  std::vector<uint8_t> st_ids(kMaxRows * kLayers * kK), st_mask(kMaxRows);
  int64_t st_rows = -1;
  StaticStaging staging{st_ids.data(), false, st_mask.data(), &st_rows, kMaxRows, kLayers, kK};
  StaticTargets out{eager.data(), false, kMaxRows, kLayers, kK};
  StaticTargets out2{staged.data(), false, kMaxRows, kLayers, kK};
  // Large, small, empty, full: each must leave no row of the one before.
  for (bool minus_one : {false, true}) {
    StaticTargetsOptions o{kE, minus_one};
    int index = 0;
    for (int64_t rows : {int64_t{31}, int64_t{7}, int64_t{0}, int64_t{kMaxRows}}) {
      std::vector<uint8_t> ids, mask;
      RandomBatch(&rng, rows, &ids, &mask);
      auto b = HostBatch(index++, &ids, &mask);
      ASSERT_TRUE(WriteReplayTargets(*b, out, o, nullptr).ok());
      ExpectTargets(eager, ids, mask, minus_one);
      ASSERT_TRUE(StageReplayTargets(*b, staging, nullptr).ok());
      EXPECT_EQ(st_rows, rows);
      ASSERT_TRUE(WriteStagedReplayTargets(staging, out2, o, -1, nullptr).ok());
      EXPECT_EQ(staged, eager);
    }
  }
}

TEST(StaticTargets, SliceOfALargerBuffer) {
  // [kMaxRows, kLayers + 2, kK] with the targets in layers 1..kLayers: the
  // other layers stay untouched.
  std::mt19937 rng(6);
  std::vector<uint8_t> ids, mask;
  RandomBatch(&rng, 20, &ids, &mask);
  auto b = HostBatch(0, &ids, &mask);
  const int64_t wide = kLayers + 2;
  std::vector<int32_t> big(kMaxRows * wide * kK, -5);
  StaticTargets out{big.data() + kK, true, kMaxRows, kLayers, kK, wide * kK, kK};
  ASSERT_TRUE(WriteReplayTargets(*b, out, {kE, false}, nullptr).ok());
  for (int64_t r = 0; r < kMaxRows; ++r) {
    for (int64_t l = 0; l < wide; ++l) {
      for (int j = 0; j < kK; ++j) {
        const int32_t v = big[(r * wide + l) * kK + j];
        if (l == 0 || l == wide - 1) {
          ASSERT_EQ(v, -5);
        } else if (r < 20) {
          ASSERT_EQ(v, ids[(r * kLayers + l - 1) * kK + j]);
        } else {
          ASSERT_EQ(v, (r * kK + j) % kE);
        }
      }
    }
  }
}

TEST(StaticTargets, Refusals) {
  std::mt19937 rng(7);
  std::vector<uint8_t> ids, mask;
  RandomBatch(&rng, kMaxRows + 1, &ids, &mask);
  auto big = HostBatch(9, &ids, &mask);
  std::vector<int64_t> buf(kMaxRows * kLayers * kK);
  StaticTargets out{buf.data(), false, kMaxRows, kLayers, kK};
  absl::Status s = WriteReplayTargets(*big, out, {kE, false}, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "micro-batch 9 has 41 router rows but the static buffer holds "
                         "max_rows = 40");
  std::vector<uint8_t> st_ids(kMaxRows * kLayers * kK), st_mask(kMaxRows);
  int64_t st_rows = 3;
  StaticStaging staging{st_ids.data(), false, st_mask.data(), &st_rows, kMaxRows, kLayers, kK};
  EXPECT_EQ(StageReplayTargets(*big, staging, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st_rows, 3);  // nothing staged

  std::vector<uint8_t> ids2(10 * (kLayers + 1) * kK), mask2(10);
  auto other = HostBatch(2, &ids2, &mask2, kLayers + 1);
  s = WriteReplayTargets(*other, out, {kE, false}, nullptr);
  EXPECT_EQ(s.message(), "micro-batch 2 has 4 replay layers but the static buffer has 3");
  StaticTargets wrong_k = out;
  wrong_k.k = kK + 1;
  std::vector<uint8_t> ids3(10 * kLayers * kK), mask3(10);
  auto ok_batch = HostBatch(1, &ids3, &mask3);
  EXPECT_EQ(WriteReplayTargets(*ok_batch, wrong_k, {kE, false}, nullptr).message(),
            "micro-batch 1 has K = 4 but the static buffer has K = 5");
  // E below K: the kernel's own check, naming the value.
  s = WriteReplayTargets(*ok_batch, out, {2, false}, nullptr);
  EXPECT_NE(s.message().find("num_experts"), std::string::npos) << s;
  StaticStaging u16 = staging;
  u16.uint16 = true;
  EXPECT_EQ(StageReplayTargets(*ok_batch, u16, nullptr).message(),
            "micro-batch 1 holds uint8 ids but the staging buffer is uint16");

  auto dense = std::make_unique<trainer_internal::BatchState>();
  DeviceBatch no_replay(std::move(dense));
  EXPECT_EQ(WriteReplayTargets(no_replay, out, {kE, false}, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace rollpack
