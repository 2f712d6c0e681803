// In-process server over 127.0.0.1 (ephemeral port): the whole life of a
// step through the public gRPC API, checked byte for byte against the
// independent reference layout.
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/cpp/client.h"
#include "testing/reference_layout.h"
#include "testing/synthetic_rollouts.h"
#include "client/cpp/trainer_stream.h"
#include "gmock/gmock.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "proto/wire/deterministic_bytes.h"
#include "server/server.h"
#include "testing/in_process_server.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

class ServerTest : public InProcessServerTest {
 protected:
  // Registers `model`, pushes `num` synthetic samples, returns them.
  std::vector<v1::Sample> Push(const std::string& pool, const v1::ModelSpec& model, int num,
                               int64_t max_length, uint64_t seed = 1) {
    EXPECT_TRUE(client_->RegisterModel(pool, model).ok());
    SyntheticOptions options;
    options.num_samples = num;
    options.median_length = static_cast<double>(max_length) / 6;
    options.max_length = max_length;
    options.seed = seed;
    std::vector<v1::Sample> samples = MakeSyntheticRollouts(model, options);
    absl::StatusOr<v1::PutSamplesResponse> put = client_->PutSamples(pool, samples);
    EXPECT_TRUE(put.ok()) << put.status();
    return samples;
  }

  // Fetches every rank of the topology concurrently and checks each
  // micro-batch against the reference.
  void FetchAndVerifyAllRanks(const std::string& step_id, const v1::ModelSpec& model,
                              const std::vector<v1::Sample>& samples) {
    absl::StatusOr<v1::Plan> plan = client_->GetPlan(step_id);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const v1::Topology& t = plan->topology();
    std::map<std::string, const v1::Sample*> by_id;
    for (const v1::Sample& s : samples) by_id[s.sample_id()] = &s;
    std::vector<v1::RankCoords> ranks;
    for (int d = 0; d < t.dp(); ++d)
      for (int c = 0; c < t.cp(); ++c)
        for (int tp = 0; tp < t.tp(); ++tp)
          for (int p = 0; p < t.pp(); ++p) {
            v1::RankCoords r;
            r.set_dp(d);
            r.set_cp(c);
            r.set_tp(tp);
            r.set_pp(p);
            ranks.push_back(r);
          }
    std::vector<absl::Status> results(ranks.size());
    std::vector<int> counts(ranks.size(), 0);
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
          absl::StatusOr<ExpectedMicrobatch> want =
              ReferenceMicrobatch(*plan, model, by_id, ranks[i], (*next)->index());
          absl::Status s = want.ok() ? CheckMicrobatch(**next, *want, t, ranks[i], model, false)
                                     : want.status();
          if (!s.ok() && results[i].ok()) results[i] = s;
          ++counts[i];
        }
      });
    }
    for (std::thread& th : threads) th.join();
    for (size_t i = 0; i < ranks.size(); ++i) {
      EXPECT_TRUE(results[i].ok()) << results[i];
      EXPECT_EQ(counts[i], plan->microbatches_size());
    }
  }
};

v1::ModelSpec DeepSeekLike() {
  v1::ModelSpec m;
  m.set_name("deepseek-like");
  m.set_num_layers(8);
  for (int l = 2; l < 8; ++l) m.add_moe_layers(l);
  m.set_num_experts(300);  // > 256: uint16 on the wire
  m.set_topk(6);
  return m;
}

v1::ModelSpec QwenLike() {
  v1::ModelSpec m;
  m.set_name("qwen-like");
  m.set_num_layers(8);
  m.set_num_experts(64);
  m.set_topk(4);
  return m;
}

