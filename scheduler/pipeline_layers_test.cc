#include "scheduler/pipeline_layers.h"

#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// [begin, end) as a vector.
std::vector<int> Range(int begin, int end) {
  std::vector<int> v(end - begin);
  std::iota(v.begin(), v.end(), begin);
  return v;
}

Topology Pp(int pp, int vpp = 1, int first = 0, int last = 0) {
  Topology t;
  t.pp = pp;
  t.vpp = vpp;
  t.num_layers_in_first_pipeline_stage = first;
  t.num_layers_in_last_pipeline_stage = last;
  t.max_tokens_per_rank = 1024;
  t.microbatch_group_size = vpp > 1 ? pp : 1;
  return t;
}

ModelSpec Moe(int num_layers, std::vector<int> moe_layers) {
  ModelSpec m;
  m.name = "m";
  m.num_layers = num_layers;
  m.moe_layers = std::move(moe_layers);
  m.num_experts = 64;
  m.topk = 4;
  return m;
}

TEST(AssignPipelineLayers, SingleStageOwnsEverything) {
  auto a = AssignPipelineLayers(5, Pp(1));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(*a, ElementsAre(ElementsAre(0, 1, 2, 3, 4)));
}

TEST(AssignPipelineLayers, EvenSplit) {
  auto a = AssignPipelineLayers(12, Pp(3));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(*a, ElementsAre(ElementsAre(0, 1, 2, 3), ElementsAre(4, 5, 6, 7),
                              ElementsAre(8, 9, 10, 11)));
}

TEST(AssignPipelineLayers, InterleavedVpp) {
  auto a = AssignPipelineLayers(8, Pp(2, 2));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(*a, ElementsAre(ElementsAre(0, 1, 4, 5), ElementsAre(2, 3, 6, 7)));

  // N=12, pp=2, vpp=3: chunks of 2; chunk (p, v) starts at v*4 + p*2.
  auto b = AssignPipelineLayers(12, Pp(2, 3));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(*b, ElementsAre(ElementsAre(0, 1, 4, 5, 8, 9),
                              ElementsAre(2, 3, 6, 7, 10, 11)));
}

TEST(AssignPipelineLayers, DeepSeekV3FirstAndLast) {
  auto a = AssignPipelineLayers(61, Pp(4, 1, 13, 16));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 4u);
  EXPECT_THAT((*a)[0], ElementsAreArray(Range(0, 13)));
  EXPECT_THAT((*a)[1], ElementsAreArray(Range(13, 29)));
  EXPECT_THAT((*a)[2], ElementsAreArray(Range(29, 45)));
  EXPECT_THAT((*a)[3], ElementsAreArray(Range(45, 61)));
}

TEST(AssignPipelineLayers, OnlyFirstOrOnlyLast) {
  auto f = AssignPipelineLayers(10, Pp(3, 1, 2, 0));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT(*f, ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3, 4, 5),
                              ElementsAre(6, 7, 8, 9)));
  auto z = AssignPipelineLayers(10, Pp(3, 1, 0, 2));
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_THAT(*z, ElementsAre(ElementsAre(0, 1, 2, 3), ElementsAre(4, 5, 6, 7),
                              ElementsAre(8, 9)));
  // pp=2 with both set and F+Z = N: no middle stage needed.
  auto fz = AssignPipelineLayers(8, Pp(2, 1, 3, 5));
  ASSERT_TRUE(fz.ok()) << fz.status();
  EXPECT_THAT(*fz, ElementsAre(ElementsAre(0, 1, 2), ElementsAre(3, 4, 5, 6, 7)));
}

