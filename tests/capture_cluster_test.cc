// The capture port in cluster mode (shared/spec/capture.md section 1): each
// member's capture port stores into that member, like PutSamples on it; a
// step planned over the cluster delivers the captured bytes to trainer
// ranks from whichever member holds them. Real processes: an etcd, two
// rollpackd members, a stand-in vLLM server in front of each.
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "rollpack/v1/cluster_admin.grpc.pb.h"
#include "testing/cluster_fixture.h"
#include "testing/rank_fetch.h"
#include "testing/reference_layout.h"
#include "testing/standin_engine.h"
#include "testing/standin_outputs.h"

namespace rollpack {
namespace {

class CaptureClusterTest : public ClusterFixture {
 protected:
  // Member `i` with a stand-in vLLM server behind its capture port; the pool
  // registered with `pool_options` (protobuf JSON) when given.
  void StartCapturingMember(size_t i, const std::string& pool_options = "") {
    absl::StatusOr<std::unique_ptr<StandinEngine>> engine = StandinEngine::Start(
        "/usr/bin/python3", STANDIN_ENGINE_PATH,
        {"--engine", "vllm", "--num-layers", "4", "--num-experts", "16", "--topk", "2"});
    ASSERT_TRUE(engine.ok()) << engine.status();
    const std::string model = absl::StrCat(dir_, "/model.json");
    std::ofstream(model) << R"({"name": "moe", "numLayers": 4, "numExperts": 16, "topk": 2})";
    const std::string port_file = absl::StrCat(dir_, "/capture", i);
    member_args_ = {"--capture-listen=127.0.0.1:0", "--capture-upstream=" + (*engine)->url(),
                    "--capture-engine=vllm", "--capture-pool=pool",
                    "--capture-model=" + model, "--capture-port-file=" + port_file};
    if (!pool_options.empty()) {
      const std::string options_file = absl::StrCat(dir_, "/pool_options", i, ".json");
      std::ofstream(options_file) << pool_options;
      member_args_.push_back("--capture-pool-options=" + options_file);
    }
    engines_.push_back(*std::move(engine));
    StartMember(i);
    int port = 0;
    std::ifstream(port_file) >> port;
    ASSERT_GT(port, 0);
    capture_ports_.push_back(port);
  }

