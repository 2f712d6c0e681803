// Rollouts.ListSamples and Rollouts.DeletePool over a cluster of real
// processes (docs/cluster.md, "Deleting and listing a pool"): every member's
// samples listed with their owners through any member, a deletion refused
// while a step lives, then gone from every member, from etcd and from
// /metrics, kept gone through a member's restart from its log, the name
// registered again with another model; a member away stops the deletion
// before anything changes, and force releases the steps.
#include <signal.h>

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "rollpack/v1/rollouts.grpc.pb.h"
#include "testing/cluster_fixture.h"
#include "testing/exposition.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

class ClusterPoolsTest : public ClusterFixture {
 protected:
  ClusterPoolsTest() { durable_ = true; }

  std::unique_ptr<v1::Rollouts::Stub> Stub(size_t via) {
    return v1::Rollouts::NewStub(MakeChannel(members_[via]->address()));
  }

  grpc::Status Delete(size_t via, bool force, v1::DeletePoolResponse* response,
                      bool dry_run = false, const std::string& pool = "pool") {
    v1::DeletePoolRequest request;
    request.set_pool(pool);
    request.set_force(force);
    request.set_dry_run(dry_run);
    grpc::ClientContext context;
    return Stub(via)->DeletePool(&context, request, response);
  }

  grpc::Status Page(size_t via, v1::ListSamplesRequest request, v1::ListSamplesResponse* out) {
    grpc::ClientContext context;
    return Stub(via)->ListSamples(&context, request, out);
  }

  // Every page of the pool's samples through member `via`.
  std::vector<v1::SampleInfo> ListAll(size_t via, int page_size,
                                      v1::SampleState state = v1::SAMPLE_STATE_UNSPECIFIED) {
    v1::ListSamplesRequest request;
    request.set_pool("pool");
    request.set_page_size(page_size);
    request.set_state(state);
    std::vector<v1::SampleInfo> all;
    for (int pages = 0; pages < 100; ++pages) {
      v1::ListSamplesResponse response;
      grpc::Status s = Page(via, request, &response);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (!s.ok()) break;
      EXPECT_LE(response.samples_size(), page_size);
      all.insert(all.end(), response.samples().begin(), response.samples().end());
      if (response.next_page_token().empty()) break;
      request.set_page_token(response.next_page_token());
    }
    return all;
  }

  v1::StepInfo CreateStep(size_t via, const std::string& step_id, int num_samples) {
    v1::CreateStepRequest request;
    request.set_step_id(step_id);
    request.set_pool("pool");
    request.set_num_samples(num_samples);
    *request.mutable_topology() = HybridTopology();
    absl::StatusOr<v1::StepInfo> step = Client(via).CreateStep(request);
    EXPECT_TRUE(step.ok()) << step.status();
    return step.ok() ? *step : v1::StepInfo();
  }

  std::map<std::string, double> Metrics(size_t i) {
    int port = 0;
    std::ifstream(MetricsPortFile(i)) >> port;
    httplib::Client http("127.0.0.1", port);
    httplib::Result got = http.Get("/metrics");
    EXPECT_TRUE(got && got->status == 200) << "member " << i;
    return got ? ParseExposition(got->body) : std::map<std::string, double>();
  }

  bool EtcdHas(const std::string& kind) {
    absl::StatusOr<std::optional<std::string>> v =
        etcd_client_->Get(absl::StrCat("/", name_, "/", kind, "/pool"));
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() && v->has_value();
  }
};