TEST(AssignPipelineLayers, InterleavedWithFirstAndLast) {
  // N=16, pp=4, vpp=2, F=Z=2: chunk sizes [1, 3, 3, 1], 8 per virtual stage.
  auto a = AssignPipelineLayers(16, Pp(4, 2, 2, 2));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(*a, ElementsAre(ElementsAre(0, 8), ElementsAre(1, 2, 3, 9, 10, 11),
                              ElementsAre(4, 5, 6, 12, 13, 14),
                              ElementsAre(7, 15)));
  // Only F: N=14, pp=3, vpp=2, F=2 -> middle 12 over 2 stages = 6 = 2*3.
  // Chunk sizes [1, 3, 3], 7 per virtual stage.
  auto b = AssignPipelineLayers(14, Pp(3, 2, 2, 0));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(*b, ElementsAre(ElementsAre(0, 7), ElementsAre(1, 2, 3, 8, 9, 10),
                              ElementsAre(4, 5, 6, 11, 12, 13)));
}

void ExpectRefused(int n, const Topology& t, const std::vector<std::string>& parts) {
  auto a = AssignPipelineLayers(n, t);
  ASSERT_FALSE(a.ok()) << "accepted N=" << n << " pp=" << t.pp;
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& p : parts) {
    EXPECT_THAT(std::string(a.status().message()), HasSubstr(p));
  }
}

TEST(AssignPipelineLayers, Refusals) {
  // Not divisible.
  ExpectRefused(10, Pp(4), {"num_layers 10", "pp * vpp = 4"});
  ExpectRefused(8, Pp(2, 3), {"pp * vpp = 6"});
  ExpectRefused(61, Pp(4, 1, 13, 15), {"middle layers 33", "middle stages 2"});
  ExpectRefused(16, Pp(4, 2, 3, 1), {"stage 0", "3 layers", "vpp 2"});
  ExpectRefused(14, Pp(4, 2, 2, 2), {"stage 1", "5 layers", "vpp 2"});
  // A stage with no layer.
  ExpectRefused(10, Pp(3, 1, 5, 5), {"no layer", "num_layers 10"});
  ExpectRefused(4, Pp(2, 1, 4, 0), {"no layer"});
  ExpectRefused(3, Pp(4), {"num_layers 3"});
  // F + Z > N.
  ExpectRefused(10, Pp(3, 1, 6, 5), {"6 + 5 = 11", "num_layers 10"});
  // F or Z with pp = 1.
  ExpectRefused(10, Pp(1, 1, 2, 0), {"pp 1", "num_layers_in_first_pipeline_stage 2"});
  ExpectRefused(10, Pp(1, 1, 0, 3), {"pp 1", "num_layers_in_last_pipeline_stage 3"});
  // vpp > 1 with pp = 1.
  ExpectRefused(8, Pp(1, 2), {"vpp 2", "pp 1"});
  // vpp > 1 with F and Z and pp = 2.
  ExpectRefused(8, Pp(2, 2, 4, 4), {"middle stage", "vpp 2"});
  // pp = 2, F and Z, layers left over for no stage.
  ExpectRefused(8, Pp(2, 1, 3, 4), {"1 layers left"});
  // No layers at all.
  ExpectRefused(0, Pp(1), {"num_layers 0"});
}

TEST(PipelineLayers, DeepSeekV3ReplayLayers) {
  auto p = PipelineLayers::Create(Moe(61, Range(3, 61)), Pp(4, 1, 13, 16));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->num_stages(), 4);
  EXPECT_THAT(p->stage(0).layers, ElementsAreArray(Range(0, 13)));
  EXPECT_THAT(p->stage(0).replay_layers,
              ElementsAre(3, 4, 5, 6, 7, 8, 9, 10, 11, 12));
  EXPECT_THAT(p->stage(0).replay_positions,
              ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  EXPECT_THAT(p->stage(1).replay_layers, ElementsAreArray(Range(13, 29)));
  EXPECT_THAT(p->stage(1).replay_positions, ElementsAreArray(Range(10, 26)));
  EXPECT_THAT(p->stage(2).replay_layers, ElementsAreArray(Range(29, 45)));
  EXPECT_THAT(p->stage(2).replay_positions, ElementsAreArray(Range(26, 42)));
  EXPECT_THAT(p->stage(3).layers, ElementsAreArray(Range(45, 61)));
  EXPECT_THAT(p->stage(3).replay_layers, ElementsAreArray(Range(45, 61)));
  EXPECT_THAT(p->stage(3).replay_positions, ElementsAreArray(Range(42, 58)));
  EXPECT_THAT(p->moe_layers(), ElementsAreArray(Range(3, 61)));
}

