// Operating a fleet (docs/cluster.md, "Maintenance: draining a member"):
// ClusterAdmin's status over three real members and a real etcd, a member
// drained (new samples refused with its name, its free samples taken by
// steps first until it is empty, the drain kept in etcd across its restart,
// its gauge), then undrained.
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
#include "rollpack/v1/cluster_admin.grpc.pb.h"
#include "testing/cluster_fixture.h"
#include "testing/exposition.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

class ClusterDrainTest : public ClusterFixture {
 protected:
  std::unique_ptr<v1::ClusterAdmin::Stub> Admin(size_t i) {
    return v1::ClusterAdmin::NewStub(MakeChannel(members_[i]->address()));
  }

  v1::ClusterStatus Status(size_t via) {
    v1::ClusterStatus status;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    grpc::Status s = Admin(via)->GetClusterStatus(&context, {}, &status);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return status;
  }

  // Member `i`'s line of `status` (an empty one when it is not listed).
  v1::ClusterMemberStatus Line(const v1::ClusterStatus& status, size_t i) {
    for (const v1::ClusterMemberStatus& m : status.members()) {
      if (m.member() == members_[i]->address()) return m;
    }
    ADD_FAILURE() << "member " << i << " not listed: " << status.ShortDebugString();
    return {};
  }

  grpc::Status SetDrained(size_t via, const std::string& member, bool drained,
                          v1::DrainMemberResponse* response) {
    v1::DrainMemberRequest request;
    request.set_member(member);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return drained ? Admin(via)->DrainMember(&context, request, response)
                   : Admin(via)->UndrainMember(&context, request, response);
  }

  double DrainingGauge(size_t i) {
    int port = 0;
    std::ifstream(MetricsPortFile(i)) >> port;
    httplib::Client http("127.0.0.1", port);
    httplib::Result got = http.Get("/metrics");
    EXPECT_TRUE(got && got->status == 200) << "member " << i << " metrics port " << port;
    if (!got) return -1;
    std::map<std::string, double> m = ParseExposition(got->body);
    auto it = m.find("rollpack_cluster_member_draining");
    EXPECT_NE(it, m.end());
    return it == m.end() ? -1 : it->second;
  }

  // The sample ids of a step of `n` of the pool's oldest free samples
  // created through member `via`.
  std::vector<std::string> TakeStep(size_t via, const std::string& step_id, int n) {
    v1::CreateStepRequest request;
    request.set_step_id(step_id);
    request.set_pool("pool");
    request.set_num_samples(n);
    *request.mutable_topology() = HybridTopology();
    absl::StatusOr<v1::StepInfo> step = Client(via).CreateStep(request);
    EXPECT_TRUE(step.ok()) << step.status();
    absl::StatusOr<v1::Plan> plan = Client(via).GetPlan(step_id);
    EXPECT_TRUE(plan.ok()) << plan.status();
    std::vector<std::string> ids;
    if (!plan.ok()) return ids;
    for (const auto& mb : plan->microbatches()) {
      for (const auto& g : mb.groups()) {
        ids.insert(ids.end(), g.sample_ids().begin(), g.sample_ids().end());
      }
    }
    return ids;
  }
};

int CountPrefix(const std::vector<std::string>& ids, const std::string& prefix) {
  int n = 0;
  for (const std::string& id : ids) n += id.rfind(prefix, 0) == 0;
  return n;
}

