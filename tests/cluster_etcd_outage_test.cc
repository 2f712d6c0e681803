// An etcd outage as an operator sees it (docs/cluster.md, "When etcd is
// away"; issue 43): real etcd, real rollpackd members with short leases.
// While etcd is stopped: rollpack_cluster_etcd_up reads 0 within seconds,
// one "etcd unreachable" line is logged, grpc.health says the Scheduler is
// NOT_SERVING and Rollouts SERVING, a new producer registers and puts to a
// pool its member knows, and GetPool answers in seconds, marked stale.
// After etcd returns: all of it back, "etcd reachable again" logged once.
// Members that join, leave and are lost are logged and reported per member.
#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "gtest/gtest.h"
#include "rollpack/v1/cluster_admin.grpc.pb.h"
#include "httplib.h"
#include "testing/child_process.h"
#include "testing/cluster_fixture.h"
#include "testing/etcd_process.h"
#include "testing/exposition.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;
using HealthStatus = grpc::health::v1::HealthCheckResponse;

// A rollpackd member whose standard error (its log) goes to a file.
class LoggedMember {
 public:
  static std::unique_ptr<LoggedMember> Start(const std::string& dir, const std::string& name,
                                             std::vector<std::string> args) {
    auto m = std::unique_ptr<LoggedMember>(new LoggedMember());
    m->log_ = absl::StrCat(dir, "/", name, ".log");
    const std::string port_file = absl::StrCat(dir, "/", name, ".port");
    const std::string metrics_file = absl::StrCat(dir, "/", name, ".metrics-port");
    args.insert(args.begin(), ROLLPACKD_PATH);
    args.push_back("--listen=127.0.0.1:0");
    args.push_back("--port-file=" + port_file);
    args.push_back("--metrics-listen=127.0.0.1:0");
    args.push_back("--metrics-port-file=" + metrics_file);
    const int fd = open(m->log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ChildOutput output;
    output.stderr_fd = fd;
    output.stdout_fd = fd;
    absl::StatusOr<pid_t> pid = SpawnChild(std::move(args), output);
    close(fd);
    if (!pid.ok()) return nullptr;
    m->pid_ = *pid;
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      std::ifstream(port_file) >> m->port_;
      std::ifstream(metrics_file) >> m->metrics_port_;
      if (m->port_ > 0 && m->metrics_port_ > 0) return m;
      if (waitpid(m->pid_, nullptr, WNOHANG) == m->pid_) {
        m->pid_ = -1;
        return nullptr;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return nullptr;
  }
  ~LoggedMember() { Kill(SIGKILL); }

  void Kill(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Lines of the log holding `text`.
  int CountLines(const std::string& text) const {
    std::istringstream in(Log());
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line.find(text) != std::string::npos;
    return n;
  }
  std::map<std::string, double> Metrics() const {
    httplib::Client http("127.0.0.1", metrics_port_);
    httplib::Result got = http.Get("/metrics");
    if (!got || got->status != 200) return {};
    return ParseExposition(got->body);
  }
  double Metric(const std::string& series) const {
    std::map<std::string, double> m = Metrics();
    auto it = m.find(series);
    return it == m.end() ? -1 : it->second;
  }
  // grpc.health.v1.Health/Check of `service` ("" = the server), through a
  // generic stub (the repository compiles the health messages, not their
  // stubs); -1 when the call fails.
  int Health(const std::string& service) const {
    grpc::GenericStub stub(MakeChannel(address()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::Slice slice(request.SerializeAsString());
    grpc::ByteBuffer in(&slice, 1), out;
    grpc::Status result;
    absl::Notification done;
    stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &in, &out,
                   [&](grpc::Status status) {
                     result = std::move(status);
                     done.Notify();
                   });
    done.WaitForNotification();
    if (!result.ok()) return -1;
    grpc::ProtoBufferReader reader(&out);
    HealthStatus response;
    if (!response.ParseFromZeroCopyStream(&reader)) return -1;
    return response.status();
  }

 private:
  LoggedMember() = default;
  std::string log_;
  pid_t pid_ = -1;
  int port_ = 0;
  int metrics_port_ = 0;
};

class ClusterEtcdOutageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start(1);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    dir_ = (std::filesystem::temp_directory_path() / "rollpack-outage-XXXXXX").string();
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
  }
  void TearDown() override {
    members_.clear();
    std::filesystem::remove_all(dir_);
  }

  LoggedMember& StartMember() {
    const size_t i = members_.size();
    members_.push_back(LoggedMember::Start(
        dir_, absl::StrCat("m", i),
        {"--cluster-etcd=" + etcd_->client_url(), "--cluster-name=outage",
         absl::StrCat("--cluster-lease-seconds=", kLeaseSeconds), "--max-memory=200000000"}));
    EXPECT_NE(members_.back(), nullptr);
    return *members_.back();
  }

  static std::string Series(const std::string& name, const LoggedMember& m) {
    return absl::StrCat(name, "{member=\"", m.address(), "\"}");
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::string dir_;
  std::vector<std::unique_ptr<LoggedMember>> members_;
};

TEST_F(ClusterEtcdOutageTest, AnOutageIsSeenAndKnownPoolsKeepTakingSamples) {
  LoggedMember& a = StartMember();
  LoggedMember& b = StartMember();
  LoggedMember& c = StartMember();
  ASSERT_TRUE(RollpackClient(a.address()).RegisterModel("pool", ClusterModel()).ok());
  ASSERT_TRUE(RollpackClient(a.address()).PutSamples("pool", ClusterSamples(4, 1, "a-")).ok());
  ASSERT_TRUE(RollpackClient(b.address()).PutSamples("pool", ClusterSamples(4, 2, "b-")).ok());
  // c stores nothing: it only looked the pool up.
  absl::StatusOr<v1::PoolInfo> seen = RollpackClient(c.address()).GetPool("pool");
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->num_samples(), 8);
  ASSERT_TRUE(Eventually(
      [&] {
        return a.Metric("rollpack_cluster_members") == 3 &&
               a.Metric(Series("rollpack_cluster_member_up", c)) == 1;
      },
      absl::Seconds(10)));
  EXPECT_EQ(a.Metric("rollpack_cluster_etcd_up"), 1);
  EXPECT_EQ(a.Metric("rollpack_cluster_etcd_unreachable_seconds"), 0);
  EXPECT_EQ(a.Metric("rollpack_cluster_etcd_outages_total"), 0);
  EXPECT_EQ(a.Health("rollpack.v1.Scheduler"), HealthStatus::SERVING);
  EXPECT_EQ(a.Health("rollpack.v1.Rollouts"), HealthStatus::SERVING);

  etcd_->Stop();
  const absl::Time stopped = absl::Now();
  ASSERT_TRUE(Eventually([&] { return a.Metric("rollpack_cluster_etcd_up") == 0; },
                         absl::Seconds(10)));
  const absl::Duration noticed = absl::Now() - stopped;
  EXPECT_LT(noticed, absl::Seconds(8)) << "seen within seconds";
  std::printf("etcd_up 0 on /metrics %s after etcd stopped\n",
              absl::FormatDuration(absl::Trunc(noticed, absl::Milliseconds(10))).c_str());
  EXPECT_EQ(a.Metric("rollpack_cluster_etcd_outages_total"), 1);
  EXPECT_GT(a.Metric("rollpack_cluster_etcd_unreachable_seconds"), 0);
  // The last list, stale (etcd_up says so), not a guess.
  EXPECT_EQ(a.Metric("rollpack_cluster_members"), 3);
  EXPECT_TRUE(Eventually([&] { return a.Health("rollpack.v1.Scheduler") == HealthStatus::NOT_SERVING; },
                         absl::Seconds(2)));
  EXPECT_EQ(a.Health("rollpack.v1.Rollouts"), HealthStatus::SERVING);
  EXPECT_EQ(a.Health(""), HealthStatus::SERVING) << "no probe restarts a member waiting for etcd";

  // Once each member has noticed (each on its own calls, within a second
  // of the others; a call in the first seconds of an outage still spends
  // the etcd client's budget: docs/cluster.md, "When etcd is away").
  for (const LoggedMember* m : {&b, &c}) {
    ASSERT_TRUE(Eventually([&] { return m->Metric("rollpack_cluster_etcd_up") == 0; },
                           absl::Seconds(10)))
        << m->address();
  }
  // A producer started now, on a channel of its own, registers and puts
  // to pools its members know: b stored samples of it, c only looked it up.
  int round = 0;
  for (LoggedMember* m : {&b, &c}) {
    ++round;
    RollpackClient producer(MakeDistinctChannel(m->address()));
    const absl::Time asked = absl::Now();
    absl::StatusOr<bool> registered = producer.RegisterModel("pool", ClusterModel());
    ASSERT_TRUE(registered.ok()) << m->address() << ": " << registered.status();
    EXPECT_FALSE(*registered);
    absl::StatusOr<v1::PutSamplesResponse> put =
        producer.PutSamples("pool", ClusterSamples(3, 7, absl::StrCat("during-", round, "-")));
    ASSERT_TRUE(put.ok()) << m->address() << ": " << put.status();
    EXPECT_LT(absl::Now() - asked, absl::Seconds(2)) << "answered from what the member knows";
    // Another model is refused as etcd would.
    EXPECT_EQ(producer.RegisterModel("pool", ClusterModel(8)).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
  // A pool no member knows waits for etcd, saying so.
  absl::StatusOr<bool> unknown = RollpackClient(a.address()).RegisterModel("new", ClusterModel());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnavailable) << unknown.status();
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("etcd"));
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("\"new\""));

  // GetPool answers in seconds from what a knows, marked stale, with every
  // member's share (the samples put during the outage included).
  const absl::Time asked = absl::Now();
  absl::StatusOr<v1::PoolInfo> pool = RollpackClient(a.address()).GetPool("pool");
  const absl::Duration took = absl::Now() - asked;
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_EQ(pool->num_samples(), 14);
  EXPECT_EQ(pool->members_size(), 3);
  EXPECT_THAT(pool->stale_membership(), HasSubstr("unreachable"));
  std::printf("GetPool during the outage: %s\n",
              absl::FormatDuration(absl::Trunc(took, absl::Milliseconds(1))).c_str());

  // `rollpack cluster status` says at once that etcd is away, and shows
  // every member a listed, each asked directly.
  {
    std::unique_ptr<v1::ClusterAdmin::Stub> admin = v1::ClusterAdmin::NewStub(MakeChannel(a.address()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::GetClusterStatusRequest request;
    v1::ClusterStatus status;
    const absl::Time status_asked = absl::Now();
    grpc::Status s = admin->GetClusterStatus(&context, request, &status);
    const absl::Duration status_took = absl::Now() - status_asked;
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_LT(status_took, absl::Seconds(3)) << "no wait for etcd's 8 s budget";
    EXPECT_FALSE(status.etcd().reachable());
    EXPECT_THAT(status.etcd().error(), HasSubstr("unreachable"));
    ASSERT_EQ(status.members_size(), 3);
    int64_t samples = 0;
    for (const v1::ClusterMemberStatus& m : status.members()) {
      EXPECT_TRUE(m.error().empty()) << m.member() << ": " << m.error();
      samples += m.num_samples();
    }
    EXPECT_EQ(samples, 14);
  }
  absl::StatusOr<v1::PoolInfo> nope = RollpackClient(a.address()).GetPool("nope");
  EXPECT_EQ(nope.status().code(), absl::StatusCode::kUnavailable) << nope.status();
  EXPECT_THAT(std::string(nope.status().message()), HasSubstr("\"nope\""));

  ASSERT_TRUE(etcd_->Restart().ok());
  const absl::Time restarted = absl::Now();
  ASSERT_TRUE(Eventually([&] { return a.Metric("rollpack_cluster_etcd_up") == 1; },
                         absl::Seconds(15)));
  std::printf("etcd_up 1 on /metrics %s after etcd restarted\n",
              absl::FormatDuration(absl::Trunc(absl::Now() - restarted, absl::Milliseconds(10)))
                  .c_str());
  EXPECT_EQ(a.Metric("rollpack_cluster_etcd_unreachable_seconds"), 0);
  EXPECT_EQ(a.Metric("rollpack_cluster_etcd_outages_total"), 1);
  EXPECT_TRUE(Eventually([&] { return a.Health("rollpack.v1.Scheduler") == HealthStatus::SERVING; },
                         absl::Seconds(2)));
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::PoolInfo> now = RollpackClient(a.address()).GetPool("pool");
        return now.ok() && now->stale_membership().empty() && now->members_size() == 3 &&
               now->num_samples() == 14;
      },
      absl::Seconds(15)));
  EXPECT_TRUE(Eventually([&] { return a.Metric("rollpack_cluster_members") == 3; },
                         absl::Seconds(5)));
  for (const LoggedMember* m : {&a, &b, &c}) {
    EXPECT_EQ(a.Metric(Series("rollpack_cluster_member_up", *m)), 1) << m->address();
  }
  // One line each way, per member, however many calls failed meanwhile.
  for (const LoggedMember* m : {&a, &b, &c}) {
    EXPECT_TRUE(Eventually([&] { return m->CountLines("etcd reachable again after") == 1; },
                           absl::Seconds(5)))
        << m->Log();
    EXPECT_EQ(m->CountLines("etcd unreachable (endpoints"), 1) << m->Log();
    EXPECT_EQ(m->CountLines("puts to known pools go on"), 1) << m->Log();
    EXPECT_EQ(m->CountLines("lost:"), 0) << "nobody was lost: " << m->Log();
  }
}

