// MTP layers end to end (layout.md section 10), in-process server over
// 127.0.0.1: samples carrying MTP routing in every accepted form are put,
// steps are created on pp = 1, pp = 2 (with F/Z) and interleaved topologies,
// and every rank's micro-batches are checked byte for byte against the
// independent reference layout; a hand-built sample checks that the last
// stage's MTP entries are the producer's rows.
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "client/cpp/trainer_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/in_process_server.h"
#include "testing/ndarrays.h"
#include "testing/reference_layout.h"
#include "testing/synthetic_rollouts.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// N = 8 decoder layers, MoE layers 2..7, D = 2 MTP layers (8, 9).
v1::ModelSpec MtpModel(int num_experts, bool mtp_routing) {
  v1::ModelSpec m;
  m.set_name("mtp-like");
  m.set_num_layers(8);
  for (int l = 2; l < 8; ++l) m.add_moe_layers(l);
  m.set_num_experts(num_experts);
  m.set_topk(4);
  m.set_num_mtp_layers(2);
  m.set_mtp_routing(mtp_routing);
  return m;
}

v1::RankCoords Rank(int dp, int cp, int tp, int pp) {
  v1::RankCoords r;
  r.set_dp(dp);
  r.set_cp(cp);
  r.set_tp(tp);
  r.set_pp(pp);
  return r;
}

class MtpTest : public InProcessServerTest {
 protected:
  std::vector<v1::Sample> Push(const std::string& pool, const v1::ModelSpec& model, int num,
                               uint64_t seed) {
    absl::StatusOr<bool> registered = client_->RegisterModel(pool, model);
    EXPECT_TRUE(registered.ok()) << registered.status();
    SyntheticOptions options;
    options.num_samples = num;
    options.median_length = 300;
    options.max_length = 2048;
    options.seed = seed;
    std::vector<v1::Sample> samples = MakeSyntheticRollouts(model, options);
    absl::StatusOr<v1::PutSamplesResponse> put = client_->PutSamples(pool, samples);
    EXPECT_TRUE(put.ok()) << put.status();
    return samples;
  }

  absl::StatusOr<v1::StepInfo> Create(const std::string& pool, const std::string& step,
                                      int num, const v1::Topology& t) {
    v1::CreateStepRequest create;
    create.set_step_id(step);
    create.set_pool(pool);
    create.set_num_samples(num);
    *create.mutable_topology() = t;
    return client_->CreateStep(create);
  }

  // Every rank of the step, concurrently, against the reference; returns
  // how many micro-batches the last stage got whose replay ended with
  // layers 8 and 9.
  int FetchAndVerifyAllRanks(const std::string& step_id, const v1::ModelSpec& model,
                             const std::vector<v1::Sample>& samples) {
    absl::StatusOr<v1::Plan> plan = client_->GetPlan(step_id);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return 0;
    const v1::Topology& t = plan->topology();
    std::map<std::string, const v1::Sample*> by_id;
    for (const v1::Sample& s : samples) by_id[s.sample_id()] = &s;
    std::vector<v1::RankCoords> ranks;
    for (int d = 0; d < t.dp(); ++d)
      for (int c = 0; c < t.cp(); ++c)
        for (int tp = 0; tp < t.tp(); ++tp)
          for (int p = 0; p < t.pp(); ++p) ranks.push_back(Rank(d, c, tp, p));
    std::vector<absl::Status> results(ranks.size());
    std::vector<int> counts(ranks.size(), 0), mtp_seen(ranks.size(), 0);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i) {
      threads.emplace_back([&, i] {
        TrainerStream stream(channel_, step_id, ranks[i]);
        while (true) {
          absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
          if (!next.ok()) {
            results[i] = next.status();
            return;
          }
          if (!next->has_value()) return;
          const v1::Microbatch& mb = **next;
          absl::StatusOr<ExpectedMicrobatch> want =
              ReferenceMicrobatch(*plan, model, by_id, ranks[i], mb.index());
          absl::Status s = want.ok() ? CheckMicrobatch(mb, *want, t, ranks[i], model, false)
                                     : want.status();
          if (!s.ok() && results[i].ok()) results[i] = s;
          const int n = mb.replay_layers_size();
          if (n >= 2 && mb.replay_layers(n - 2) == 8 && mb.replay_layers(n - 1) == 9) {
            ++mtp_seen[i];
          }
          ++counts[i];
        }
      });
    }
    for (std::thread& th : threads) th.join();
    int last_stage_mtp = 0;
    for (size_t i = 0; i < ranks.size(); ++i) {
      EXPECT_TRUE(results[i].ok()) << results[i];
      EXPECT_EQ(counts[i], plan->microbatches_size());
      if (ranks[i].pp() == t.pp() - 1) {
        last_stage_mtp += mtp_seen[i];
      } else {
        EXPECT_EQ(mtp_seen[i], 0) << "MTP layers on a stage before the last";
      }
    }
    return last_stage_mtp;
  }
};