TEST_F(ClusterDrainTest, ADrainedMemberTakesNoSamplesAndIsEmptiedFirstUntilUndrained) {
  StartThreeWithSamples();
  const std::string b = members_[1]->address();

  // Every member, its samples and etcd, through any member.
  v1::ClusterStatus status = Status(0);
  EXPECT_TRUE(status.cluster_mode());
  EXPECT_EQ(status.cluster_name(), name_);
  EXPECT_EQ(status.answered_by(), members_[0]->address());
  EXPECT_TRUE(status.etcd().reachable()) << status.etcd().error();
  EXPECT_GT(status.etcd().revision(), 0);
  ASSERT_EQ(status.members_size(), 3) << status.ShortDebugString();
  for (size_t i = 0; i < 3; ++i) {
    const v1::ClusterMemberStatus m = Line(status, i);
    EXPECT_TRUE(m.live() && m.reachable()) << m.ShortDebugString();
    EXPECT_FALSE(m.draining());
    EXPECT_EQ(m.self(), i == 0);
    EXPECT_EQ((m.num_samples()), 8);
    EXPECT_EQ(m.num_free_samples(), 8);
    EXPECT_GT(m.stored_bytes(), 0);
    ASSERT_EQ(m.pools_size(), 1);
    EXPECT_EQ(m.pools(0).pool(), "pool");
    EXPECT_FALSE(m.version().empty());
  }
  EXPECT_EQ(DrainingGauge(1), 0);

  // Drained through member 0: member 1 applies it at once.
  v1::DrainMemberResponse drained;
  grpc::Status s = SetDrained(0, b, true, &drained);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(drained.draining());
  EXPECT_TRUE(drained.status().reachable()) << drained.status().error();
  EXPECT_TRUE(drained.status().reports_draining());
  EXPECT_EQ(DrainingGauge(1), 1);
  EXPECT_EQ(DrainingGauge(0), 0);

  // New samples: refused by member 1 naming it, taken by member 0.
  absl::StatusOr<v1::PutSamplesResponse> refused =
      Client(1).PutSamples("pool", ClusterSamples(2, 50, "late-b-"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("member " + b + " is drained for maintenance"));
  absl::StatusOr<v1::PutSamplesResponse> taken =
      Client(0).PutSamples("pool", ClusterSamples(2, 51, "late-a-"));
  ASSERT_TRUE(taken.ok()) << taken.status();

  // Steps take member 1's free samples first (member 0's are older).
  status = Status(2);
  EXPECT_TRUE(Line(status, 1).draining());
  EXPECT_TRUE(Line(status, 1).reports_draining());
  EXPECT_FALSE(Line(status, 0).draining());
  const std::vector<std::string> first = TakeStep(2, "s1", 5);
  EXPECT_EQ(CountPrefix(first, "m1-"), 5) << ::testing::PrintToString(first);
  EXPECT_EQ(Line(Status(0), 1).num_free_samples(), 3);
  const std::vector<std::string> second = TakeStep(0, "s2", 5);
  EXPECT_EQ(CountPrefix(second, "m1-"), 3) << ::testing::PrintToString(second);
  EXPECT_EQ(CountPrefix(second, "m0-"), 2) << ::testing::PrintToString(second);
  v1::ClusterMemberStatus b_line = Line(Status(0), 1);
  EXPECT_EQ(b_line.num_free_samples(), 0);
  EXPECT_EQ(b_line.num_live_steps(), 2);
  ASSERT_TRUE(Client(0).ReleaseStep("s1").ok());
  ASSERT_TRUE(Client(1).ReleaseStep("s2").ok());
  b_line = Line(Status(1), 1);
  EXPECT_EQ(b_line.num_samples(), 0);
  EXPECT_EQ(b_line.num_live_steps(), 0);
  EXPECT_TRUE(b_line.self());

  // The drain is etcd's: member 1 restarted is still drained.
  members_[1]->Kill(SIGTERM);
  StartMember(1);
  EXPECT_EQ(DrainingGauge(1), 1);
  refused = Client(1).PutSamples("pool", ClusterSamples(2, 52, "late-b-"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_TRUE(Line(Status(2), 1).draining());

  // Undrained through member 2: member 1 takes samples again.
  v1::DrainMemberResponse undrained;
  s = SetDrained(2, b, false, &undrained);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(undrained.draining());
  EXPECT_FALSE(undrained.status().reports_draining());
  EXPECT_EQ(DrainingGauge(1), 0);
  absl::StatusOr<v1::PutSamplesResponse> accepted =
      Client(1).PutSamples("pool", ClusterSamples(2, 53, "late-b-"));
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_FALSE(Line(Status(0), 1).draining());
}

TEST_F(ClusterDrainTest, OnlyLiveMembersAreDrainedAndForeignKeysDrainNobody) {
  StartMember(0);
  StartMember(1);
  v1::DrainMemberResponse response;
  grpc::Status s = SetDrained(0, "127.0.0.1:1", true, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("127.0.0.1:1 is not a live member"));
  s = SetDrained(0, "127.0.0.1:1", false, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  s = SetDrained(0, "", true, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();

  // A key written by hand that does not hold its member's id drains nobody.
  const std::string b = members_[1]->address();
  ASSERT_TRUE(etcd_client_->Put("/" + name_ + "/drained/" + b, "yes").ok());
  v1::ClusterStatus status = Status(0);
  EXPECT_FALSE(Line(status, 1).draining());
  ASSERT_TRUE(Client(0).RegisterModel("pool", ClusterModel()).ok());
  EXPECT_TRUE(Client(1).PutSamples("pool", ClusterSamples(1, 7, "b-")).ok());

  // A member that stopped keeps its drain: listed, not live, until undrained.
  s = SetDrained(0, b, true, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  members_[1]->Kill(SIGTERM);
  status = Status(0);
  ASSERT_EQ(status.members_size(), 2) << status.ShortDebugString();
  const v1::ClusterMemberStatus gone = status.members(b < members_[0]->address() ? 0 : 1);
  EXPECT_EQ(gone.member(), b);
  EXPECT_TRUE(gone.draining());
  EXPECT_FALSE(gone.live());
  EXPECT_FALSE(gone.reachable());
  s = SetDrained(0, b, false, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(response.status().reachable());
  EXPECT_EQ(Status(0).members_size(), 1);
}

}  // namespace
}  // namespace rollpack