TEST(PipelineLayers, MoonlightFirstStage) {
  auto p = PipelineLayers::Create(Moe(27, Range(1, 27)), Pp(2, 1, 13, 0));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage(0).layers, ElementsAreArray(Range(0, 13)));
  EXPECT_THAT(p->stage(0).replay_layers,
              ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12));
  EXPECT_THAT(p->stage(0).replay_positions,
              ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
  EXPECT_THAT(p->stage(1).layers, ElementsAreArray(Range(13, 27)));
  EXPECT_THAT(p->stage(1).replay_layers, ElementsAreArray(Range(13, 27)));
  EXPECT_THAT(p->stage(1).replay_positions, ElementsAreArray(Range(12, 26)));
}

TEST(PipelineLayers, InterleavedSparseMoe) {
  // MoE every other layer: M = {1, 3, 5, 7}; rank 0 owns {0,1,4,5}.
  auto p = PipelineLayers::Create(Moe(8, {1, 3, 5, 7}), Pp(2, 2));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage(0).replay_layers, ElementsAre(1, 5));
  EXPECT_THAT(p->stage(0).replay_positions, ElementsAre(0, 2));
  EXPECT_THAT(p->stage(1).replay_layers, ElementsAre(3, 7));
  EXPECT_THAT(p->stage(1).replay_positions, ElementsAre(1, 3));
}

TEST(PipelineLayers, StageWithoutMoeLayersAndDenseModel) {
  // All MoE layers on the last stage: stage 0 replays nothing.
  auto p = PipelineLayers::Create(Moe(8, {6, 7}), Pp(2));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->stage(0).replay_layers.empty());
  EXPECT_THAT(p->stage(1).replay_layers, ElementsAre(6, 7));
  EXPECT_THAT(p->stage(1).replay_positions, ElementsAre(0, 1));

  ModelSpec dense;
  dense.name = "dense";
  dense.num_layers = 4;
  auto d = PipelineLayers::Create(dense, Pp(2));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT(d->stage(0).layers, ElementsAre(0, 1));
  EXPECT_TRUE(d->stage(0).replay_layers.empty());
  EXPECT_TRUE(d->stage(1).replay_layers.empty());

  // Empty moe_layers = every layer is MoE.
  auto all = PipelineLayers::Create(Moe(4, {}), Pp(2));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(all->stage(1).replay_layers, ElementsAre(2, 3));
  EXPECT_THAT(all->stage(1).replay_positions, ElementsAre(2, 3));
}

TEST(PipelineLayers, ErrorsPropagate) {
  auto bad_model = PipelineLayers::Create(Moe(8, {3, 2}), Pp(2));
  EXPECT_EQ(bad_model.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad_pp = PipelineLayers::Create(Moe(10, {}), Pp(4));
  EXPECT_EQ(bad_pp.status().code(), absl::StatusCode::kInvalidArgument);
  auto p = PipelineLayers::Create(Moe(8, {}), Pp(2));
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->Stage(2).ok());
  EXPECT_THAT(std::string(p->Stage(-1).status().message()), HasSubstr("-1"));
  EXPECT_EQ((*p->Stage(1))->pp_rank, 1);
}

TEST(PayloadLayout, DetectAndIndex) {
  const std::vector<int> m = {3, 4, 7};
  EXPECT_EQ(*DetectPayloadLayout(10, 10, m), PayloadLayout::kFull);
  EXPECT_EQ(*DetectPayloadLayout(3, 10, m), PayloadLayout::kCompact);
  auto bad = DetectPayloadLayout(5, 10, m);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("5 layers"));

  EXPECT_EQ(*PayloadLayerIndex(PayloadLayout::kFull, 10, m, 7), 7);
  EXPECT_EQ(*PayloadLayerIndex(PayloadLayout::kCompact, 10, m, 7), 2);
  EXPECT_EQ(*PayloadLayerIndex(PayloadLayout::kCompact, 10, m, 3), 0);
  EXPECT_EQ(*PayloadLayerIndex(PayloadLayout::kFull, 10, m, 4), 4);
  // Dense layer / out of range.
  EXPECT_FALSE(PayloadLayerIndex(PayloadLayout::kFull, 10, m, 5).ok());
  EXPECT_FALSE(PayloadLayerIndex(PayloadLayout::kCompact, 10, m, 0).ok());
  EXPECT_FALSE(PayloadLayerIndex(PayloadLayout::kCompact, 10, m, 10).ok());
}

