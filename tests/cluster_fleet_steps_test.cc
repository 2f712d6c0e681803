// Operating a cluster's steps with real processes (docs/cluster.md, "Data
// loss", "Counting steps", "Step expiry"): a member restarted without its
// data while a live step holds samples there answers DATA_LOSS naming them,
// logs them and counts them once (restarted with its data it serves as
// before); every count of live steps is the cluster's, however many members
// hold a step's samples; --step-ttl releases cluster steps nobody fetches.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "proto/wire/deterministic_bytes.h"
#include "testing/cluster_fixture.h"
#include "testing/exposition.h"
#include "testing/rank_fetch.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

v1::CreateStepRequest StepRequest(const std::string& step_id, const std::vector<std::string>& ids) {
  v1::CreateStepRequest request;
  request.set_step_id(step_id);
  request.set_pool("pool");
  for (const std::string& id : ids) request.add_sample_ids(id);
  *request.mutable_topology() = HybridTopology();
  return request;
}

class ClusterFleetStepsTest : public ClusterFixture {
 protected:
  // Every sample line of member `i`'s /metrics, "name{labels}" -> value.
  std::map<std::string, double> Metrics(size_t i) {
    int port = 0;
    std::ifstream(MetricsPortFile(i)) >> port;
    httplib::Client http("127.0.0.1", port);
    httplib::Result got = http.Get("/metrics");
    EXPECT_TRUE(got && got->status == 200) << "member " << i << " metrics port " << port;
    return got ? ParseExposition(got->body) : std::map<std::string, double>();
  }
  double Metric(size_t i, const std::string& line) {
    std::map<std::string, double> m = Metrics(i);
    auto it = m.find(line);
    return it == m.end() ? -1 : it->second;
  }
  std::string Log(size_t i) {
    std::stringstream text;
    text << std::ifstream(MemberLogFile(i)).rdbuf();
    return text.str();
  }
};

constexpr char kLost[] = "rollpack_cluster_lost_samples_total{pool=\"pool\"}";

TEST_F(ClusterFleetStepsTest, AMemberRestartedEmptyAnswersDataLossNamingTheSamples) {
  durable_ = true;
  member_logs_ = true;
  StartThreeWithSamples();
  // m2 holds 4 of the step's 12 samples: m2-rollout-0..3.
  ASSERT_TRUE(Client(0).CreateStep(StepRequest("s", InterleavedIds(4))).ok());
  const std::string lost_member = members_[2]->address();
  members_[2]->Kill(SIGKILL);
  std::filesystem::remove_all(absl::StrCat(dir_, "/data2"));
  StartMember(2);  // same address, an empty --data-dir

  for (Delivery delivery : {Delivery::kProxy, Delivery::kDirect}) {
    int refused = 0;
    for (const v1::RankCoords& rank : AllRanks(HybridTopology())) {
      const absl::Time asked = absl::Now();
      absl::StatusOr<std::vector<v1::Microbatch>> got =
          FetchRankMicrobatches(members_[0]->address(), "s", rank, delivery);
      EXPECT_LT(absl::Now() - asked, absl::Seconds(10)) << "within seconds, never a wait";
      if (got.ok()) continue;
      ++refused;
      EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
      const std::string message(got.status().message());
      EXPECT_THAT(message, HasSubstr(lost_member));
      EXPECT_THAT(message, HasSubstr("\"m2-rollout-"));
      EXPECT_THAT(message, HasSubstr("4 of the step's samples held there are lost"));
    }
    // Every data-parallel rank receives some of m2's samples or another's:
    // at least one needs m2's.
    EXPECT_GT(refused, 0) << (delivery == Delivery::kProxy ? "proxy" : "direct");
  }
  // Counted once, by the member that lost them; logged naming them.
  EXPECT_TRUE(Eventually([&] { return Metric(2, kLost) == 4; }, absl::Seconds(10)))
      << Metric(2, kLost);
  EXPECT_EQ(Metric(0, kLost), 0);
  EXPECT_EQ(Metric(1, kLost), 0);
  const std::string log = Log(2);
  EXPECT_THAT(log, HasSubstr("step \"s\" of pool \"pool\": 4 of its samples"));
  EXPECT_THAT(log, HasSubstr("\"m2-rollout-0\""));

  // Restarted empty once more: reported again, never counted twice.
  members_[2]->Kill(SIGKILL);
  std::filesystem::remove_all(absl::StrCat(dir_, "/data2"));
  StartMember(2);
  EXPECT_TRUE(Eventually([&] { return Log(2).find("reported before") != std::string::npos; },
                         absl::Seconds(10)));
  EXPECT_LE(Metric(2, kLost), 0);  // counted by the start that found it first
  // The step is released as usual, and its id can be used again.
  ASSERT_TRUE(Client(1).ReleaseStep("s").ok());
}

