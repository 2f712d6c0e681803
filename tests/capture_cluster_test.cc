// The capture port in cluster mode (shared/spec/capture.md section 1): each
// member's capture port stores into that member, like PutSamples on it; a
// step planned over the cluster delivers the captured bytes to trainer
// ranks from whichever member holds them. Real processes: an etcd, two
// rollpackd members, a stand-in vLLM server in front of each.
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "testing/cluster_fixture.h"
#include "testing/rank_fetch.h"
#include "testing/reference_layout.h"
#include "testing/standin_engine.h"
#include "testing/standin_outputs.h"

namespace rollpack {
namespace {

class CaptureClusterTest : public ClusterFixture {
 protected:
  // Member `i` with a stand-in vLLM server behind its capture port.
  void StartCapturingMember(size_t i) {
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

}  // namespace
}  // namespace rollpack