TEST_F(MtpTest, LastStageReceivesMtpLayersOnEveryTopology) {
  const v1::ModelSpec model = MtpModel(64, true);
  struct Case {
    const char* name;
    int dp, cp, tp, pp, vpp, first, last;
    bool dynamic;
  };
  const Case cases[] = {
      {"pp1", 2, 2, 2, 1, 1, 0, 0, false},
      {"pp2", 2, 2, 2, 2, 1, 0, 0, false},
      {"pp2-fz", 1, 2, 2, 2, 1, 3, 5, false},
      {"vpp", 2, 1, 2, 2, 2, 0, 0, true},
  };
  uint64_t seed = 11;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string pool = absl::StrCat("pool-", c.name);
    const std::vector<v1::Sample> samples = Push(pool, model, 32, seed++);
    v1::Topology t;
    t.set_dp(c.dp);
    t.set_cp(c.cp);
    t.set_tp(c.tp);
    t.set_pp(c.pp);
    t.set_vpp(c.vpp);
    t.set_num_layers_in_first_pipeline_stage(c.first);
    t.set_num_layers_in_last_pipeline_stage(c.last);
    t.set_max_tokens_per_rank(2048);
    if (c.dynamic) t.set_scheduler(v1::DYNAMIC_CP);
    absl::StatusOr<v1::StepInfo> step = Create(pool, c.name, 32, t);
    ASSERT_TRUE(step.ok()) << step.status();
    const v1::PipelineStageLayers& last = step->stage_layers(c.pp - 1);
    ASSERT_GE(last.replay_layers_size(), 2);
    EXPECT_EQ(last.replay_layers(last.replay_layers_size() - 2), 8);
    EXPECT_EQ(last.replay_layers(last.replay_layers_size() - 1), 9);
    for (int l : last.layers()) EXPECT_LT(l, 8) << "stage layers stay decoder layers";
    if (std::string(c.name) == "pp2") {
      EXPECT_THAT(step->stage_layers(0).replay_layers(), ElementsAre(2, 3));
      EXPECT_THAT(last.replay_layers(), ElementsAre(4, 5, 6, 7, 8, 9));
    }
    const int mtp_microbatches = FetchAndVerifyAllRanks(c.name, model, samples);
    EXPECT_EQ(mtp_microbatches, step->num_microbatches() * c.dp * c.cp * c.tp);
  }
}