  std::vector<std::unique_ptr<StandinEngine>> engines_;
  std::vector<int> capture_ports_;
};

TEST_F(CaptureClusterTest, EachMemberStoresWhatItsEngineGeneratedAndAStepDeliversIt) {
  StartCapturingMember(0);
  StartCapturingMember(1);
  const StandinModel model{4, 16, 2, 32000, 1};
  std::map<std::string, v1::Sample> expected;
  for (int m = 0; m < 2; ++m) {
    httplib::Client http("127.0.0.1", capture_ports_[m]);
    const std::vector<int32_t> prompt = {10 + m, 20, 30, 40};
    httplib::Result r = http.Post(
        "/v1/completions", {{"X-Rollpack-Sample-Id", absl::StrCat("m", m)}},
        absl::StrCat(R"({"model": "standin-moe", "max_tokens": 5, "n": 2, "prompt": [)",
                     prompt[0], ", 20, 30, 40]}"),
        "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    ASSERT_EQ(r->get_header_value("X-Rollpack-Capture"), "stored");
    for (int i = 0; i < 2; ++i) {
      const std::string id = absl::StrCat("m", m, "#", i);
      expected[id] = StandinChoiceSample(id, prompt, i, 5, model);
    }
  }
  // Samples stay where they were produced: two on each member.
  absl::StatusOr<v1::PoolInfo> pool = Client(0).GetPool("pool");
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->num_samples(), 4);
  ASSERT_EQ(pool->members_size(), 2);
  for (const v1::MemberPoolInfo& member : pool->members()) {
    EXPECT_EQ(member.num_samples(), 2) << member.member();
  }

  // One step over both members' samples, planned and fetched through member 0.
  v1::CreateStepRequest create;
  create.set_step_id("captured");
  create.set_pool("pool");
  create.set_num_samples(4);
  create.mutable_topology()->set_dp(1);
  create.mutable_topology()->set_max_tokens_per_rank(4096);
  RollpackClient client = Client(0);
  ASSERT_TRUE(client.CreateStep(create).ok());
  absl::StatusOr<v1::Plan> plan = client.GetPlan("captured");
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::map<std::string, const v1::Sample*> by_id;
  for (const auto& [id, sample] : expected) by_id[id] = &sample;
  absl::StatusOr<std::vector<v1::Microbatch>> mbs =
      FetchRankMicrobatches(members_[0]->address(), "captured", v1::RankCoords());
  ASSERT_TRUE(mbs.ok()) << mbs.status();
  ASSERT_EQ(static_cast<int>(mbs->size()), plan->microbatches_size());
  v1::ModelSpec spec = ClusterModel();
  for (const v1::Microbatch& mb : *mbs) {
    absl::StatusOr<ExpectedMicrobatch> want =
        ReferenceMicrobatch(*plan, spec, by_id, v1::RankCoords(), mb.index());
    ASSERT_TRUE(want.ok()) << want.status();
    absl::Status check =
        CheckMicrobatch(mb, *want, plan->topology(), v1::RankCoords(), spec, true);
    EXPECT_TRUE(check.ok()) << check;
  }
}

// Rewards that exist only after the response (capture.md section 6a): a
// pool with required_scalars takes a captured rollout only once its reward
// is set, any member's capture port annotates any member's samples, all or
// nothing, and every rank gets each sequence's reward, group and advantage.
TEST_F(CaptureClusterTest, RewardsGivenLaterThroughAnyMembersPortGateSelectionAndReachTheRanks) {
  const std::string options = R"({"requiredScalars": ["reward"]})";
  StartCapturingMember(0, options);
  StartCapturingMember(1, options);
  for (int m = 0; m < 2; ++m) {
    httplib::Client http("127.0.0.1", capture_ports_[m]);
    httplib::Result r = http.Post(
        "/v1/completions", {{"X-Rollpack-Sample-Id", absl::StrCat("m", m)}},
        R"({"model": "standin-moe", "max_tokens": 4, "n": 2, "prompt": [5, 6, 7]})",
        "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
  }
  absl::StatusOr<v1::PoolInfo> pool = Client(0).GetPool("pool");
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->num_free_samples(), 4);
  EXPECT_EQ(pool->num_unannotated_samples(), 4);
  v1::CreateStepRequest create;
  create.set_step_id("graded");
  create.set_pool("pool");
  create.set_num_groups(1);
  create.mutable_topology()->set_dp(1);
  create.mutable_topology()->set_max_tokens_per_rank(4096);
  create.set_advantage(v1::ADVANTAGE_GRPO);
  EXPECT_EQ(Client(0).CreateStep(create).status().code(), absl::StatusCode::kFailedPrecondition)
      << "a group was taken before its rewards were set";

  auto annotate = [&](const std::string& annotations) {
    httplib::Client http("127.0.0.1", capture_ports_[1]);
    return http.Post("/rollpack/v1/annotate", absl::StrCat(R"({"annotations": )", annotations, "}"),
                     "application/json");
  };
  const std::string rewards =
      R"([{"sample_id": "m0#0", "scalars": {"reward": 1}},
          {"sample_id": "m0#1", "scalars": {"reward": 0}},
          {"sample_id": "m1#0", "scalars": {"reward": 0.5}},
          {"sample_id": "m1#1", "scalars": {"reward": 0.5}}])";
  // Refusals change nothing, on either member: m1#1 gets no "len" from a
  // request that also gives m0#0 another reward.
  httplib::Result r = annotate(R"([{"sample_id": "m1#1", "scalars": {"len": 3}},
                                   {"sample_id": "nobody", "scalars": {"reward": 1}}])");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404) << r->body;
  EXPECT_THAT(r->body, ::testing::HasSubstr("nobody"));
  r = annotate(R"([{"sample_id": "m0#0", "scalars": {"reward": "high"}}])");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  r = annotate(rewards);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->body, R"({"annotated": 4})");
  r = annotate(rewards);  // a retry is a no-op
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  r = annotate(R"([{"sample_id": "m1#1", "scalars": {"len": 3}},
                   {"sample_id": "m0#0", "scalars": {"reward": 0}}])");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 409) << r->body;
  EXPECT_THAT(r->body, ::testing::HasSubstr("m0#0"));
  // Had either refused request touched m1#1, "len" = 4 would now be refused.
  r = annotate(R"([{"sample_id": "m1#1", "scalars": {"len": 4}}])");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  pool = Client(1).GetPool("pool");
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->num_unannotated_samples(), 0);

  create.set_num_groups(2);
  ASSERT_TRUE(Client(0).CreateStep(create).ok());
  absl::StatusOr<std::vector<v1::Microbatch>> mbs =
      FetchRankMicrobatches(members_[1]->address(), "graded", v1::RankCoords());
  ASSERT_TRUE(mbs.ok()) << mbs.status();
  // GRPO over each group of the step, population std, eps 1e-6.
  const std::map<std::string, double> reward = {
      {"m0#0", 1}, {"m0#1", 0}, {"m1#0", 0.5}, {"m1#1", 0.5}};
  const std::map<std::string, float> advantage = {{"m0#0", static_cast<float>(0.5 / (0.5 + 1e-6))},
                                                  {"m0#1", static_cast<float>(-0.5 / (0.5 + 1e-6))},
                                                  {"m1#0", 0.0f},
                                                  {"m1#1", 0.0f}};
  int seen = 0;
  for (const v1::Microbatch& mb : *mbs) {
    const int n = mb.sample_ids_size();
    ASSERT_EQ(mb.group_ids_size(), n);
    ASSERT_EQ(mb.advantages().dtype(), v1::FLOAT32);
    ASSERT_EQ(mb.advantages().data().size(), sizeof(float) * n);
    ASSERT_EQ(mb.scalars().count("reward"), 1u);
    EXPECT_EQ(mb.scalars().count("len"), 0u) << "a scalar some samples lack is left out";
    const v1::NDArray& rewards_array = mb.scalars().at("reward");
    ASSERT_EQ(rewards_array.dtype(), v1::FLOAT64);
    ASSERT_EQ(rewards_array.data().size(), sizeof(double) * n);
    for (int j = 0; j < n; ++j) {
      const std::string& id = mb.sample_ids(j);
      float a;
      double r_value;
      std::memcpy(&a, mb.advantages().data().data() + sizeof(float) * j, sizeof(float));
      std::memcpy(&r_value, rewards_array.data().data() + sizeof(double) * j, sizeof(double));
      EXPECT_EQ(mb.group_ids(j), id.substr(0, 2)) << id;
      EXPECT_EQ(r_value, reward.at(id)) << id;
      EXPECT_EQ(a, advantage.at(id)) << id;
      ++seen;
    }
  }
  EXPECT_EQ(seen, 4);
}