TEST_F(ServerTest, RegisterPutCreateFetchRelease) {
  const v1::ModelSpec model = QwenLike();
  std::vector<v1::Sample> samples = Push("pool", model, 40, 2048);
  absl::StatusOr<v1::PoolInfo> pool = client_->GetPool("pool");
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->num_samples(), 40);
  EXPECT_EQ(pool->token_field_dtypes().at("logprobs"), v1::FLOAT32);

  v1::CreateStepRequest create;
  create.set_step_id("step-1");
  create.set_pool("pool");
  create.set_num_samples(40);
  v1::Topology* t = create.mutable_topology();
  t->set_dp(2);
  t->set_cp(2);
  t->set_tp(2);
  t->set_pp(2);
  t->set_max_tokens_per_rank(2048);
  absl::StatusOr<v1::StepInfo> step = client_->CreateStep(create);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_GE(step->num_microbatches(), step->stats().min_microbatches());
  EXPECT_LE(step->stats().peak(), 1.0);
  ASSERT_EQ(step->stage_layers_size(), 2);
  EXPECT_THAT(step->stage_layers(1).replay_layers(), ::testing::ElementsAre(4, 5, 6, 7));
  FetchAndVerifyAllRanks("step-1", model, samples);

  absl::StatusOr<v1::ReleaseStepResponse> released = client_->ReleaseStep("step-1");
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(released->released_samples(), 40);
  EXPECT_EQ(client_->GetPool("pool")->num_samples(), 0);
  EXPECT_EQ(client_->GetPlan("step-1").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ServerTest, SixtyFourRanksConcurrentlyWithDenseLayersAndWideIds) {
  const v1::ModelSpec model = DeepSeekLike();
  std::vector<v1::Sample> samples = Push("ds", model, 96, 4096);
  v1::CreateStepRequest create;
  create.set_step_id("wide");
  create.set_pool("ds");
  create.set_num_samples(96);
  v1::Topology* t = create.mutable_topology();
  t->set_dp(4);
  t->set_cp(2);
  t->set_tp(2);
  t->set_pp(4);
  t->set_num_layers_in_first_pipeline_stage(1);
  t->set_num_layers_in_last_pipeline_stage(1);
  t->set_max_tokens_per_rank(4096);
  t->set_pad_multiple(16);
  absl::StatusOr<v1::StepInfo> step = client_->CreateStep(create);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT(step->stage_layers(0).replay_layers(), ::testing::ElementsAre());
  FetchAndVerifyAllRanks("wide", model, samples);
}

TEST_F(ServerTest, DynamicCpAndInterleavedPipeline) {
  const v1::ModelSpec model = QwenLike();
  std::vector<v1::Sample> samples = Push("dyn", model, 64, 4096, 7);
  v1::CreateStepRequest create;
  create.set_step_id("dyn");
  create.set_pool("dyn");
  create.set_num_samples(64);
  v1::Topology* t = create.mutable_topology();
  t->set_dp(4);
  t->set_cp(1);
  t->set_tp(2);
  t->set_pp(2);
  t->set_vpp(2);
  t->set_scheduler(v1::DYNAMIC_CP);
  t->set_max_tokens_per_rank(1024);
  absl::StatusOr<v1::StepInfo> step = client_->CreateStep(create);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->num_microbatches() % 2, 0) << "a multiple of pp with vpp";
  EXPECT_THAT(step->stage_layers(0).replay_layers(), ::testing::ElementsAre(0, 1, 4, 5));
  FetchAndVerifyAllRanks("dyn", model, samples);
}