TEST_F(ClusterEtcdOutageTest, MembersJoiningLeavingAndLostAreLoggedAndReported) {
  LoggedMember& a = StartMember();
  LoggedMember& b = StartMember();
  ASSERT_TRUE(Eventually([&] { return a.Metric(Series("rollpack_cluster_member_up", b)) == 1; },
                         absl::Seconds(10)));
  LoggedMember& c = StartMember();
  ASSERT_TRUE(Eventually([&] { return a.Metric(Series("rollpack_cluster_member_up", c)) == 1; },
                         absl::Seconds(10)));
  EXPECT_TRUE(Eventually([&] { return a.CountLines(c.address() + " joined") == 1; },
                         absl::Seconds(2)))
      << a.Log();

  // Stopped cleanly: it revokes its lease and roster entry, and is gone.
  b.Kill(SIGTERM);
  ASSERT_TRUE(Eventually([&] { return a.CountLines(b.address() + " left") == 1; },
                         absl::Seconds(5)))
      << a.Log();
  EXPECT_EQ(a.Metric(Series("rollpack_cluster_member_up", b)), -1) << "no series";
  // Killed: its lease runs out while its roster entry stays.
  c.Kill(SIGKILL);
  ASSERT_TRUE(Eventually([&] { return a.CountLines(c.address() + " lost") == 1; },
                         absl::Seconds(3 * kLeaseSeconds + 3)))
      << a.Log();
  EXPECT_EQ(a.Metric(Series("rollpack_cluster_member_up", c)), 0);
  EXPECT_EQ(a.Metric(Series("rollpack_cluster_member_up", a)), 1);
  EXPECT_EQ(a.Metric("rollpack_cluster_members"), 1);
  EXPECT_EQ(a.CountLines(b.address() + " lost"), 0) << a.Log();
}

