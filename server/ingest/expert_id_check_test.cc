#include "server/ingest/expert_id_check.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace rollpack {
namespace {

// The rule, id by id.
template <typename Id>
bool Reference(const std::vector<Id>& ids, int k, int num_experts) {
  for (size_t g = 0; g < ids.size(); g += k) {
    for (int j = 0; j < k; ++j) {
      if (ids[g + j] >= num_experts) return false;
      for (int i = 0; i < j; ++i) {
        if (ids[g + i] == ids[g + j]) return false;
      }
    }
  }
  return true;
}

// Valid groups (distinct ids below E), then one defect at a random place:
// an id out of range, a repeat within a group, or none.
template <typename Id>
std::vector<Id> Groups(std::mt19937& rng, int64_t groups, int k, int num_experts, int defect) {
  std::vector<Id> ids;
  std::uniform_int_distribution<int> pick(0, num_experts - 1);
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<Id> group;
    while (static_cast<int>(group.size()) < k) {
      const Id id = static_cast<Id>(pick(rng));
      bool seen = false;
      for (Id other : group) seen = seen || other == id;
      if (!seen) group.push_back(id);
    }
    ids.insert(ids.end(), group.begin(), group.end());
  }
  if (!ids.empty() && defect != 0) {
    const size_t at = std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng);
    if (defect == 1) {
      ids[at] = static_cast<Id>(num_experts + (at % 3));
    } else if (k > 1) {
      const size_t group = at / k * k;
      ids[group + (at % k == 0 ? 1 : 0)] = ids[at];
    }
  }
  return ids;
}

TEST(ExpertIdCheckTest, Uint16AgreesWithTheRuleForEveryTopkAndDefect) {
  std::mt19937 rng(7);
  for (int num_experts : {257, 384, 1024, 32768, 65535}) {
    for (int k = 1; k <= 10; ++k) {
      for (int64_t groups : {0, 1, 3, 4, 5, 17, 64, 1001}) {
        for (int defect = 0; defect < 3; ++defect) {
          const std::vector<uint16_t> ids = Groups<uint16_t>(rng, groups, k, num_experts, defect);
          const bool want = Reference(ids, k, num_experts);
          EXPECT_EQ(Uint16ExpertIdsValid(ids.data(), groups, k, num_experts), want)
              << "E=" << num_experts << " k=" << k << " groups=" << groups
              << " defect=" << defect;
          EXPECT_EQ(expert_id_check_internal::Uint16ExpertIdsValidWithoutAvx2(
                        ids.data(), groups, k, num_experts),
                    want)
              << "without AVX2: E=" << num_experts << " k=" << k << " groups=" << groups
              << " defect=" << defect;
        }
      }
    }
  }
}

TEST(ExpertIdCheckTest, Uint16RefusesTheTopBitSoNegativeInt16IdsNeverPass) {
  // int16 -1 read as uint16 is 65535; any negative id is >= 32768.
  const std::vector<uint16_t> missing = {0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF,
                                         0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF};
  EXPECT_FALSE(Uint16ExpertIdsValid(missing.data(), 1, 8, 384));
  const std::vector<uint16_t> one = {1, 2, 3, 0x8000, 5, 6, 7, 8};
  EXPECT_FALSE(Uint16ExpertIdsValid(one.data(), 1, 8, 32768));
  EXPECT_TRUE(Uint16ExpertIdsValid(one.data(), 1, 8, 32769));
  // The same past the first 32 bytes, where AVX2 steps check them.
  std::vector<uint16_t> long_run;
  for (int g = 0; g < 40; ++g) long_run.insert(long_run.end(), {1, 2, 3, 4, 5, 6, 7, 8});
  long_run[8 * 33 + 5] = 0x8000;
  EXPECT_FALSE(Uint16ExpertIdsValid(long_run.data(), 40, 8, 32768));
  EXPECT_TRUE(Uint16ExpertIdsValid(long_run.data(), 40, 8, 32769));
  long_run[8 * 33 + 5] = 0xFFFF;
  EXPECT_FALSE(Uint16ExpertIdsValid(long_run.data(), 40, 8, 65535));
}

TEST(ExpertIdCheckTest, EveryLayerNonzeroOfBothWidths) {
  // [rows 2, layers 2, k 2]: layer 1 is all zero in row 0, not in row 1.
  const std::vector<uint16_t> wide = {1, 0, 0, 0, 0, 0, 0, 300};
  EXPECT_TRUE(EveryLayerNonzero(wide.data(), 2, 2, 2));
  EXPECT_FALSE(EveryLayerNonzero(wide.data(), 1, 2, 2));
  const std::vector<uint8_t> narrow = {1, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_FALSE(EveryLayerNonzero(narrow.data(), 2, 2, 2));
}

}  // namespace
}  // namespace rollpack