TEST_F(ClusterFleetStepsTest, AMemberRestartedWithItsDataServesAsBefore) {
  durable_ = true;
  StartThreeWithSamples();
  ASSERT_TRUE(Client(0).CreateStep(StepRequest("s", InterleavedIds(4))).ok());
  std::vector<std::vector<v1::Microbatch>> before;
  for (const v1::RankCoords& rank : AllRanks(HybridTopology())) {
    absl::StatusOr<std::vector<v1::Microbatch>> got =
        FetchRankMicrobatches(members_[1]->address(), "s", rank, Delivery::kDirect);
    ASSERT_TRUE(got.ok()) << got.status();
    before.push_back(*got);
  }
  members_[2]->Kill(SIGKILL);
  StartMember(2);  // same address and --data-dir
  const std::vector<v1::RankCoords> ranks = AllRanks(HybridTopology());
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (Delivery delivery : {Delivery::kProxy, Delivery::kDirect}) {
      absl::StatusOr<std::vector<v1::Microbatch>> got =
          FetchRankMicrobatches(members_[0]->address(), "s", ranks[r], delivery);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->size(), before[r].size());
      for (size_t k = 0; k < got->size(); ++k) {
        EXPECT_EQ(DeterministicBytes((*got)[k]), DeterministicBytes(before[r][k]))
            << "rank " << r << " micro-batch " << k;
      }
    }
  }
  absl::SleepFor(absl::Seconds(2));  // its start-up check has run
  EXPECT_EQ(Metric(2, kLost), 0);
}

constexpr char kLiveSteps[] = "rollpack_live_steps";
constexpr char kPoolLiveSteps[] = "rollpack_pool_live_steps{pool=\"pool\"}";
constexpr char kHeldSteps[] = "rollpack_pool_held_steps{pool=\"pool\"}";

TEST_F(ClusterFleetStepsTest, AStepOverSeveralMembersIsOneLiveStepEverywhere) {
  StartThreeWithSamples();
  // Samples of all three members.
  ASSERT_TRUE(Client(0).CreateStep(StepRequest("s", InterleavedIds(2))).ok());
  for (size_t i = 0; i < 3; ++i) {
    absl::StatusOr<v1::PoolInfo> pool = Client(i).GetPool("pool");
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_EQ(pool->num_live_steps(), 1) << "through member " << i;  // before: 3
    absl::StatusOr<v1::ListStepsResponse> listed = Client(i).ListSteps("pool");
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->steps_size(), 1);
    EXPECT_EQ(listed->steps(0).holders_size(), 3);
    EXPECT_EQ(listed->steps(0).stage_layers_size(), 2);  // pp 2
    int32_t held = 0;
    for (const v1::StepHolder& h : listed->steps(0).holders()) held += h.num_samples();
    EXPECT_EQ(held, 6);
    // Every member reports the cluster's count (dashboards take max()); what
    // it holds samples for is rollpack_pool_held_steps.
    EXPECT_TRUE(Eventually(
        [&] {
          return Metric(i, kLiveSteps) == 1 && Metric(i, kPoolLiveSteps) == 1 &&
                 Metric(i, kHeldSteps) == 1;
        },
        absl::Seconds(5)))
        << "member " << i << ": live " << Metric(i, kLiveSteps) << " (before: 0), pool "
        << Metric(i, kPoolLiveSteps) << ", held " << Metric(i, kHeldSteps);
  }
  ASSERT_TRUE(Client(2).ReleaseStep("s").ok());
  EXPECT_EQ(Client(1).GetPool("pool")->num_live_steps(), 0);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(Eventually([&] { return Metric(i, kPoolLiveSteps) == 0; }, absl::Seconds(5)));
  }
}