TEST_F(ServerTest, ResumedStreamIsByteIdentical) {
  const v1::ModelSpec model = QwenLike();
  Push("r", model, 48, 2048);
  v1::CreateStepRequest create;
  create.set_step_id("r");
  create.set_pool("r");
  create.set_num_samples(48);
  create.mutable_topology()->set_dp(2);
  create.mutable_topology()->set_max_tokens_per_rank(2048);
  absl::StatusOr<v1::StepInfo> step = client_->CreateStep(create);
  ASSERT_TRUE(step.ok()) << step.status();
  v1::RankCoords rank;
  rank.set_dp(1);
  std::vector<std::string> first;
  {
    TrainerStream stream(channel_, "r", rank);
    while (true) {
      auto next = stream.Next();
      ASSERT_TRUE(next.ok());
      if (!next->has_value()) break;
      first.push_back(DeterministicBytes(**next));
    }
  }
  ASSERT_GE(first.size(), 3u);
  const int k = 2;
  std::vector<std::string> resumed;
  {
    // A stream cut after k micro-batches: the consumer destroys it.
    TrainerStream cut(channel_, "r", rank, {.prefetch = 1});
    for (int i = 0; i < k; ++i) resumed.push_back(DeterministicBytes(**cut.Next()));
  }
  TrainerStreamOptions options;
  options.start_index = k;
  TrainerStream rest(channel_, "r", rank, options);
  while (true) {
    auto next = rest.Next();
    ASSERT_TRUE(next.ok());
    if (!next->has_value()) break;
    resumed.push_back(DeterministicBytes(**next));
  }
  ASSERT_EQ(resumed.size(), first.size());
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_TRUE(resumed[i] == first[i]) << "micro-batch " << i << " differs after resuming";
  }
}

TEST_F(ServerTest, FetchErrors) {
  const v1::ModelSpec model = QwenLike();
  Push("e", model, 8, 512);
  v1::CreateStepRequest create;
  create.set_step_id("e");
  create.set_pool("e");
  create.set_num_samples(8);
  create.mutable_topology()->set_max_tokens_per_rank(4096);
  ASSERT_TRUE(client_->CreateStep(create).ok());
  auto first_error = [&](const std::string& step, int dp, int start) {
    v1::RankCoords rank;
    rank.set_dp(dp);
    TrainerStreamOptions options;
    options.start_index = start;
    TrainerStream stream(channel_, step, rank, options);
    while (true) {
      auto next = stream.Next();
      if (!next.ok()) return next.status();
      if (!next->has_value()) return absl::OkStatus();
    }
  };
  absl::Status s = first_error("missing", 0, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("step \"missing\""));
  s = first_error("e", 3, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dp"));
  s = first_error("e", 0, 99);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
}

TEST_F(ServerTest, BadSampleEndsStreamNamingItAndKeepsEarlierMessages) {
  const v1::ModelSpec model = QwenLike();
  ASSERT_TRUE(client_->RegisterModel("b", model).ok());
  SyntheticOptions options;
  options.num_samples = 3;
  options.max_length = 64;
  std::vector<v1::Sample> samples = MakeSyntheticRollouts(model, options);
  ASSERT_TRUE(client_->PutSamples("b", {samples[0]}).ok());
  samples[2].mutable_routed_experts()->mutable_data()->pop_back();
  absl::StatusOr<v1::PutSamplesResponse> put = client_->PutSamples("b", {samples[1], samples[2]});
  EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(put.status().message(), HasSubstr("sample \"rollout-2\": routed_experts"));
  EXPECT_EQ(client_->GetPool("b")->num_samples(), 1) << "the refused message stores nothing";
  EXPECT_EQ(client_->PutSamples("nope", {samples[0]}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ServerTest, TopologyErrorsAreInvalidArgument) {
  Push("t", QwenLike(), 8, 512);
  v1::CreateStepRequest create;
  create.set_step_id("t");
  create.set_pool("t");
  create.set_num_samples(8);
  create.mutable_topology()->set_pp(3);  // 8 layers over 3 stages
  create.mutable_topology()->set_max_tokens_per_rank(4096);
  absl::StatusOr<v1::StepInfo> step = client_->CreateStep(create);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(step.status().message(), HasSubstr("8"));
  create.mutable_topology()->set_pp(1);
  create.mutable_topology()->set_dp(-1);
  EXPECT_EQ(client_->CreateStep(create).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->GetPool("t")->num_free_samples(), 8) << "refused steps take no samples";
}

}  // namespace
}  // namespace rollpack