ModelSpec WithMtp(ModelSpec m, int num_mtp_layers, bool mtp_routing = true) {
  m.num_mtp_layers = num_mtp_layers;
  m.mtp_routing = mtp_routing;
  return m;
}

// layout.md section 10: with mtp_routing the last stage replays N..N+D-1
// after its decoder layers, stored at |M|..|M|+D-1.
TEST(PipelineLayersMtp, SingleStageAppendsMtpLayers) {
  auto p = PipelineLayers::Create(WithMtp(Moe(4, {}), 2), Pp(1));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage(0).layers, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(p->stage(0).replay_layers, ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_THAT(p->stage(0).replay_positions, ElementsAre(0, 1, 2, 3, 4, 5));
  EXPECT_EQ(p->stored_layers(), 6);
  EXPECT_THAT(p->moe_layers(), ElementsAre(0, 1, 2, 3));
}

TEST(PipelineLayersMtp, DeepSeekV3LastStageOnly) {
  auto base = PipelineLayers::Create(Moe(61, Range(3, 61)), Pp(4, 1, 13, 16));
  auto p = PipelineLayers::Create(WithMtp(Moe(61, Range(3, 61)), 1), Pp(4, 1, 13, 16));
  ASSERT_TRUE(base.ok() && p.ok()) << p.status();
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(p->stage(s).replay_layers, base->stage(s).replay_layers) << "stage " << s;
    EXPECT_EQ(p->stage(s).replay_positions, base->stage(s).replay_positions) << "stage " << s;
  }
  EXPECT_THAT(p->stage(3).layers, ElementsAreArray(Range(45, 61)));
  std::vector<int> want_layers = Range(45, 61), want_pos = Range(42, 58);
  want_layers.push_back(61);
  want_pos.push_back(58);
  EXPECT_THAT(p->stage(3).replay_layers, ElementsAreArray(want_layers));
  EXPECT_THAT(p->stage(3).replay_positions, ElementsAreArray(want_pos));
  EXPECT_EQ(p->stored_layers(), 59);
  EXPECT_EQ(base->stored_layers(), 58);
}

TEST(PipelineLayersMtp, InterleavedVpp) {
  // M = {1, 3, 5, 7}; pp 2, vpp 2: rank 1 owns {2, 3, 6, 7}, then MTP 8, 9.
  auto p = PipelineLayers::Create(WithMtp(Moe(8, {1, 3, 5, 7}), 2), Pp(2, 2));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage(0).replay_layers, ElementsAre(1, 5));
  EXPECT_THAT(p->stage(0).replay_positions, ElementsAre(0, 2));
  EXPECT_THAT(p->stage(1).layers, ElementsAre(2, 3, 6, 7));
  EXPECT_THAT(p->stage(1).replay_layers, ElementsAre(3, 7, 8, 9));
  EXPECT_THAT(p->stage(1).replay_positions, ElementsAre(1, 3, 4, 5));
}