TEST_F(ClusterPoolsTest, EveryMembersSamplesAreListedWithTheirOwnersInIdOrder) {
  ASSERT_NO_FATAL_FAILURE(StartThreeWithSamples());
  std::vector<std::string> ids;
  for (const v1::Sample& s : all_samples_) ids.push_back(s.sample_id());
  std::sort(ids.begin(), ids.end());
  for (size_t via = 0; via < 3; ++via) {
    for (int page_size : {5, 24, 10000}) {
      std::vector<v1::SampleInfo> all = ListAll(via, page_size);
      ASSERT_EQ(all.size(), ids.size()) << "via " << via << ", pages of " << page_size;
      for (size_t k = 0; k < all.size(); ++k) {
        EXPECT_EQ(all[k].sample_id(), ids[k]);
        // Ids are "m<i>-...": put on member i.
        const size_t owner = all[k].sample_id()[1] - '0';
        EXPECT_EQ(all[k].member(), members_[owner]->address()) << all[k].sample_id();
        EXPECT_EQ(all[k].state(), v1::SAMPLE_STATE_FREE);
        EXPECT_GT(all[k].num_tokens(), 0);
      }
    }
  }
  const v1::StepInfo step = CreateStep(1, "s1", 5);
  std::vector<v1::SampleInfo> held = ListAll(2, 2, v1::SAMPLE_STATE_HELD);
  ASSERT_EQ(held.size(), 5u);
  for (const v1::SampleInfo& s : held) EXPECT_EQ(s.step_id(), "s1") << s.sample_id();
  EXPECT_EQ(ListAll(0, 100, v1::SAMPLE_STATE_FREE).size(), 19u);

  v1::ListSamplesRequest bad;
  bad.set_pool("pool");
  bad.set_page_size(10001);
  v1::ListSamplesResponse unused;
  grpc::Status s = Page(0, bad, &unused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("page_size 10001 is not in 0..10000"));
  bad.set_page_size(0);
  bad.set_page_token("not a token!");
  s = Page(1, bad, &unused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("page_token"));
  bad.set_page_token("");
  bad.set_pool("no-such-pool");
  EXPECT_EQ(Page(2, bad, &unused).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ClusterPoolsTest, ADeletionWaitsForLiveStepsThenLeavesNothingAnywhere) {
  ASSERT_NO_FATAL_FAILURE(StartThreeWithSamples());
  CreateStep(0, "s1", 4);
  v1::DeletePoolResponse response;
  grpc::Status s = Delete(1, /*force=*/false, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("live steps s1"));
  EXPECT_EQ(Client(2).GetPool("pool")->num_samples(), 24);

  // A dry run says what a forced deletion would do, and does nothing.
  ASSERT_TRUE(Delete(2, /*force=*/true, &response, /*dry_run=*/true).ok());
  EXPECT_EQ(response.deleted_samples(), 24);
  EXPECT_THAT(response.released_steps(), ::testing::ElementsAre("s1"));
  EXPECT_EQ(response.members_size(), 3);
  EXPECT_TRUE(Client(0).GetPlan("s1").ok());

  ASSERT_TRUE(Client(2).ReleaseStep("s1").ok());
  for (size_t via = 0; via < 3; ++via) {
    EXPECT_EQ(Metrics(via).count("rollpack_pool_bytes{pool=\"pool\"}"), 1u) << "member " << via;
  }
  response.Clear();
  s = Delete(1, /*force=*/false, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.deleted_samples(), 20);
  EXPECT_GT(response.deleted_bytes(), 0);
  ASSERT_EQ(response.members_size(), 3);
  for (const v1::MemberPoolDeletion& m : response.members()) {
    EXPECT_FALSE(m.absent()) << m.member();
    EXPECT_GT(m.deleted_samples(), 0) << m.member();
    EXPECT_TRUE(m.error().empty()) << m.error();
  }
  // Gone from every member, from etcd and from every member's /metrics.
  for (size_t via = 0; via < 3; ++via) {
    EXPECT_EQ(Client(via).GetPool("pool").status().code(), absl::StatusCode::kNotFound);
    v1::ListSamplesRequest request;
    request.set_pool("pool");
    v1::ListSamplesResponse page;
    EXPECT_EQ(Page(via, request, &page).error_code(), grpc::StatusCode::NOT_FOUND);
    std::map<std::string, double> metrics = Metrics(via);
    EXPECT_EQ(metrics.count("rollpack_pool_bytes{pool=\"pool\"}"), 0u) << "member " << via;
    EXPECT_EQ(metrics.count("rollpack_pool_samples{pool=\"pool\"}"), 0u) << "member " << via;
    EXPECT_EQ(metrics["rollpack_store_bytes"], 0) << "member " << via;
  }
  EXPECT_FALSE(EtcdHas("pools"));
  EXPECT_FALSE(EtcdHas("pool-options"));
  EXPECT_FALSE(EtcdHas("schemas"));
  EXPECT_EQ(Delete(0, false, &response).error_code(), grpc::StatusCode::NOT_FOUND);

  // The name takes another model; a member restarted from its log does not
  // bring back what it held of the old pool.
  v1::ModelSpec other = ClusterModel();
  other.set_name("moe-2");
  absl::StatusOr<bool> created = Client(2).RegisterModel("pool", other);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(*created);
  ASSERT_TRUE(Client(0).PutSamples("pool", ClusterSamples(3, 99, "new-")).ok());
  members_[1]->Kill(SIGKILL);
  StartMember(1);
  ASSERT_TRUE(Eventually([&] { return MemberKeys().size() == 3; }, absl::Seconds(10)));
  std::vector<v1::SampleInfo> listed = ListAll(1, 100);
  ASSERT_EQ(listed.size(), 3u);
  for (const v1::SampleInfo& info : listed) EXPECT_EQ(info.member(), members_[0]->address());
  EXPECT_EQ(Client(1).GetPool("pool")->model().name(), "moe-2");
}

TEST_F(ClusterPoolsTest, AMemberAwayStopsTheDeletionAndForceReleasesTheSteps) {
  ASSERT_NO_FATAL_FAILURE(StartThreeWithSamples());
  CreateStep(0, "s1", 6);
  // Killed: listed until its lease runs out, and refusing connections.
  members_[2]->Kill(SIGKILL);
  v1::DeletePoolResponse response;
  grpc::Status s = Delete(1, /*force=*/true, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("cluster member 127.0.0.1:", ports_[2])));
  // Nothing changed: the step and every sample are still there.
  EXPECT_TRUE(Client(0).GetPlan("s1").ok());
  EXPECT_TRUE(EtcdHas("pools"));
  StartMember(2);
  ASSERT_TRUE(Eventually([&] { return MemberKeys().size() == 3; }, absl::Seconds(10)));
  EXPECT_EQ(Client(1).GetPool("pool")->num_samples(), 24);

  response.Clear();
  s = Delete(1, /*force=*/true, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT(response.released_steps(), ::testing::ElementsAre("s1"));
  // The step's 6 samples went with its release; the other 18 with the pool.
  EXPECT_EQ(response.deleted_samples(), 18);
  // Counted as ReleaseStep's releases are, by the member that took the call.
  std::map<std::string, double> metrics = Metrics(1);
  EXPECT_EQ(metrics["rollpack_steps_released_total"], 1);
  EXPECT_EQ(Client(0).GetPlan("s1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Client(2).GetPool("pool").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace rollpack