// A drained member (docs/cluster.md, "Maintenance: draining a member"):
// its capture port answers 503 before asking the engine, so that the
// client goes to another member's; undrained, it captures again.
TEST_F(CaptureClusterTest, ADrainedMembersPortRefusesGenerationsUntilUndrained) {
  StartCapturingMember(0);
  StartCapturingMember(1);
  auto admin = v1::ClusterAdmin::NewStub(MakeChannel(members_[0]->address()));
  auto set_drained = [&](bool drained) {
    v1::DrainMemberRequest request;
    request.set_member(members_[1]->address());
    v1::DrainMemberResponse response;
    grpc::ClientContext context;
    grpc::Status s = drained ? admin->DrainMember(&context, request, &response)
                             : admin->UndrainMember(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
  };
  auto generate = [&](int m, const std::string& id) {
    httplib::Client http("127.0.0.1", capture_ports_[m]);
    return http.Post("/v1/completions", {{"X-Rollpack-Sample-Id", id}},
                     R"({"model": "standin-moe", "max_tokens": 5, "prompt": [1, 2, 3]})",
                     "application/json");
  };
  set_drained(true);
  httplib::Result refused = generate(1, "b0");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503) << refused->body;
  EXPECT_THAT(refused->body, ::testing::HasSubstr("rollpack_drained"));
  const std::string reason = "member " + members_[1]->address() + " is drained for maintenance";
  EXPECT_THAT(refused->body, ::testing::HasSubstr(reason));
  httplib::Result stored = generate(0, "a0");
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->status, 200) << stored->body;
  set_drained(false);
  stored = generate(1, "b1");
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->status, 200) << stored->body;
  EXPECT_EQ(stored->get_header_value("X-Rollpack-Capture"), "stored");
  absl::StatusOr<v1::PoolInfo> pool = Client(1).GetPool("pool");
  ASSERT_TRUE(pool.ok()) << pool.status();
  ASSERT_EQ(pool->members_size(), 2);
  for (const v1::MemberPoolInfo& member : pool->members()) {
    EXPECT_EQ(member.num_samples(), 1) << member.member();  // a0 and b1, never b0
  }
}

}  // namespace
}  // namespace rollpack
