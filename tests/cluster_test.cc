// Cluster mode with real processes (docs/cluster.md): an etcd started on
// 127.0.0.1 (testing/etcd_process.h) and rollpackd members as child
// processes. Membership follows leases; a pool's model is fixed for the
// whole cluster; GetPool on any member reports every member's share; etcd
// going away makes cluster-wide calls UNAVAILABLE, not hang, and they work
// again when it returns.
#include <signal.h>

#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd_client.h"
#include "testing/cluster_fixture.h"
#include "testing/daemon_process.h"
#include "testing/etcd_process.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;
using ClusterTest = ClusterFixture;

TEST_F(ClusterTest, EtcdClientKeysAndLeases) {
  ASSERT_TRUE(etcd_client_->Put("/t/a", "1").ok());
  ASSERT_TRUE(etcd_client_->Put("/t/b", "2").ok());
  ASSERT_TRUE(etcd_client_->Put("/u/c", "3").ok());
  absl::StatusOr<std::optional<std::string>> a = etcd_client_->Get("/t/a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->value_or(""), "1");
  absl::StatusOr<std::optional<std::string>> none = etcd_client_->Get("/t/none");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto kvs = etcd_client_->GetPrefix("/t/");
  ASSERT_TRUE(kvs.ok());
  ASSERT_EQ(kvs->size(), 2u);
  EXPECT_EQ((*kvs)[0].first, "/t/a");
  EXPECT_EQ((*kvs)[1].second, "2");

  // Eight racing creators: exactly one creates, every one sees its value.
  std::atomic<int> created{0};
  std::vector<std::string> seen(8);
  std::vector<std::thread> racers;
  for (int i = 0; i < 8; ++i) {
    racers.emplace_back([&, i] {
      bool mine = false;
      absl::StatusOr<std::string> held =
          etcd_client_->CreateIfAbsent("/t/race", absl::StrCat("v", i), &mine);
      if (held.ok()) seen[i] = *held;
      if (mine) ++created;
    });
  }
  for (std::thread& t : racers) t.join();
  EXPECT_EQ(created.load(), 1);
  for (const std::string& v : seen) EXPECT_EQ(v, seen[0]);

  absl::StatusOr<int64_t> lease = etcd_client_->GrantLease(absl::Seconds(5));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(etcd_client_->Put("/t/leased", "x", *lease).ok());
  EXPECT_TRUE(etcd_client_->KeepAlive(*lease).ok());
  ASSERT_TRUE(etcd_client_->RevokeLease(*lease).ok());
  absl::StatusOr<std::optional<std::string>> gone = etcd_client_->Get("/t/leased");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value()) << "a revoked lease takes its keys";
  EXPECT_EQ(etcd_client_->KeepAlive(*lease).code(), absl::StatusCode::kNotFound);
}

TEST_F(ClusterTest, MembersJoinAndLeaveWithoutRestartingTheOthers) {
  for (size_t i = 0; i < 3; ++i) StartMember(i);
  const std::set<std::string> all = {members_[0]->address(), members_[1]->address(),
                                     members_[2]->address()};
  EXPECT_EQ(MemberKeys(), all);

  // kill -9: nothing revokes the lease; it expires.
  const std::string killed = members_[1]->address();
  const absl::Time killed_at = absl::Now();
  members_[1]->Kill(SIGKILL);
  ASSERT_TRUE(Eventually([&] { return MemberKeys().count(killed) == 0; }, absl::Seconds(10)));
  const absl::Duration dropped_after = absl::Now() - killed_at;
  EXPECT_GE(dropped_after, absl::Seconds(kLeaseSeconds) / 2) << "dropped before its lease ran out";
  EXPECT_EQ(MemberKeys().size(), 2u);

  // A member joining mid-run.
  StartMember(3);
  EXPECT_EQ(MemberKeys().size(), 3u);
  EXPECT_EQ(MemberKeys().count(members_[3]->address()), 1u);

  // SIGTERM: the member revokes its lease on the way out, so it is gone at
  // once rather than after the TTL.
  const std::string stopped = members_[0]->address();
  const absl::Time stopped_at = absl::Now();
  members_[0]->Kill(SIGTERM);
  EXPECT_EQ(MemberKeys().count(stopped), 0u);
  EXPECT_LT(absl::Now() - stopped_at, absl::Seconds(kLeaseSeconds) + absl::Seconds(10));
}