TEST_F(ClusterFleetStepsTest, AGroupOverMembersIsCompleteAndAnOverFullOneIsNotIncomplete) {
  for (size_t i = 0; i < 2; ++i) StartMember(i);
  ASSERT_TRUE(Client(0).RegisterModel("pool", ClusterModel()).ok());
  // Group "h" (size 2) has one sample on each member: complete. Group "g"
  // (size 4) has 3 on member 0 and 2 on member 1: more than its size, which
  // no member can refuse alone.
  auto put = [&](size_t member, const std::string& group, int size, int count, uint64_t seed) {
    std::vector<v1::Sample> samples =
        ClusterSamples(count, seed, absl::StrCat("m", member, "-", group, "-"));
    for (v1::Sample& s : samples) {
      s.set_group_id(group);
      s.set_group_size(size);
    }
    absl::StatusOr<v1::PutSamplesResponse> put = Client(member).PutSamples("pool", samples);
    ASSERT_TRUE(put.ok()) << put.status();
  };
  put(0, "h", 2, 1, 1);
  put(1, "h", 2, 1, 2);
  put(0, "g", 4, 3, 3);
  put(1, "g", 4, 2, 4);
  // Group "f" (size 2) is complete on member 1, which lists only the groups
  // incomplete there, and has one sample more on member 0: over-full too.
  put(1, "f", 2, 2, 5);
  put(0, "f", 2, 1, 6);
  // Group "e" (size 3): incomplete over the members, complete on none.
  put(0, "e", 3, 1, 7);
  put(1, "e", 3, 1, 8);
  for (size_t i = 0; i < 2; ++i) {
    absl::StatusOr<v1::PoolInfo> pool = Client(i).GetPool("pool");
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_EQ(pool->num_complete_groups(), 1) << "\"h\" only, through member " << i;
    EXPECT_EQ(pool->num_incomplete_groups(), 1) << "\"e\" only, through member " << i;
    // SetPolicyVersion answers with the same counts.
    absl::StatusOr<v1::PoolInfo> set = Client(i).SetPolicyVersion("pool", 1);
    ASSERT_TRUE(set.ok()) << set.status();
    EXPECT_EQ(set->num_complete_groups(), 1) << "through member " << i;
    EXPECT_EQ(set->num_incomplete_groups(), 1) << "through member " << i;
  }
  // Neither over-full group is selectable; "h" is.
  v1::CreateStepRequest groups;
  groups.set_step_id("groups");
  groups.set_pool("pool");
  groups.set_num_groups(2);
  *groups.mutable_topology() = HybridTopology();
  const absl::Status refused = Client(0).CreateStep(groups).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("has 1 complete free groups"));
}

TEST_F(ClusterFleetStepsTest, StepTtlReleasesAClusterStepNobodyFetchesOnAnyMember) {
  member_args_ = {"--step-ttl=3s"};
  StartThreeWithSamples();
  ASSERT_TRUE(Client(0).CreateStep(StepRequest("idle", InterleavedIds(2))).ok());
  ASSERT_TRUE(Client(1).CreateStep(StepRequest("fetched", {"m0-rollout-5", "m2-rollout-5"})).ok());
  // "fetched" is fetched through the member whose id sorts last (never the
  // one that expires steps, the first), every second.
  size_t last = 0;
  for (size_t i = 1; i < 3; ++i) {
    if (members_[i]->address() > members_[last]->address()) last = i;
  }
  const v1::RankCoords rank = AllRanks(HybridTopology())[0];
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Seconds(7)) {
    absl::StatusOr<std::vector<v1::Microbatch>> got =
        FetchRankMicrobatches(members_[last]->address(), "fetched", rank, Delivery::kProxy);
    ASSERT_TRUE(got.ok()) << got.status();
    absl::SleepFor(absl::Seconds(1));
  }
  absl::StatusOr<v1::ListStepsResponse> listed = Client(0).ListSteps("pool");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->steps_size(), 1) << "idle expired after 3 s, fetched kept";
  EXPECT_EQ(listed->steps(0).step_id(), "fetched");
  // Nobody fetches it any more: it goes too.
  EXPECT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::ListStepsResponse> now = Client(2).ListSteps("pool");
        return now.ok() && now->steps_size() == 0;
      },
      absl::Seconds(10)));
  double expired = 0;
  for (size_t i = 0; i < 3; ++i) expired += Metric(i, "rollpack_steps_expired_total");
  EXPECT_EQ(expired, 2) << "counted once each, on the member that released them";
  EXPECT_EQ(Client(1).GetPool("pool")->num_free_samples(), 24 - 8);
}

}  // namespace
}  // namespace rollpack