// A member whose etcd is gone still stops within seconds of SIGTERM (a
// Kubernetes grace period, a Ray actor's exit): leaving does not spend each
// etcd call's total budget; its lease runs out on its own.
TEST_F(ClusterEtcdOutageTest, AMemberStopsPromptlyWhenEtcdIsGone) {
  LoggedMember& a = StartMember();
  ASSERT_TRUE(Eventually([&] { return a.Metric("rollpack_cluster_members") == 1; },
                         absl::Seconds(10)));
  etcd_->Stop();
  ASSERT_TRUE(Eventually([&] { return a.Metric("rollpack_cluster_etcd_up") == 0; },
                         absl::Seconds(15)));
  const absl::Time signalled = absl::Now();
  a.Kill(SIGTERM);  // waits for the exit
  const absl::Duration took = absl::Now() - signalled;
  std::printf("stopped %s after SIGTERM with etcd gone\n",
              absl::FormatDuration(absl::Trunc(took, absl::Milliseconds(10))).c_str());
  // Before: the keep-alive call in flight and two lease revokes each retried
  // for 8 s, past rollpackd's own 20 s limit.
  EXPECT_LT(took, absl::Seconds(5)) << a.Log();
  EXPECT_EQ(a.CountLines("not stopped"), 0) << a.Log();
}

}  // namespace
}  // namespace rollpack
