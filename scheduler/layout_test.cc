#include "scheduler/layout.h"

#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/layout_gather.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// Compact comparison of runs: {ordinal, source_pos, length, padding,
// stream_pos, output_row}.
struct R {
  int ordinal;
  int64_t source_pos, length;
  bool padding;
  int64_t stream_pos, output_row;
};

std::vector<std::vector<int64_t>> Flatten(const std::vector<RowRun>& runs) {
  std::vector<std::vector<int64_t>> out;
  for (const RowRun& r : runs) {
    out.push_back({r.ordinal, r.source_pos, r.length, r.padding ? 1 : 0,
                   r.stream_pos, r.output_row});
  }
  return out;
}
std::vector<std::vector<int64_t>> Flatten(const std::vector<R>& runs) {
  std::vector<std::vector<int64_t>> out;
  for (const R& r : runs) {
    out.push_back({r.ordinal, r.source_pos, r.length, r.padding ? 1 : 0,
                   r.stream_pos, r.output_row});
  }
  return out;
}

PlanGroup Group(int first_rank, int cp_size, std::vector<int> seqs,
                std::vector<int64_t> padded) {
  PlanGroup g;
  g.first_rank = first_rank;
  g.cp_size = cp_size;
  g.sequences = std::move(seqs);
  g.padded_lengths = std::move(padded);
  int64_t sum = 0;
  for (int64_t p : g.padded_lengths) sum += p;
  g.tokens_per_rank = sum / cp_size;
  g.work_per_rank = 1.5;
  return g;
}

ModelSpec SmallMoe() {
  ModelSpec m;
  m.name = "small";
  m.num_layers = 4;
  m.moe_layers = {1, 3};
  m.num_experts = 8;
  m.topk = 2;
  return m;
}

// The hand-computed case: lengths 13, 8, 3 at cp=2, tp=2 with sequence
// parallel: alignment 2*2*2 = 8, padded 16, 8, 8; T_r = 16; pp=2 over 4
// layers with M = {1, 3}.
class HandComputed : public ::testing::Test {
 protected:
  void SetUp() override {
    t_.dp = 1;
    t_.cp = 2;
    t_.tp = 2;
    t_.pp = 2;
    t_.sequence_parallel = true;
    t_.max_tokens_per_rank = 16;
    Plan plan;
    plan.num_dpcp_ranks = 2;
    plan.microbatches.push_back({{Group(0, 2, {0, 1, 2}, {16, 8, 8})}});
    auto layout = StepLayout::Create(plan, lengths_, t_, SmallMoe());
    ASSERT_TRUE(layout.ok()) << layout.status();
    layout_.emplace(*std::move(layout));
    // tokens: 1000*(i+1) + t.
    for (int i = 0; i < 3; ++i) {
      for (int t = 0; t < lengths_[i]; ++t) tokens_[i].push_back(1000 * (i + 1) + t);
    }
    // experts [rows, |M| = 2, K = 2]: a = (3i + t + l) % 8, b = (a + 5) % 8.
    // Sequence 0 has rows for 12 tokens (n - 1); sequence 2's row 2 is
    // marked missing.
    const int rows[3] = {12, 8, 3};
    for (int i = 0; i < 3; ++i) {
      for (int t = 0; t < rows[i]; ++t) {
        for (int l = 0; l < 2; ++l) {
          const uint8_t a = (3 * i + t + l) % 8;
          experts_[i].push_back(a);
          experts_[i].push_back((a + 5) % 8);
        }
        valid_[i].push_back(i == 2 && t == 2 ? 0 : 1);
      }
    }
  }

  RankMicrobatchLayout Rank(int cp, int tp, int pp) {
    auto r = layout_->Describe({0, cp, tp, pp}, 0);
    EXPECT_TRUE(r.ok()) << r.status();
    return *std::move(r);
  }