TEST_F(MtpTest, WideIdsAndLiveMtpRouters) {
  // uint16 ids (E > 256) with MTP routing.
  const v1::ModelSpec wide = MtpModel(300, true);
  const std::vector<v1::Sample> samples = Push("wide", wide, 24, 5);
  v1::Topology t;
  t.set_dp(2);
  t.set_tp(2);
  t.set_pp(2);
  t.set_max_tokens_per_rank(2048);
  ASSERT_TRUE(Create("wide", "wide", 24, t).ok());
  EXPECT_GT(FetchAndVerifyAllRanks("wide", wide, samples), 0);

  // Without mtp_routing the MTP routers stay live: nothing about them is
  // delivered, and MTP routing sent anyway is refused naming the fix.
  const v1::ModelSpec live = MtpModel(64, false);
  const std::vector<v1::Sample> plain = Push("live", live, 24, 6);
  absl::StatusOr<v1::StepInfo> step = Create("live", "live", 24, t);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT(step->stage_layers(1).replay_layers(), ElementsAre(4, 5, 6, 7));
  EXPECT_EQ(FetchAndVerifyAllRanks("live", live, plain), 0);
  SyntheticOptions options;
  options.num_samples = 1;
  options.seed = 9;
  std::vector<v1::Sample> with_mtp = MakeSyntheticRollouts(MtpModel(64, true), options);
  with_mtp[0].set_sample_id("with-mtp");
  absl::StatusOr<v1::PutSamplesResponse> put = client_->PutSamples("live", with_mtp);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(put.status().message(), HasSubstr("mtp_routing"));
}

TEST_F(MtpTest, MtpRowsAreTheProducersRows) {
  // One sample of n = 6 tokens, a full int32 payload [5, 10, 4] (the engine's
  // n - 1 rows), on a single rank per stage with pp = 2: the last stage's
  // replay is its decoder layers 4..7, then MTP layers 8, 9, row for row.
  const v1::ModelSpec model = MtpModel(64, true);
  ASSERT_TRUE(client_->RegisterModel("hand", model).ok());
  const int64_t n = 6, rows = 5, layers = 10, k = 4;
  auto id = [](int64_t r, int64_t l, int64_t j) {
    return static_cast<int32_t>((r * 7 + l * 11 + j * 16) % 64);
  };
  std::vector<int32_t> tokens = {11, 12, 13, 14, 15, 16};
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t l = 0; l < layers; ++l)
      for (int64_t j = 0; j < k; ++j) ids.push_back(id(r, l, j));
  v1::Sample s;
  s.set_sample_id("hand-0");
  *s.mutable_tokens() = TestArray(v1::INT32, {n}, tokens);
  *s.mutable_routed_experts() = TestArray(v1::INT32, {rows, layers, k}, ids);
  ASSERT_TRUE(client_->PutSamples("hand", {s}).ok());
  v1::Topology t;
  t.set_pp(2);
  t.set_max_tokens_per_rank(64);
  ASSERT_TRUE(Create("hand", "hand", 1, t).ok());
  TrainerStream stream(channel_, "hand", Rank(0, 0, 0, 1));
  absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
  ASSERT_TRUE(next.ok() && next->has_value()) << next.status();
  const v1::Microbatch& mb = **next;
  EXPECT_THAT(mb.replay_layers(), ElementsAre(4, 5, 6, 7, 8, 9));
  const v1::NDArray& re = mb.replay_experts();
  ASSERT_EQ(re.dtype(), v1::UINT8);
  ASSERT_THAT(re.shape(), ElementsAre(n, 6, k));
  for (int64_t r = 0; r < n; ++r) {
    for (int li = 0; li < 6; ++li) {
      for (int64_t j = 0; j < k; ++j) {
        const int got = static_cast<uint8_t>(re.data()[(r * 6 + li) * k + j]);
        // The last token has no row: the filler (q*K + j) mod E.
        const int want = r < rows ? id(r, mb.replay_layers(li), j)
                                  : static_cast<int>((r * k + j) % 64);
        ASSERT_EQ(got, want) << "row " << r << " layer " << mb.replay_layers(li) << " j " << j;
      }
    }
  }
  EXPECT_EQ(mb.replay_mask().data(), std::string("\1\1\1\1\1\0", 6));
  // The first stage gets no MTP layer.
  TrainerStream first(channel_, "hand", Rank(0, 0, 0, 0));
  absl::StatusOr<std::optional<v1::Microbatch>> mb0 = first.Next();
  ASSERT_TRUE(mb0.ok() && mb0->has_value()) << mb0.status();
  EXPECT_THAT((*mb0)->replay_layers(), ElementsAre(2, 3));
}

}  // namespace
}  // namespace rollpack
