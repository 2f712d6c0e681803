// A cluster of real processes for tests (docs/cluster.md): an etcd on
// 127.0.0.1 ephemeral ports (etcd_process.h) and rollpackd members started
// as child processes, all stopped at the end. A test target that includes
// this defines ROLLPACKD_PATH.
#ifndef ROLLPACK_TESTING_CLUSTER_FIXTURE_H_
#define ROLLPACK_TESTING_CLUSTER_FIXTURE_H_

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "gtest/gtest.h"
#include "server/cluster/etcd_client.h"
#include "testing/daemon_process.h"
#include "testing/etcd_process.h"
#include "testing/synthetic_rollouts.h"

#ifndef ROLLPACKD_PATH
#error "ROLLPACKD_PATH must name the rollpackd binary"
#endif

namespace rollpack {

// Short, so tests see a killed member leave quickly.
inline constexpr int kLeaseSeconds = 2;

inline v1::ModelSpec ClusterModel(int num_experts = 16) {
  v1::ModelSpec m;
  m.set_name("moe");
  m.set_num_layers(4);
  m.set_num_experts(num_experts);
  m.set_topk(2);
  return m;
}

// `num` synthetic samples of ClusterModel() with ids prefixed by `prefix`.
inline std::vector<v1::Sample> ClusterSamples(int num, uint64_t seed, const std::string& prefix) {
  SyntheticOptions options;
  options.num_samples = num;
  options.median_length = 64;
  options.max_length = 256;
  options.seed = seed;
  std::vector<v1::Sample> samples = MakeSyntheticRollouts(ClusterModel(), options);
  for (v1::Sample& s : samples) s.set_sample_id(prefix + s.sample_id());
  return samples;
}

// Polls `condition` every 50 ms until it holds or `timeout` passes.
template <typename F>
bool Eventually(F condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return condition();
}

// Hybrid DP x CP over two pipeline stages, dynamic CP, 256 tokens per rank:
// the layout the cluster tests compare with a single server's.
inline v1::Topology HybridTopology() {
  v1::Topology t;
  t.set_dp(2);
  t.set_cp(2);
  t.set_tp(1);
  t.set_pp(2);
  t.set_max_tokens_per_rank(256);
  t.set_scheduler(v1::DYNAMIC_CP);
  return t;
}

// Every rank of `t`, dp outermost, pp innermost.
inline std::vector<v1::RankCoords> AllRanks(const v1::Topology& t) {
  std::vector<v1::RankCoords> ranks;
  for (int d = 0; d < t.dp(); ++d) {
    for (int c = 0; c < t.cp(); ++c) {
      for (int x = 0; x < std::max(1, t.tp()); ++x) {
        for (int p = 0; p < t.pp(); ++p) {
          v1::RankCoords r;
          r.set_dp(d);
          r.set_cp(c);
          r.set_tp(x);
          r.set_pp(p);
          ranks.push_back(r);
        }
      }
    }
  }
  return ranks;
}

// Ids of StartThreeWithSamples' samples, interleaved over the three members.
inline std::vector<std::string> InterleavedIds(int per_member) {
  std::vector<std::string> ids;
  for (int k = 0; k < per_member; ++k) {
    for (int m = 0; m < 3; ++m) ids.push_back(absl::StrCat("m", m, "-rollout-", k));
  }
  return ids;
}

class ClusterFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start(1, etcd_options_);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    absl::StatusOr<std::unique_ptr<EtcdClient>> client =
        EtcdClient::Create({{etcd_->client_url()}, absl::Seconds(3)});
    ASSERT_TRUE(client.ok()) << client.status();
    etcd_client_ = *std::move(client);
    dir_ = (std::filesystem::temp_directory_path() / "rollpack-cluster-XXXXXX").string();
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
  }
  void TearDown() override {
    members_.clear();
    std::filesystem::remove_all(dir_);
  }

  // Starts member `i`, or restarts it in its slot at the address it had
  // (its member id), with its own --data-dir when `durable_`.
  DaemonProcess& StartMember(size_t i) {
    if (members_.size() <= i) {
      members_.resize(i + 1);
      ports_.resize(i + 1, 0);
    }
    std::vector<std::string> args = {
        "--cluster-etcd=" + etcd_->client_url(), "--cluster-name=" + name_,
        absl::StrCat("--cluster-lease-seconds=", kLeaseSeconds), "--max-memory=200000000",
        "--metrics-listen=127.0.0.1:0", "--metrics-port-file=" + MetricsPortFile(i)};
    if (ports_[i] != 0) args.push_back(absl::StrCat("--listen=127.0.0.1:", ports_[i]));
    args.insert(args.end(), member_args_.begin(), member_args_.end());
    if (durable_) {
      const std::string data = absl::StrCat(dir_, "/data", i);
      std::filesystem::create_directories(data);
      args.push_back("--data-dir=" + data);
      args.push_back("--fsync=never");
    }
    absl::StatusOr<std::unique_ptr<DaemonProcess>> d = DaemonProcess::Start(
        ROLLPACKD_PATH, args, absl::StrCat(dir_, "/port", i), absl::Seconds(60),
        member_logs_ ? MemberLogFile(i) : "");
    EXPECT_TRUE(d.ok()) << d.status();
    members_[i] = *std::move(d);
    ports_[i] = members_[i]->port();
    return *members_[i];
  }

  RollpackClient Client(size_t i) { return RollpackClient(MakeChannel(members_[i]->address())); }

  // Three members, each with 8 samples of its own in pool "pool" (put one
  // member after the other, so the cluster-wide arrival order is m0's,
  // m1's, m2's); all_samples_ holds them all.
  void StartThreeWithSamples() {
    for (size_t i = 0; i < 3; ++i) StartMember(i);
    ASSERT_TRUE(Client(0).RegisterModel("pool", ClusterModel()).ok());
    for (size_t i = 0; i < 3; ++i) {
      std::vector<v1::Sample> samples = ClusterSamples(8, 10 + i, absl::StrCat("m", i, "-"));
      absl::StatusOr<v1::PutSamplesResponse> put = Client(i).PutSamples("pool", samples);
      ASSERT_TRUE(put.ok()) << put.status();
      for (v1::Sample& s : samples) all_samples_.push_back(std::move(s));
    }
  }

  // A single rollpackd (no cluster) holding all_samples_: the reference a
  // cluster's bytes are compared with. Null when it did not start.
  std::unique_ptr<DaemonProcess> StartReference() {
    absl::StatusOr<std::unique_ptr<DaemonProcess>> single =
        DaemonProcess::Start(ROLLPACKD_PATH, {"--max-memory=200000000"}, dir_ + "/single-port");
    EXPECT_TRUE(single.ok()) << single.status();
    if (!single.ok()) return nullptr;
    RollpackClient client(MakeChannel((*single)->address()));
    EXPECT_TRUE(client.RegisterModel("pool", ClusterModel()).ok());
    EXPECT_TRUE(client.PutSamples("pool", all_samples_).ok());
    return *std::move(single);
  }

  // With member_logs_, where member `i`'s log goes (every start appends).
  std::string MemberLogFile(size_t i) const { return absl::StrCat(dir_, "/member", i, ".log"); }

  // Where member `i` writes its metrics port (GET /metrics on 127.0.0.1).
  std::string MetricsPortFile(size_t i) const { return absl::StrCat(dir_, "/metrics-port", i); }

  // Addresses in the member keys etcd holds now.
  std::set<std::string> MemberKeys() {
    std::set<std::string> out;
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> kvs =
        etcd_client_->GetPrefix("/" + name_ + "/members/");
    if (kvs.ok()) {
      // A member's key holds its address, then a line naming the process.
      for (const auto& kv : *kvs) out.insert(kv.second.substr(0, kv.second.find('\n')));
    }
    return out;
  }

  const std::string name_ = "test-cluster";
  // How SetUp starts etcd (a test fixture's constructor may change them).
  EtcdProcessOptions etcd_options_;
  bool durable_ = false;
  // Members log to MemberLogFile(i) instead of the test's stderr.
  bool member_logs_ = false;
  // More rollpackd flags for every member StartMember starts.
  std::vector<std::string> member_args_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> etcd_client_;
  std::string dir_;
  std::vector<std::unique_ptr<DaemonProcess>> members_;
  std::vector<int> ports_;
  std::vector<v1::Sample> all_samples_;
};

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_CLUSTER_FIXTURE_H_