  std::vector<int32_t> Tokens(const RankMicrobatchLayout& r) {
    std::vector<int32_t> out(r.local_tokens, -1);
    const void* src[3] = {tokens_[0].data(), tokens_[1].data(), tokens_[2].data()};
    absl::Status s = GatherRows(
        r.token_runs, sizeof(int32_t), absl::MakeConstSpan(src),
        absl::MakeSpan(reinterpret_cast<uint8_t*>(out.data()), out.size() * 4));
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  void Replay(const RankMicrobatchLayout& r, std::vector<uint8_t>* experts,
              std::vector<uint8_t>* mask) {
    ReplaySpec spec;
    spec.num_experts = 8;
    spec.topk = 2;
    spec.id_bytes = 1;
    spec.payload_layers = 2;
    spec.layer_indices = r.replay_positions;
    experts->assign(r.router_rows * r.replay_layers.size() * 2, 255);
    mask->assign(r.router_rows, 255);
    std::vector<ReplaySource> src(3);
    for (int i = 0; i < 3; ++i) {
      src[i].experts = experts_[i].data();
      src[i].num_rows = static_cast<int64_t>(valid_[i].size());
      src[i].valid = valid_[i].data();
    }
    absl::Status s = GatherReplay(r.router_runs, spec, src, absl::MakeSpan(*experts),
                                  absl::MakeSpan(*mask));
    EXPECT_TRUE(s.ok()) << s;
  }

  Topology t_;
  std::vector<int64_t> lengths_ = {13, 8, 3};
  std::optional<StepLayout> layout_;
  std::vector<int32_t> tokens_[3];
  std::vector<uint8_t> experts_[3];
  std::vector<uint8_t> valid_[3];
};

TEST_F(HandComputed, Metadata) {
  for (int cp = 0; cp < 2; ++cp) {
    RankMicrobatchLayout r = Rank(cp, 1, 1);
    EXPECT_EQ(r.local_cp_size, 2);
    EXPECT_EQ(r.local_cp_rank, cp);
    EXPECT_EQ(r.num_microbatches, 1);
    EXPECT_EQ(r.local_tokens, 16);
    EXPECT_THAT(r.group->sequences, ElementsAre(0, 1, 2));
    EXPECT_THAT(r.group->cu_seqlens, ElementsAre(0, 13, 21, 24));
    EXPECT_THAT(r.group->cu_seqlens_padded, ElementsAre(0, 16, 24, 32));
    EXPECT_EQ(r.group->max_seqlen, 16);
    EXPECT_EQ(r.group->work_per_rank, 1.5);
    EXPECT_EQ(r.router_row_begin, 8);
    EXPECT_EQ(r.router_rows, 8);
    EXPECT_THAT(r.replay_layers, ElementsAre(3));
    EXPECT_THAT(r.replay_positions, ElementsAre(1));
    EXPECT_FALSE(r.first_pipeline_stage);
    EXPECT_TRUE(r.last_pipeline_stage);
  }
  RankMicrobatchLayout r0 = Rank(0, 0, 0);
  EXPECT_EQ(r0.router_row_begin, 0);
  EXPECT_THAT(r0.replay_layers, ElementsAre(1));
  EXPECT_THAT(r0.replay_positions, ElementsAre(0));
  EXPECT_TRUE(r0.first_pipeline_stage);
  EXPECT_FALSE(r0.last_pipeline_stage);
}

TEST_F(HandComputed, ZigzagRuns) {
  // seq 0 (p=16, h=4): cp0 [0,4)+[12,16), cp1 [4,12) (merged);
  // seq 1 (p=8, h=2): cp0 [0,2)+[6,8), cp1 [2,6);
  // seq 2 (p=8, n=3): cp0 [0,2)+[6,8) (padding), cp1 [2,3) + [3,6) padding.
  EXPECT_EQ(Flatten(Rank(0, 0, 0).token_runs),
            Flatten(std::vector<R>{{0, 0, 4, false, 0, 0},
                                   {0, 12, 1, false, 12, 4},
                                   {0, 13, 3, true, 13, 5},
                                   {1, 0, 2, false, 16, 8},
                                   {1, 6, 2, false, 22, 10},
                                   {2, 0, 2, false, 24, 12},
                                   {2, 6, 2, true, 30, 14}}));
  EXPECT_EQ(Flatten(Rank(1, 0, 0).token_runs),
            Flatten(std::vector<R>{{0, 4, 8, false, 4, 0},
                                   {1, 2, 4, false, 18, 8},
                                   {2, 2, 1, false, 26, 12},
                                   {2, 3, 3, true, 27, 13}}));
  // Token runs do not depend on tp or pp.
  EXPECT_EQ(Flatten(Rank(1, 1, 1).token_runs), Flatten(Rank(1, 0, 0).token_runs));
}

TEST_F(HandComputed, RouterRuns) {
  EXPECT_EQ(Flatten(Rank(0, 0, 0).router_runs),
            Flatten(std::vector<R>{{0, 0, 4, false, 0, 0},
                                   {0, 12, 1, false, 12, 4},
                                   {0, 13, 3, true, 13, 5}}));
  EXPECT_EQ(Flatten(Rank(0, 1, 0).router_runs),
            Flatten(std::vector<R>{{1, 0, 2, false, 16, 0},
                                   {1, 6, 2, false, 22, 2},
                                   {2, 0, 2, false, 24, 4},
                                   {2, 6, 2, true, 30, 6}}));
  EXPECT_EQ(Flatten(Rank(1, 0, 1).router_runs),
            Flatten(std::vector<R>{{0, 4, 8, false, 4, 0}}));
  EXPECT_EQ(Flatten(Rank(1, 1, 1).router_runs),
            Flatten(std::vector<R>{{1, 2, 4, false, 18, 0},
                                   {2, 2, 1, false, 26, 4},
                                   {2, 3, 3, true, 27, 5}}));
}

TEST_F(HandComputed, Tokens) {
  EXPECT_THAT(Tokens(Rank(0, 0, 0)),
              ElementsAre(1000, 1001, 1002, 1003, 1012, 0, 0, 0, 2000, 2001, 2006,
                          2007, 3000, 3001, 0, 0));
  EXPECT_THAT(Tokens(Rank(1, 1, 0)),
              ElementsAre(1004, 1005, 1006, 1007, 1008, 1009, 1010, 1011, 2002, 2003,
                          2004, 2005, 3002, 0, 0, 0));
}

TEST_F(HandComputed, Replay) {
  std::vector<uint8_t> experts, mask;
  // cp0 tp0 pp0: layer 1 (position 0); seq 0 rows 0..3 real, row 12 is
  // missing (the payload ends at n-1), 13..15 padding; filler (2q + j) % 8.
  Replay(Rank(0, 0, 0), &experts, &mask);
  EXPECT_THAT(experts, ElementsAre(0, 5, 1, 6, 2, 7, 3, 0,  // real
                                   0, 1,                    // missing, q=12
                                   2, 3, 4, 5, 6, 7));      // padding q=13..15
  EXPECT_THAT(mask, ElementsAre(1, 1, 1, 1, 0, 0, 0, 0));
  // cp1 tp1 pp1: layer 3 (position 1); seq 1 rows 2..5, seq 2 row 2
  // (invalid), padding q=27..29.
  Replay(Rank(1, 1, 1), &experts, &mask);
  EXPECT_THAT(experts, ElementsAre(6, 3, 7, 4, 0, 5, 1, 6,  // seq 1 rows 2..5
                                   4, 5,                    // invalid, q=26
                                   6, 7, 0, 1, 2, 3));      // padding
  EXPECT_THAT(mask, ElementsAre(1, 1, 1, 1, 0, 0, 0, 0));
  // cp0 tp1 pp1: seq 1 rows 0,1,6,7; seq 2 rows 0,1; padding q=30,31.
  Replay(Rank(0, 1, 1), &experts, &mask);
  EXPECT_THAT(experts, ElementsAre(4, 1, 5, 2, 2, 7, 3, 0,  // seq 1
                                   7, 4, 0, 5,              // seq 2 rows 0, 1
                                   4, 5, 6, 7));            // q=30, 31
  EXPECT_THAT(mask, ElementsAre(1, 1, 1, 1, 1, 1, 0, 0));
}

TEST_F(HandComputed, FullAndCompactPayloadsGiveIdenticalOutput) {
  // The same routing as a full-layout payload [rows, N=4, K]: dense layers
  // 0 and 2 hold garbage that must be ignored.
  const std::vector<int> m = {1, 3};
  std::vector<uint8_t> full[3];
  for (int i = 0; i < 3; ++i) {
    const int64_t rows = static_cast<int64_t>(valid_[i].size());
    full[i].assign(rows * 4 * 2, 0xEE);
    for (int64_t t = 0; t < rows; ++t) {
      for (int l = 0; l < 2; ++l) {
        const int fi = *PayloadLayerIndex(PayloadLayout::kFull, 4, m, m[l]);
        const int ci = *PayloadLayerIndex(PayloadLayout::kCompact, 4, m, m[l]);
        std::memcpy(&full[i][(t * 4 + fi) * 2], &experts_[i][(t * 2 + ci) * 2], 2);
      }
    }
  }
  for (int cp = 0; cp < 2; ++cp) {
    for (int tp = 0; tp < 2; ++tp) {
      for (int pp = 0; pp < 2; ++pp) {
        RankMicrobatchLayout r = Rank(cp, tp, pp);
        std::vector<uint8_t> compact_experts, compact_mask;
        Replay(r, &compact_experts, &compact_mask);
        std::vector<int> indices;
        for (int l : r.replay_layers) {
          indices.push_back(*PayloadLayerIndex(PayloadLayout::kFull, 4, m, l));
        }
        ReplaySpec spec;
        spec.num_experts = 8;
        spec.topk = 2;
        spec.id_bytes = 1;
        spec.payload_layers = 4;
        spec.layer_indices = indices;
        std::vector<uint8_t> experts(compact_experts.size()), mask(compact_mask.size());
        std::vector<ReplaySource> src(3);
        for (int i = 0; i < 3; ++i) {
          src[i] = {full[i].data(), 0, static_cast<int64_t>(valid_[i].size()),
                    valid_[i].data()};
        }
        ASSERT_TRUE(GatherReplay(r.router_runs, spec, src, absl::MakeSpan(experts),
                                 absl::MakeSpan(mask))
                        .ok());
        EXPECT_EQ(experts, compact_experts) << cp << tp << pp;
        EXPECT_EQ(mask, compact_mask);
        EXPECT_THAT(experts, ::testing::Not(::testing::Contains(0xEE)));
      }
    }
  }
}

TEST_F(HandComputed, RankAndMicrobatchErrors) {
  auto bad_mb = layout_->Describe({0, 0, 0, 0}, 1);
  EXPECT_EQ(bad_mb.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(bad_mb.status().message()), HasSubstr("micro-batch index 1"));
  EXPECT_EQ(layout_->Describe({0, 0, 0, 0}, -1).status().code(),
            absl::StatusCode::kOutOfRange);
  for (RankCoords c : {RankCoords{1, 0, 0, 0}, RankCoords{0, 2, 0, 0},
                       RankCoords{0, 0, 2, 0}, RankCoords{0, 0, 0, 2},
                       RankCoords{-1, 0, 0, 0}}) {
    auto r = layout_->Describe(c, 0);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("coordinate"));
  }
  EXPECT_THAT(std::string(layout_->Describe({0, 0, 7, 0}, 0).status().message()),
              HasSubstr("tp coordinate 7"));
  EXPECT_EQ(layout_->GroupOf(0, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(HandComputed, ConcurrentDescribeMatchesSerial) {
  // Const methods are thread-safe: many threads describing every rank give
  // the serial answers.
  std::vector<std::vector<std::vector<int64_t>>> serial;
  for (int cp = 0; cp < 2; ++cp) {
    for (int tp = 0; tp < 2; ++tp) {
      for (int pp = 0; pp < 2; ++pp) {
        RankMicrobatchLayout r = Rank(cp, tp, pp);
        serial.push_back(Flatten(r.token_runs));
        serial.push_back(Flatten(r.router_runs));
      }
    }
  }
  std::vector<std::thread> threads;
  std::vector<int> mismatches(8, 0);
  for (int th = 0; th < 8; ++th) {
    threads.emplace_back([&, th] {
      RankMicrobatchLayout r;
      for (int iter = 0; iter < 200; ++iter) {
        size_t k = 0;
        for (int cp = 0; cp < 2; ++cp) {
          for (int tp = 0; tp < 2; ++tp) {
            for (int pp = 0; pp < 2; ++pp) {
              if (!layout_->Describe({0, cp, tp, pp}, 0, &r).ok()) ++mismatches[th];
              if (Flatten(r.token_runs) != serial[k++]) ++mismatches[th];
              if (Flatten(r.router_runs) != serial[k++]) ++mismatches[th];
            }
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(mismatches, ::testing::Each(0));
}

TEST(StepLayout, DynamicCpGroupsAndNoSequenceParallel) {
  Topology t;
  t.dp = 2;
  t.cp = 2;
  t.tp = 2;
  t.sequence_parallel = false;
  t.scheduler = SchedulerKind::kDynamicCp;
  t.max_tokens_per_rank = 10;
  t.microbatch_group_size = 2;
  ModelSpec model = SmallMoe();
  // Lengths: 9 (on c=2: a=4, p=12, T_r=6), 7 (c=1: a=1, p=7), 10, 3, 5, 4.
  const std::vector<int64_t> lengths = {9, 7, 10, 3, 5, 4};
  Plan plan;
  plan.num_dpcp_ranks = 4;
  plan.microbatches.push_back(
      {{Group(0, 2, {0}, {12}), Group(2, 1, {1}, {7}), Group(3, 1, {3, 4}, {3, 5})}});
  plan.microbatches.push_back({{Group(0, 4, {2, 5}, {16, 8})}});
  auto layout = StepLayout::Create(plan, lengths, t, model);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->num_microbatches(), 2);

  auto r = layout->Describe({1, 1, 1, 0}, 0);  // rank id 3
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->local_cp_size, 1);
  EXPECT_EQ(r->local_cp_rank, 0);
  EXPECT_EQ(r->group->first_rank, 3);
  EXPECT_THAT(r->group->cu_seqlens, ElementsAre(0, 3, 8));
  EXPECT_THAT(r->group->cu_seqlens_padded, ElementsAre(0, 3, 8));
  EXPECT_EQ(r->local_tokens, 8);
  EXPECT_EQ(Flatten(r->token_runs), Flatten(std::vector<R>{{0, 0, 3, false, 0, 0},
                                                           {1, 0, 5, false, 3, 3}}));
  // No sequence parallel: every TP rank's router sees all rows.
  EXPECT_EQ(r->router_rows, 8);
  EXPECT_EQ(Flatten(r->router_runs), Flatten(r->token_runs));

  r = layout->Describe({0, 1, 0, 0}, 0);  // rank id 1, in group [0, 2)
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->local_cp_size, 2);
  EXPECT_EQ(r->local_cp_rank, 1);
  // p=12, h=3: rank 1 takes [3, 6) + [6, 9): merged, all real (n = 9).
  EXPECT_EQ(Flatten(r->token_runs), Flatten(std::vector<R>{{0, 3, 6, false, 3, 0}}));

  r = layout->Describe({1, 0, 1, 0}, 1);  // rank id 2 in the group of 4
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->local_cp_size, 4);
  EXPECT_EQ(r->local_cp_rank, 2);
  EXPECT_EQ(r->local_tokens, 6);
  // seq 2 (n=10, p=16, h=2): [4,6) + [10,12) padding; seq 5 (n=4, p=8,
  // h=1): [2,3) real + [5,6) padding.
  EXPECT_EQ(Flatten(r->token_runs), Flatten(std::vector<R>{{0, 4, 2, false, 4, 0},
                                                           {0, 10, 2, true, 10, 2},
                                                           {1, 2, 1, false, 18, 4},
                                                           {1, 5, 1, true, 21, 5}}));
  EXPECT_EQ(r->group->sequences, (std::vector<int>{2, 5}));
  EXPECT_EQ(r->token_runs[2].sequence, 5);
}

TEST(StepLayout, SingleRankOddLengthAndTokenField) {
  // c = 1 without sequence parallel: no alignment, the whole sequence.
  Topology t;
  t.max_tokens_per_rank = 100;
  ModelSpec model = SmallMoe();
  Plan plan;
  plan.microbatches.push_back({{Group(0, 1, {1, 0}, {3, 5})}});
  auto layout = StepLayout::Create(plan, std::vector<int64_t>{5, 3}, t, model);
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto r = layout->Describe({0, 0, 0, 0}, 0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Flatten(r->token_runs), Flatten(std::vector<R>{{0, 0, 3, false, 0, 0},
                                                           {1, 0, 5, false, 3, 3}}));
  // A float32 [n, 2] field: row_bytes 8, gathered through a callback.
  std::vector<float> f0 = {0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5};
  std::vector<float> f1 = {10, 10.5, 11, 11.5, 12, 12.5};
  std::vector<float> out(16);
  auto s = GatherRows(
      r->token_runs, 8,
      [&](int ordinal) -> const void* {
        return r->group->sequences[ordinal] == 0 ? f0.data() : f1.data();
      },
      absl::MakeSpan(reinterpret_cast<uint8_t*>(out.data()), 64));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_THAT(out, ElementsAre(10, 10.5, 11, 11.5, 12, 12.5, 0, 0.5, 1, 1.5, 2, 2.5,
                               3, 3.5, 4, 4.5));
}

TEST(StepLayout, PlanRefusals) {
  Topology t;
  t.cp = 2;
  t.dp = 1;
  t.max_tokens_per_rank = 8;
  t.sequence_parallel = false;  // a = 4
  ModelSpec model = SmallMoe();
  const std::vector<int64_t> lengths = {5, 3};
  auto make = [&](std::vector<PlanGroup> groups) {
    Plan p;
    p.num_dpcp_ranks = 2;
    p.microbatches.push_back({std::move(groups)});
    return p;
  };
  auto expect_error = [&](const Plan& p, const std::string& part,
                          const Topology& topo, const std::vector<int64_t>& ls) {
    auto l = StepLayout::Create(p, ls, topo, model);
    ASSERT_FALSE(l.ok()) << part;
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(l.status().message()), HasSubstr(part));
  };
  ASSERT_TRUE(StepLayout::Create(make({Group(0, 2, {0, 1}, {8, 4})}), lengths, t, model)
                  .ok());
  expect_error(make({Group(0, 2, {0, 1}, {8, 8})}), "expected 4", t, lengths);
  expect_error(make({Group(0, 2, {0, 0}, {8, 8})}), "more than once", t, lengths);
  expect_error(make({Group(0, 2, {0}, {8})}), "sequence 1 is in no micro-batch", t,
               lengths);
  expect_error(make({Group(0, 2, {0, 2}, {8, 4})}), "sequence index 2", t, lengths);
  expect_error(make({Group(0, 2, {}, {})}), "has no sequence", t, lengths);
  expect_error(make({Group(0, 1, {0}, {5}), Group(1, 1, {1}, {3})}), "cp_size is 1",
               t, lengths);
  Topology small = t;
  small.max_tokens_per_rank = 4;
  expect_error(make({Group(0, 2, {0, 1}, {8, 4})}), "max_tokens_per_rank 4", small,
               lengths);
  PlanGroup wrong_tpr = Group(0, 2, {0, 1}, {8, 4});
  wrong_tpr.tokens_per_rank = 5;
  expect_error(make({wrong_tpr}), "tokens_per_rank is 5", t, lengths);
  expect_error(make({Group(0, 2, {0, 1}, {8, 4})}), "length 0", t,
               std::vector<int64_t>{5, 0});
  Plan two = make({Group(0, 2, {0}, {8})});
  two.microbatches.push_back({{Group(0, 2, {1}, {4})}});
  Topology mbgs = t;
  mbgs.microbatch_group_size = 4;
  expect_error(two, "microbatch_group_size 4", mbgs, lengths);
  Plan wrong_ranks = make({Group(0, 2, {0, 1}, {8, 4})});
  wrong_ranks.num_dpcp_ranks = 4;
  expect_error(wrong_ranks, "num_dpcp_ranks is 4", t, lengths);
  // Dynamic CP: misaligned and non-tiling groups.
  Topology dyn = t;
  dyn.dp = 3;
  dyn.cp = 1;
  dyn.scheduler = SchedulerKind::kDynamicCp;
  Plan mis;
  mis.num_dpcp_ranks = 3;
  mis.microbatches.push_back(
      {{Group(0, 1, {0}, {5}), Group(1, 2, {1}, {4})}});
  expect_error(mis, "first_rank is 1", dyn, lengths);
  Plan gap;
  gap.num_dpcp_ranks = 3;
  gap.microbatches.push_back({{Group(0, 2, {0, 1}, {8, 4})}});
  expect_error(gap, "cover ranks [0, 2)", dyn, lengths);
  // Pipeline errors surface at creation.
  Topology bad_pp = t;
  bad_pp.pp = 3;
  expect_error(make({Group(0, 2, {0, 1}, {8, 4})}), "pp * vpp = 3", bad_pp, lengths);
}

TEST(Gather, SizeAndSpecErrors) {
  std::vector<RowRun> runs = {{0, 0, 0, 2, false, 0, 0}, {0, 0, 2, 2, true, 2, 2}};
  int32_t src[2] = {7, 8};
  std::vector<uint8_t> out(12);
  const void* sources[1] = {src};
  EXPECT_FALSE(GatherRows(runs, 4, sources, absl::MakeSpan(out)).ok());
  out.resize(16, 0xFF);
  ASSERT_TRUE(GatherRows(runs, 4, sources, absl::MakeSpan(out)).ok());
  int32_t got[4];
  std::memcpy(got, out.data(), 16);
  EXPECT_THAT(got, ElementsAre(7, 8, 0, 0));
  std::vector<uint8_t> empty;
  EXPECT_TRUE(GatherRows(runs, 0, sources, absl::MakeSpan(empty)).ok());
  const void* none[1] = {nullptr};
  EXPECT_FALSE(GatherRows(runs, 4, none, absl::MakeSpan(out)).ok());
  // Runs that do not tile are refused.
  std::vector<RowRun> gappy = {{0, 0, 0, 2, false, 0, 1}};
  std::vector<uint8_t> out8(8);
  EXPECT_FALSE(GatherRows(gappy, 4, sources, absl::MakeSpan(out8)).ok());

  const std::vector<int> idx = {0};
  ReplaySpec spec{300, 2, 1, 1, idx};
  std::vector<uint8_t> ex(8), mask(4);
  std::vector<ReplaySource> rs(1);
  auto st = GatherReplay(runs, spec, rs, absl::MakeSpan(ex), absl::MakeSpan(mask));
  EXPECT_THAT(std::string(st.message()), HasSubstr("num_experts 300"));
  spec = {8, 9, 1, 1, idx};
  EXPECT_FALSE(GatherReplay(runs, spec, rs, absl::MakeSpan(ex), absl::MakeSpan(mask)).ok());
  const std::vector<int> bad_idx = {1};
  spec = {8, 2, 1, 1, bad_idx};
  EXPECT_FALSE(GatherReplay(runs, spec, rs, absl::MakeSpan(ex), absl::MakeSpan(mask)).ok());
  spec = {8, 2, 1, 1, idx};
  std::vector<uint8_t> short_ex(7);
  EXPECT_FALSE(
      GatherReplay(runs, spec, rs, absl::MakeSpan(short_ex), absl::MakeSpan(mask)).ok());
  // No source at all: every row is filler, mask 0.
  ASSERT_TRUE(GatherReplay(runs, spec, rs, absl::MakeSpan(ex), absl::MakeSpan(mask)).ok());
  EXPECT_THAT(ex, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_THAT(mask, ElementsAre(0, 0, 0, 0));
}

TEST(Gather, Uint16ReplayWithRowOffsetAndFiller) {
  // E = 1000, K = 3, one sequence of 6 tokens whose payload covers tokens
  // [1, 5) (row_offset 1), two payload layers, output layer 1 only.
  std::vector<RowRun> runs = {{0, 0, 0, 6, false, 100, 0}, {0, 0, 6, 2, true, 106, 6}};
  std::vector<uint16_t> payload;
  for (int t = 0; t < 4; ++t) {
    for (int l = 0; l < 2; ++l) {
      for (int j = 0; j < 3; ++j) payload.push_back(static_cast<uint16_t>(500 + 10 * t + l * 3 + j));
    }
  }
  const std::vector<int> idx = {1};
  ReplaySpec spec{1000, 3, 2, 2, idx};
  std::vector<uint16_t> ex(8 * 3);
  std::vector<uint8_t> mask(8);
  ReplaySource src{payload.data(), 1, 4, nullptr};
  auto st = GatherReplay(
      runs, spec, [&](int) { return src; },
      absl::MakeSpan(reinterpret_cast<uint8_t*>(ex.data()), ex.size() * 2),
      absl::MakeSpan(mask));
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_THAT(mask, ElementsAre(0, 1, 1, 1, 1, 0, 0, 0));
  EXPECT_THAT(ex, ElementsAre(300, 301, 302,  // token 0 missing: q=100 -> 300 % 1000
                              503, 504, 505, 513, 514, 515, 523, 524, 525, 533, 534,
                              535,            // tokens 1..4
                              315, 316, 317,  // token 5 missing, q=105
                              318, 319, 320,  // padding q=106
                              321, 322, 323));
}

TEST(Gather, FillerWrapsModuloE) {
  // E = 5, K = 5: every filler row is a permutation of 0..4.
  for (int64_t q = 0; q < 20; ++q) {
    std::vector<int> ids;
    for (int j = 0; j < 5; ++j) ids.push_back(static_cast<int>(FillerExpertId(q, j, 5, 5)));
    EXPECT_THAT(ids, ::testing::UnorderedElementsAre(0, 1, 2, 3, 4));
  }
  EXPECT_EQ(FillerExpertId(3, 1, 2, 5), 2);  // (3*2 + 1) % 5
}

}  // namespace
}  // namespace rollpack