TEST_F(ClusterTest, APoolIsRegisteredForTheWholeCluster) {
  for (size_t i = 0; i < 3; ++i) StartMember(i);
  RollpackClient a = Client(0), b = Client(1), c = Client(2);

  absl::StatusOr<bool> created = a.RegisterModel("pool", ClusterModel());
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(*created);
  absl::StatusOr<bool> again = b.RegisterModel("pool", ClusterModel());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again) << "registered on another member already";
  absl::StatusOr<bool> other = c.RegisterModel("pool", ClusterModel(/*num_experts=*/32));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(other.status().message()), HasSubstr("pool \"pool\""));

  // Members that never saw RegisterModel take samples for the pool.
  absl::StatusOr<v1::PutSamplesResponse> put_b = b.PutSamples("pool", ClusterSamples(5, 1, "b-"));
  ASSERT_TRUE(put_b.ok()) << put_b.status();
  absl::StatusOr<v1::PutSamplesResponse> put_c = c.PutSamples("pool", ClusterSamples(7, 2, "c-"));
  ASSERT_TRUE(put_c.ok()) << put_c.status();
  EXPECT_EQ(put_c->accepted(), 7);
  // An unknown pool stays unknown everywhere.
  EXPECT_EQ(b.PutSamples("nope", ClusterSamples(1, 3, "x-")).status().code(),
            absl::StatusCode::kNotFound);

  // GetPool on any member: the sums and each member's share.
  for (RollpackClient* client : {&a, &b, &c}) {
    absl::StatusOr<v1::PoolInfo> pool = client->GetPool("pool");
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_EQ(pool->num_samples(), 12);
    EXPECT_EQ(pool->num_free_samples(), 12);
    EXPECT_EQ(pool->model().num_experts(), 16);
    ASSERT_EQ(pool->members_size(), 3);
    int64_t bytes = 0;
    for (const v1::MemberPoolInfo& m : pool->members()) {
      EXPECT_TRUE(m.error().empty()) << m.member() << ": " << m.error();
      bytes += m.stored_bytes();
      const int64_t expected = m.member() == members_[1]->address()   ? 5
                               : m.member() == members_[2]->address() ? 7
                                                                      : 0;
      EXPECT_EQ(m.num_samples(), expected) << m.member();
    }
    EXPECT_EQ(pool->stored_bytes(), bytes);
    EXPECT_GT(bytes, 0);
  }
  EXPECT_EQ(c.GetPool("nope").status().code(), absl::StatusCode::kNotFound);
}

// The same samples with one more token field: another schema.
std::vector<v1::Sample> WithExtraField(std::vector<v1::Sample> samples) {
  for (v1::Sample& s : samples) {
    v1::NDArray& f = (*s.mutable_token_fields())["version"];
    f.set_dtype(v1::INT32);
    f.add_shape(s.tokens().shape(0));
    f.set_data(std::string(4 * s.tokens().shape(0), '\0'));
  }
  return samples;
}

TEST_F(ClusterTest, TwoMembersRacingToFixASchemaExactlyOneWins) {
  for (size_t i = 0; i < 3; ++i) StartMember(i);
  RollpackClient a = Client(0), b = Client(1), c = Client(2);
  ASSERT_TRUE(a.RegisterModel("pool", ClusterModel()).ok());
  const std::vector<v1::Sample> plain = ClusterSamples(4, 1, "b-");
  const std::vector<v1::Sample> extra = WithExtraField(ClusterSamples(4, 2, "c-"));
  absl::StatusOr<v1::PutSamplesResponse> put_b, put_c;
  std::thread tb([&] { put_b = b.PutSamples("pool", plain); });
  std::thread tc([&] { put_c = c.PutSamples("pool", extra); });
  tb.join();
  tc.join();
  ASSERT_NE(put_b.ok(), put_c.ok()) << put_b.status() << " / " << put_c.status();
  const absl::Status& loser = put_b.ok() ? put_c.status() : put_b.status();
  EXPECT_EQ(loser.code(), absl::StatusCode::kInvalidArgument) << loser;
  EXPECT_THAT(std::string(loser.message()), HasSubstr("token_fields"));
  // The winner's schema holds on a member that has stored nothing yet.
  const bool plain_won = put_b.ok();
  EXPECT_EQ(a.PutSamples("pool", plain_won ? WithExtraField(ClusterSamples(2, 3, "a1-"))
                                           : ClusterSamples(2, 3, "a1-"))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<v1::PutSamplesResponse> fits =
      a.PutSamples("pool", plain_won ? ClusterSamples(2, 4, "a2-") : WithExtraField(ClusterSamples(2, 4, "a2-")));
  EXPECT_TRUE(fits.ok()) << fits.status();
}

TEST_F(ClusterTest, EtcdDownRefusesClusterCallsAndTheyWorkWhenItReturns) {
  StartMember(0);
  StartMember(1);
  RollpackClient a = Client(0), b = Client(1);
  ASSERT_TRUE(a.RegisterModel("pool", ClusterModel()).ok());
  ASSERT_TRUE(b.PutSamples("pool", ClusterSamples(3, 1, "b-")).ok());  // adopted by b

  etcd_->Stop();
  const absl::Time asked = absl::Now();
  absl::StatusOr<bool> refused = a.RegisterModel("other", ClusterModel());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("etcd"));
  // Retried for the client's 8 s budget (etcd may be failing over), then refused.
  EXPECT_LT(absl::Now() - asked, absl::Seconds(12)) << "refused within seconds, never a hang";
  // What a member already holds keeps working.
  absl::StatusOr<v1::PutSamplesResponse> local = b.PutSamples("pool", ClusterSamples(2, 2, "b2-"));
  EXPECT_TRUE(local.ok()) << local.status();

  ASSERT_TRUE(etcd_->Restart().ok());
  EXPECT_TRUE(Eventually([&] { return a.RegisterModel("other", ClusterModel()).ok(); },
                         absl::Seconds(20)));
  // Both members are (again) in the member list, whatever became of their
  // leases while etcd was away.
  EXPECT_TRUE(Eventually([&] { return MemberKeys().size() == 2; }, absl::Seconds(20)));
  absl::StatusOr<v1::PoolInfo> pool = a.GetPool("pool");
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->num_samples(), 5);
}