TEST(PipelineLayersMtp, FirstAndLastStageCounts) {
  // N = 10, pp 3, F = 2, Z = 4: stages {0,1} {2..5} {6..9}; MTP 10.
  auto p = PipelineLayers::Create(WithMtp(Moe(10, {}), 1), Pp(3, 1, 2, 4));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage(0).replay_layers, ElementsAre(0, 1));
  EXPECT_THAT(p->stage(1).replay_layers, ElementsAre(2, 3, 4, 5));
  EXPECT_THAT(p->stage(2).layers, ElementsAre(6, 7, 8, 9));
  EXPECT_THAT(p->stage(2).replay_layers, ElementsAre(6, 7, 8, 9, 10));
  EXPECT_THAT(p->stage(2).replay_positions, ElementsAre(6, 7, 8, 9, 10));
  // Z only, with vpp: pp 3, vpp 2, Z = 2 (one layer per chunk), middle 2.
  auto z = PipelineLayers::Create(WithMtp(Moe(6, {0, 5}), 3), Pp(3, 2, 0, 2));
  ASSERT_TRUE(z.ok()) << z.status();
  EXPECT_THAT(z->stage(2).layers, ElementsAre(2, 5));
  EXPECT_THAT(z->stage(2).replay_layers, ElementsAre(5, 6, 7, 8));
  EXPECT_THAT(z->stage(2).replay_positions, ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(z->stage(0).replay_layers, ElementsAre(0));
  EXPECT_TRUE(z->stage(1).replay_layers.empty());
}

TEST(PipelineLayersMtp, LastStageWithoutDecoderMoeLayers) {
  // Every decoder MoE layer on stage 0: the last stage replays only MTP.
  auto p = PipelineLayers::Create(WithMtp(Moe(8, {0, 1}), 1), Pp(2));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->stage(0).replay_layers, ElementsAre(0, 1));
  EXPECT_THAT(p->stage(1).replay_layers, ElementsAre(8));
  EXPECT_THAT(p->stage(1).replay_positions, ElementsAre(2));
}

TEST(PipelineLayersMtp, WithoutMtpRoutingNothingChanges) {
  for (const Topology& t : {Pp(1), Pp(2), Pp(2, 2), Pp(3, 1, 2, 4)}) {
    auto base = PipelineLayers::Create(Moe(16, {1, 3, 5, 7, 9, 11, 13, 15}), t);
    auto p = PipelineLayers::Create(WithMtp(Moe(16, {1, 3, 5, 7, 9, 11, 13, 15}), 3, false), t);
    ASSERT_TRUE(base.ok() && p.ok()) << base.status() << p.status();
    EXPECT_EQ(p->stored_layers(), 8);
    for (int s = 0; s < p->num_stages(); ++s) {
      EXPECT_EQ(p->stage(s).layers, base->stage(s).layers);
      EXPECT_EQ(p->stage(s).replay_layers, base->stage(s).replay_layers);
      EXPECT_EQ(p->stage(s).replay_positions, base->stage(s).replay_positions);
    }
  }
}

TEST(PipelineLayersMtp, InvalidMtpSpecRefused) {
  auto bad = PipelineLayers::Create(WithMtp(Moe(8, {}), 0, true), Pp(2));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("mtp_routing"));
}

TEST(PayloadLayout, DetectAndIndexWithMtp) {
  const std::vector<int> m = {3, 4, 7};
  EXPECT_EQ(*DetectPayloadLayout(12, 10, m, 2), PayloadLayout::kFull);
  EXPECT_EQ(*DetectPayloadLayout(5, 10, m, 2), PayloadLayout::kCompact);
  auto bad = DetectPayloadLayout(10, 10, m, 2);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("10 + 2 = 12"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("3 + 2 = 5"));

  EXPECT_EQ(*PayloadLayerIndex(PayloadLayout::kFull, 10, m, 11, 2), 11);
  EXPECT_EQ(*PayloadLayerIndex(PayloadLayout::kCompact, 10, m, 10, 2), 3);
  EXPECT_EQ(*PayloadLayerIndex(PayloadLayout::kCompact, 10, m, 11, 2), 4);
  EXPECT_EQ(*PayloadLayerIndex(PayloadLayout::kCompact, 10, m, 7, 2), 2);
  EXPECT_FALSE(PayloadLayerIndex(PayloadLayout::kFull, 10, m, 12, 2).ok());
  // Without routed MTP layers, layer N has no payload entry.
  EXPECT_FALSE(PayloadLayerIndex(PayloadLayout::kFull, 10, m, 10).ok());
}

}  // namespace
}  // namespace rollpack