TEST(ClusterEtcdTest, AThreeMemberEtcdLosingOneMemberCausesNoError) {
  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start(3);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  std::string dir = (std::filesystem::temp_directory_path() / "rollpack-cluster-XXXXXX").string();
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  std::vector<std::unique_ptr<DaemonProcess>> members;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Start(
        ROLLPACKD_PATH,
        {"--cluster-etcd=" + (*etcd)->client_urls(), "--cluster-name=three",
         absl::StrCat("--cluster-lease-seconds=", kLeaseSeconds)},
        absl::StrCat(dir, "/port", i));
    ASSERT_TRUE(d.ok()) << d.status();
    members.push_back(*std::move(d));
  }
  RollpackClient a(MakeChannel(members[0]->address()));
  RollpackClient b(MakeChannel(members[1]->address()));
  ASSERT_TRUE(a.RegisterModel("p0", ClusterModel()).ok());
  // The first endpoint is the one both members talk to: lose it.
  (*etcd)->Stop(0);
  for (int i = 1; i <= 5; ++i) {
    absl::StatusOr<bool> created = (i % 2 ? b : a).RegisterModel(absl::StrCat("p", i), ClusterModel());
    EXPECT_TRUE(created.ok()) << "call " << i << ": " << created.status();
    absl::StatusOr<v1::PoolInfo> pool = a.GetPool(absl::StrCat("p", i));
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_EQ(pool->members_size(), 2);
  }
  // Membership survives too: both leases were renewed through the others.
  absl::SleepFor(absl::Seconds(kLeaseSeconds) * 2);
  absl::StatusOr<v1::PoolInfo> pool = b.GetPool("p0");
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->members_size(), 2);
  members.clear();
  std::filesystem::remove_all(dir);
}

TEST_F(ClusterTest, ALiveMemberIdCannotBeTakenTwice) {
  StartMember(0);
  // A second process advertising the same address: refused once the first
  // member's lease has been renewed past the TTL it waited.
  absl::StatusOr<std::unique_ptr<DaemonProcess>> twin = DaemonProcess::Start(
      ROLLPACKD_PATH,
      {"--cluster-etcd=" + etcd_->client_url(), "--cluster-name=" + name_,
       absl::StrCat("--cluster-lease-seconds=", kLeaseSeconds),
       "--cluster-advertise=" + members_[0]->address()},
      dir_ + "/port-twin", absl::Seconds(30));
  EXPECT_FALSE(twin.ok()) << "two members with one id would hide each other";
  EXPECT_EQ(MemberKeys(), std::set<std::string>{members_[0]->address()});
  // A member whose key is deleted by hand puts it back at its next renewal.
  ASSERT_TRUE(etcd_client_->Delete("/" + name_ + "/members/" + members_[0]->address()).ok());
  EXPECT_TRUE(Eventually([&] { return MemberKeys().size() == 1; }, absl::Seconds(5)));
}

// Issue 36: a RegisterModel the member refuses (one pool over its
// --max-pools) fixed the pool's options and model in etcd anyway, so the
// other members took samples for a pool nobody had registered.
TEST_F(ClusterTest, ARefusedRegisterModelLeavesNoKey) {
  member_args_ = {"--max-pools=1"};
  StartMember(0);
  ASSERT_TRUE(Client(0).RegisterModel("first", ClusterModel()).ok());
  absl::StatusOr<bool> second = Client(0).RegisterModel("second", ClusterModel());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  for (const char* kind : {"pools", "pool-options"}) {
    absl::StatusOr<std::optional<std::string>> key =
        etcd_client_->Get(absl::StrCat("/", name_, "/", kind, "/second"));
    ASSERT_TRUE(key.ok()) << key.status();
    EXPECT_FALSE(key->has_value()) << kind;
  }
}

TEST_F(ClusterTest, BadClusterFlagsAreRefusedAtStart) {
  absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Start(
      ROLLPACKD_PATH, {"--cluster-etcd=https://127.0.0.1:1"}, dir_ + "/port-bad",
      absl::Seconds(20));
  EXPECT_FALSE(d.ok());
  absl::StatusOr<std::unique_ptr<DaemonProcess>> unreachable = DaemonProcess::Start(
      ROLLPACKD_PATH, {absl::StrCat("--cluster-etcd=127.0.0.1:", PickFreePort())},
      dir_ + "/port-unreachable", absl::Seconds(20));
  EXPECT_FALSE(unreachable.ok()) << "a member that cannot reach etcd does not serve";
}

}  // namespace
}  // namespace rollpack
