// Steps over a whole cluster with real processes (docs/cluster.md,
// "Steps"): samples spread over members; a step created on any member
// takes them atomically; every rank's micro-batches from every member are
// byte-identical to what one rollpackd holding all the samples serves; a
// member that is down makes the fetches that need it UNAVAILABLE, naming it,
// and serves the same bytes once it is back.
#include <signal.h>

#include <atomic>
#include <fstream>
#include <optional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "client/cpp/client.h"
#include "client/cpp/trainer_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "proto/wire/deterministic_bytes.h"
#include "testing/exposition.h"
#include "rollpack/v1/member.grpc.pb.h"
#include "testing/cluster_fixture.h"
#include "testing/rank_fetch.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;


// Every micro-batch one rank receives, as deterministic bytes.
absl::StatusOr<std::vector<std::string>> FetchRank(const std::string& address,
                                                   const std::string& step_id,
                                                   const v1::RankCoords& rank,
                                                   Delivery delivery = Delivery::kAuto) {
  ASSIGN_OR_RETURN(std::vector<v1::Microbatch> microbatches,
                   FetchRankMicrobatches(address, step_id, rank, delivery));
  std::vector<std::string> out;
  for (const v1::Microbatch& mb : microbatches) out.push_back(DeterministicBytes(mb));
  return out;
}

v1::CreateStepRequest StepRequest(const std::string& step_id, const std::vector<std::string>& ids,
                                  int num_samples = 0) {
  v1::CreateStepRequest request;
  request.set_step_id(step_id);
  request.set_pool("pool");
  for (const std::string& id : ids) request.add_sample_ids(id);
  request.set_num_samples(num_samples);
  *request.mutable_topology() = HybridTopology();
  return request;
}

// Every sample id a plan lists, in its order.
std::vector<std::string> PlanSampleIds(const v1::Plan& plan) {
  std::vector<std::string> ids;
  for (const auto& mb : plan.microbatches()) {
    for (const auto& g : mb.groups()) ids.insert(ids.end(), g.sample_ids().begin(), g.sample_ids().end());
  }
  return ids;
}

class ClusterStepsTest : public ClusterFixture {
 protected:
  // Bytes of samples member `i` pulled from other members to serve ranks.
  double PulledBytes(size_t i) {
    int port = 0;
    std::ifstream(MetricsPortFile(i)) >> port;
    httplib::Client http("127.0.0.1", port);
    httplib::Result got = http.Get("/metrics");
    EXPECT_TRUE(got && got->status == 200) << "member " << i << " metrics port " << port;
    if (!got) return -1;
    std::map<std::string, double> m = ParseExposition(got->body);
    auto it = m.find("rollpack_cluster_pulled_bytes_total");
    EXPECT_NE(it, m.end());
    return it == m.end() ? -1 : it->second;
  }

  int64_t FreeSamples(size_t via) {
    absl::StatusOr<v1::PoolInfo> pool = Client(via).GetPool("pool");
    EXPECT_TRUE(pool.ok()) << pool.status();
    return pool.ok() ? pool->num_free_samples() : -1;
  }

};


TEST_F(ClusterStepsTest, EveryRankGetsTheSingleServerBytesFromEveryMember) {
  StartThreeWithSamples();
  std::unique_ptr<DaemonProcess> single = StartReference();
  const std::vector<std::string> ids = InterleavedIds(6);
  ASSERT_EQ(all_samples_.front().sample_id().rfind("m0-rollout-", 0), 0u) << all_samples_.front().sample_id();

  absl::StatusOr<v1::StepInfo> info = Client(1).CreateStep(StepRequest("step-a", ids));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->num_samples(), 18);
  RollpackClient reference(MakeChannel(single->address()));
  absl::StatusOr<v1::StepInfo> want_info = reference.CreateStep(StepRequest("step-a", ids));
  ASSERT_TRUE(want_info.ok()) << want_info.status();
  EXPECT_EQ(info->num_microbatches(), want_info->num_microbatches());

  // The step id is the cluster's: taken on every member.
  absl::StatusOr<v1::StepInfo> again = Client(2).CreateStep(StepRequest("step-a", {"m2-rollout-7"}));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();

  absl::StatusOr<v1::Plan> want_plan = reference.GetPlan("step-a");
  ASSERT_TRUE(want_plan.ok());
  want_plan->mutable_stats()->clear_plan_ms();
  for (size_t m = 0; m < 3; ++m) {
    absl::StatusOr<v1::Plan> plan = Client(m).GetPlan("step-a");
    ASSERT_TRUE(plan.ok()) << "member " << m << ": " << plan.status();
    plan->mutable_stats()->clear_plan_ms();
    EXPECT_EQ(DeterministicBytes(*plan), DeterministicBytes(*want_plan)) << "member " << m;
  }
  for (const v1::RankCoords& rank : AllRanks(HybridTopology())) {
    absl::StatusOr<std::vector<std::string>> want = FetchRank(single->address(), "step-a", rank);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_FALSE(want->empty());
    for (size_t m = 0; m < 3; ++m) {
      absl::StatusOr<std::vector<std::string>> got =
          FetchRank(members_[m]->address(), "step-a", rank);
      ASSERT_TRUE(got.ok()) << "member " << m << " rank " << rank.ShortDebugString() << ": "
                            << got.status();
      EXPECT_EQ(*got, *want) << "member " << m << " rank " << rank.ShortDebugString();
    }
  }
  EXPECT_EQ(FreeSamples(0), 24 - 18);

  // num_samples takes the oldest free samples cluster-wide: m0's and m1's
  // last two each (m0 put first), never m2's while older ones are free.
  absl::StatusOr<v1::StepInfo> oldest = Client(2).CreateStep(StepRequest("step-b", {}, 3));
  ASSERT_TRUE(oldest.ok()) << oldest.status();
  absl::StatusOr<v1::Plan> plan_b = Client(0).GetPlan("step-b");
  ASSERT_TRUE(plan_b.ok()) << plan_b.status();
  std::vector<std::string> taken;
  for (const auto& mb : plan_b->microbatches()) {
    for (const auto& g : mb.groups()) taken.insert(taken.end(), g.sample_ids().begin(), g.sample_ids().end());
  }
  std::sort(taken.begin(), taken.end());
  EXPECT_THAT(taken, ::testing::ElementsAre("m0-rollout-6", "m0-rollout-7", "m1-rollout-6"));

  // Released through a member that planned neither: gone everywhere.
  absl::StatusOr<v1::ReleaseStepResponse> released = Client(0).ReleaseStep("step-a");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->released_samples(), 18);
  EXPECT_GT(released->freed_bytes(), 0);
  for (size_t m = 0; m < 3; ++m) {
    EXPECT_EQ(Client(m).GetPlan("step-a").status().code(), absl::StatusCode::kNotFound);
    absl::StatusOr<std::vector<std::string>> gone =
        FetchRank(members_[m]->address(), "step-a", AllRanks(HybridTopology())[0]);
    EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
  }
  absl::StatusOr<v1::PoolInfo> pool = Client(1).GetPool("pool");
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->num_samples(), 24 - 18);
  EXPECT_EQ(pool->num_free_samples(), 24 - 18 - 3);
}

// Issue 19: a rank assembles each micro-batch from the pieces of the members
// holding its samples, byte-identical to the proxied stream and to a single
// server, through any member (one holding none of the samples too), and no
// sample byte crosses between members.
TEST_F(ClusterStepsTest, DirectPullsGiveTheSameBytesAndMoveEachByteOnce) {
  StartThreeWithSamples();
  StartMember(3);  // holds nothing
  std::unique_ptr<DaemonProcess> single = StartReference();
  const std::vector<std::string> ids = InterleavedIds(6);
  ASSERT_TRUE(Client(1).CreateStep(StepRequest("step-d", ids)).ok());
  ASSERT_TRUE(RollpackClient(MakeChannel(single->address())).CreateStep(StepRequest("step-d", ids)).ok());
  int compared = 0;
  for (const v1::RankCoords& rank : AllRanks(HybridTopology())) {
    absl::StatusOr<std::vector<std::string>> want =
        FetchRank(single->address(), "step-d", rank, Delivery::kProxy);
    ASSERT_TRUE(want.ok()) << want.status();
    // The single server serves pieces too: one header piece, the whole micro-batch.
    absl::StatusOr<std::vector<std::string>> single_direct =
        FetchRank(single->address(), "step-d", rank, Delivery::kDirect);
    ASSERT_TRUE(single_direct.ok()) << single_direct.status();
    EXPECT_EQ(*single_direct, *want);
    for (size_t m = 0; m < 4; ++m) {
      absl::StatusOr<std::vector<std::string>> got =
          FetchRank(members_[m]->address(), "step-d", rank, Delivery::kDirect);
      ASSERT_TRUE(got.ok()) << "member " << m << " rank " << rank.ShortDebugString() << ": "
                            << got.status();
      EXPECT_EQ(*got, *want) << "member " << m << " rank " << rank.ShortDebugString();
      ++compared;
    }
  }
  EXPECT_EQ(compared, 4 * static_cast<int>(AllRanks(HybridTopology()).size()));
  for (size_t m = 0; m < 4; ++m) EXPECT_EQ(PulledBytes(m), 0) << "member " << m;

  // The same ranks proxied through the member holding nothing: it pulls
  // every byte it serves (so the metric above could have been non-zero).
  for (const v1::RankCoords& rank : AllRanks(HybridTopology())) {
    absl::StatusOr<std::vector<std::string>> want =
        FetchRank(single->address(), "step-d", rank, Delivery::kProxy);
    absl::StatusOr<std::vector<std::string>> got =
        FetchRank(members_[3]->address(), "step-d", rank, Delivery::kProxy);
    ASSERT_TRUE(want.ok() && got.ok()) << got.status();
    EXPECT_EQ(*got, *want);
  }
  EXPECT_GT(PulledBytes(3), 0);
}

// A member holding samples of a rank's micro-batches goes down: the direct
// stream ends UNAVAILABLE naming it within seconds; a stream that keeps
// resuming delivers the same bytes once the member is back.
TEST_F(ClusterStepsTest, DirectPullsNameADownMemberAndResumeWhenItIsBack) {
  durable_ = true;
  StartThreeWithSamples();
  ASSERT_TRUE(Client(0).CreateStep(StepRequest("s", InterleavedIds(4))).ok());
  const std::vector<v1::RankCoords> ranks = AllRanks(HybridTopology());
  std::vector<std::vector<std::string>> before;
  for (const v1::RankCoords& rank : ranks) {
    absl::StatusOr<std::vector<std::string>> got =
        FetchRank(members_[0]->address(), "s", rank, Delivery::kDirect);
    ASSERT_TRUE(got.ok()) << got.status();
    before.push_back(*got);
  }
  const std::string down = members_[2]->address();
  members_[2]->Kill(SIGKILL);
  int refused = 0;
  for (const v1::RankCoords& rank : ranks) {
    const absl::Time asked = absl::Now();
    absl::StatusOr<std::vector<std::string>> got =
        FetchRank(members_[0]->address(), "s", rank, Delivery::kDirect);
    EXPECT_LT(absl::Now() - asked, absl::Seconds(10)) << "within seconds, never a hang";
    if (got.ok()) continue;
    ++refused;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(down));
  }
  EXPECT_GT(refused, 0);

  // Streams started while the member is down ride the outage out.
  std::vector<std::vector<std::string>> after(ranks.size());
  std::vector<absl::Status> errors(ranks.size());
  std::vector<std::thread> streams;
  for (size_t r = 0; r < ranks.size(); ++r) {
    streams.emplace_back([&, r] {
      TrainerStreamOptions options;
      options.delivery = Delivery::kDirect;
      options.resume_timeout = absl::Seconds(60);
      TrainerStream stream(MakeChannel(members_[1]->address()), "s", ranks[r], options);
      while (true) {
        absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
        if (!next.ok()) {
          errors[r] = next.status();
          return;
        }
        if (!next->has_value()) return;
        after[r].push_back(DeterministicBytes(**next));
      }
    });
  }
  absl::SleepFor(absl::Seconds(1));
  StartMember(2);  // same address and --data-dir
  for (std::thread& t : streams) t.join();
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_TRUE(errors[r].ok()) << "rank " << r << ": " << errors[r];
    EXPECT_EQ(after[r], before[r]) << "rank " << r;
  }
}

TEST_F(ClusterStepsTest, RacingCreateStepsNeverBothTakeASample) {
  StartThreeWithSamples();
  for (int round = 0; round < 4; ++round) {
    // Overlapping sets (m1's samples in both), created through two members.
    const std::string a = absl::StrCat("m0-rollout-", round), b = absl::StrCat("m2-rollout-", round),
                      shared = absl::StrCat("m1-rollout-", round);
    std::atomic<int> won{0};
    std::vector<absl::Status> results(2);
    std::thread t0([&] {
      results[0] = Client(0).CreateStep(StepRequest(absl::StrCat("r", round, "a"), {a, shared})).status();
    });
    std::thread t1([&] {
      results[1] = Client(2).CreateStep(StepRequest(absl::StrCat("r", round, "b"), {shared, b})).status();
    });
    t0.join();
    t1.join();
    for (const absl::Status& s : results) {
      if (s.ok()) {
        ++won;
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
        EXPECT_THAT(std::string(s.message()), HasSubstr(shared));
      }
    }
    // Exactly one: both may not, and one must (nothing else held them).
    EXPECT_EQ(won.load(), 1) << results[0] << " / " << results[1];
    // The loser left nothing held: only the winner's two samples are taken.
    EXPECT_EQ(FreeSamples(1), 24 - 2 * (round + 1));
  }
}

TEST_F(ClusterStepsTest, AnIdOnTwoMembersOrNowhereIsRefusedByName) {
  StartThreeWithSamples();
  // The same id stored by two members (a producer that sent it twice).
  std::vector<v1::Sample> twin = ClusterSamples(1, 99, "twin-");
  ASSERT_TRUE(Client(0).PutSamples("pool", twin).ok());
  ASSERT_TRUE(Client(2).PutSamples("pool", twin).ok());
  absl::StatusOr<v1::StepInfo> step = Client(1).CreateStep(StepRequest("t", {"twin-rollout-0"}));
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition) << step.status();
  EXPECT_THAT(std::string(step.status().message()), HasSubstr("twin-rollout-0"));
  EXPECT_THAT(std::string(step.status().message()), HasSubstr(members_[0]->address()));
  EXPECT_THAT(std::string(step.status().message()), HasSubstr(members_[2]->address()));

  absl::StatusOr<v1::StepInfo> missing = Client(1).CreateStep(StepRequest("t", {"m0-rollout-0", "nope"}));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("\"nope\""));
  EXPECT_EQ(FreeSamples(0), 26) << "a refused step holds nothing";
}

TEST_F(ClusterStepsTest, AStepOverTheSampleLimitIsRefusedWithoutHoldingAnything) {
  member_args_ = {"--max-samples-per-step=10"};
  StartThreeWithSamples();
  v1::CreateStepRequest by_tokens = StepRequest("big", {});
  int64_t tokens = 0;  // every free sample of the three members: 24
  for (const v1::Sample& s : all_samples_) tokens += s.tokens().shape(0);
  by_tokens.set_num_tokens(tokens);
  for (const v1::CreateStepRequest& request :
       {StepRequest("big", {}, 11), StepRequest("big", InterleavedIds(4)), by_tokens}) {
    absl::StatusOr<v1::StepInfo> step = Client(1).CreateStep(request);
    ASSERT_EQ(step.status().code(), absl::StatusCode::kResourceExhausted) << step.status();
    EXPECT_THAT(std::string(step.status().message()), HasSubstr("step \"big\""));
    EXPECT_THAT(std::string(step.status().message()),
                HasSubstr("at most 10 per step (--max-samples-per-step)"));
  }
  EXPECT_EQ(FreeSamples(0), 24) << "a refused step holds nothing";
  absl::StatusOr<v1::StepInfo> step = Client(2).CreateStep(StepRequest("big", {}, 10));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->num_samples(), 10);
  EXPECT_EQ(FreeSamples(0), 14);
}

TEST_F(ClusterStepsTest, AHoldThatIsNeverCommittedIsGivenBack) {
  StartThreeWithSamples();
  // What a planner that died after holding leaves behind.
  auto stub = v1::Member::NewStub(MakeChannel(members_[1]->address()));
  v1::HoldSamplesRequest hold;
  hold.set_step_id("ghost");
  hold.set_pool("pool");
  hold.add_sample_ids("m1-rollout-0");
  hold.set_coordinator("127.0.0.1:1");
  hold.set_attempt(1);
  v1::HoldSamplesResponse unused;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->HoldSamples(&context, hold, &unused).ok());
  EXPECT_EQ(FreeSamples(0), 23);
  // Checked against etcd after the hold grace (10 s): no record, so the
  // member writes a tombstone and frees the sample.
  EXPECT_TRUE(Eventually([&] { return FreeSamples(0) == 24; }, absl::Seconds(20)));
  absl::StatusOr<v1::StepInfo> late = Client(0).CreateStep(StepRequest("ghost", {"m1-rollout-0"}));
  EXPECT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kAborted) << late.status();
}

// Issue 36: anyone who reaches etcd can rewrite a live step's record. A
// sample's length raised in the record made its owner gather rows past the
// sample (another pool's data, then SIGSEGV). Now every fetch that needs the
// sample is refused with DATA_LOSS naming it and both lengths, on every member
// and in both delivery modes, the members stay up, and no rank is served
// bytes other than the true step's.
TEST_F(ClusterStepsTest, AForgedStepRecordIsRefusedNeverServed) {
  StartThreeWithSamples();
  std::unique_ptr<DaemonProcess> single = StartReference();
  const std::vector<std::string> ids = InterleavedIds(6);
  ASSERT_TRUE(Client(1).CreateStep(StepRequest("step-f", ids)).ok());
  ASSERT_TRUE(
      RollpackClient(MakeChannel(single->address())).CreateStep(StepRequest("step-f", ids)).ok());

  const std::string key = "/" + name_ + "/steps/step-f";
  absl::StatusOr<std::optional<std::string>> held = etcd_client_->Get(key);
  ASSERT_TRUE(held.ok() && held->has_value()) << held.status();
  v1::ClusterStepRecord record;
  ASSERT_TRUE(record.ParseFromString(**held));
  const std::string victim = record.sample_ids(0);
  const int64_t real = record.num_tokens(0);
  const int64_t forged = real + 7;  // still inside the ranks' token budget
  record.set_num_tokens(0, forged);
  ASSERT_TRUE(etcd_client_->Put(key, record.SerializeAsString()).ok());

  // Every member reads the forged record (plans are cached by the record's
  // modification revision: AnEditedStepRecordIsReadAgainNeverServedFromTheOldPlan)
  // and plans from it; it may serve micro-batches that do not hold the victim
  // (their samples are whole), none that holds it unless it is the true step's.
  int refused = 0;
  for (Delivery delivery : {Delivery::kProxy, Delivery::kDirect}) {
    for (const v1::RankCoords& rank : AllRanks(HybridTopology())) {
      absl::StatusOr<std::vector<std::string>> want =
          FetchRank(single->address(), "step-f", rank, delivery);
      ASSERT_TRUE(want.ok()) << want.status();
      for (size_t m = 0; m < 3; ++m) {
        absl::StatusOr<std::vector<v1::Microbatch>> got =
            FetchRankMicrobatches(members_[m]->address(), "step-f", rank, delivery);
        if (got.ok()) {
          std::vector<std::string> bytes;
          bool holds_victim = false;
          for (const v1::Microbatch& mb : *got) {
            bytes.push_back(DeterministicBytes(mb));
            for (const std::string& id : mb.sample_ids()) holds_victim |= id == victim;
          }
          if (holds_victim) {
            EXPECT_EQ(bytes, *want) << "member " << m << " rank " << rank.ShortDebugString();
          }
          continue;
        }
        // The owner's refusal, or (direct pulls) members that planned from
        // different records disagreeing on a piece: DATA_LOSS either way.
        EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss)
            << "member " << m << ": " << got.status();
        const std::string message(got.status().message());
        if (message.find("the step's record says") != std::string::npos) {
          EXPECT_THAT(message, HasSubstr(absl::StrCat("sample \"", victim, "\" holds ", real,
                                                      " tokens, the step's record says ",
                                                      forged)));
          ++refused;
        }
      }
    }
  }
  EXPECT_GT(refused, 0) << "no fetch read the forged record";

  // 40,000,000 tokens crashed the owner: a record past the ranks' budget no
  // longer plans, and is refused as the corrupt record it is.
  ASSERT_TRUE(Client(1).CreateStep(StepRequest("step-g", {}, 4)).ok());
  const std::string key_g = "/" + name_ + "/steps/step-g";
  held = etcd_client_->Get(key_g);
  ASSERT_TRUE(held.ok() && held->has_value()) << held.status();
  ASSERT_TRUE(record.ParseFromString(**held));
  record.set_num_tokens(0, 40000000);
  ASSERT_TRUE(etcd_client_->Put(key_g, record.SerializeAsString()).ok());
  for (size_t m : {0, 2}) {
    absl::StatusOr<std::vector<std::string>> got = FetchRank(
        members_[m]->address(), "step-g", AllRanks(HybridTopology())[0], Delivery::kProxy);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    EXPECT_THAT(got.status().message(), HasSubstr("its record does not plan"));
  }
  for (size_t m = 0; m < 3; ++m) {
    EXPECT_TRUE(Client(m).GetPool("pool").ok()) << "member " << m << " went down";
  }
}

// Issue 36: a member's plan of a step was cached by its record's creation
// revision, so once a member had looked the step up (the planner at once),
// a record put over in etcd (by hand, or forged) kept being served from the
// plan of the old bytes, on some members and not others. Now the plan is
// keyed by the record's modification revision: every member reads the new
// bytes, checks them, and uses them or refuses them.
TEST_F(ClusterStepsTest, AnEditedStepRecordIsReadAgainNeverServedFromTheOldPlan) {
  StartThreeWithSamples();
  const std::vector<std::string> ids = InterleavedIds(6);
  ASSERT_TRUE(Client(1).CreateStep(StepRequest("step-e", ids)).ok());
  const v1::RankCoords rank = AllRanks(HybridTopology())[0];
  std::vector<std::vector<std::string>> before(3);
  for (size_t m = 0; m < 3; ++m) {
    absl::StatusOr<v1::Plan> plan = Client(m).GetPlan("step-e");
    ASSERT_TRUE(plan.ok()) << "member " << m << ": " << plan.status();
    ASSERT_EQ(PlanSampleIds(*plan).size(), 18u);
    absl::StatusOr<std::vector<std::string>> got =
        FetchRank(members_[m]->address(), "step-e", rank, Delivery::kProxy);
    ASSERT_TRUE(got.ok()) << "member " << m << ": " << got.status();
    before[m] = *got;
  }
  const std::string key = "/" + name_ + "/steps/step-e";
  absl::StatusOr<std::optional<std::string>> held = etcd_client_->Get(key);
  ASSERT_TRUE(held.ok() && held->has_value()) << held.status();
  const std::string original = **held;
  v1::ClusterStepRecord record;
  ASSERT_TRUE(record.ParseFromString(original));

  // A record as a planner writes it, its last sample left out: every member
  // plans from it now, the planner and those that planned before included.
  v1::ClusterStepRecord shorter = record;
  const std::string dropped = shorter.sample_ids(shorter.sample_ids_size() - 1);
  shorter.mutable_sample_ids()->RemoveLast();
  shorter.mutable_num_tokens()->RemoveLast();
  shorter.mutable_owner()->RemoveLast();
  // Its per-sequence metadata too (lifecycle.md section 6).
  shorter.mutable_group_ids()->RemoveLast();
  shorter.mutable_policy_versions()->RemoveLast();
  for (v1::StepScalar& scalar : *shorter.mutable_scalars()) scalar.mutable_values()->RemoveLast();
  ASSERT_TRUE(etcd_client_->Put(key, shorter.SerializeAsString()).ok());
  for (size_t m = 0; m < 3; ++m) {
    absl::StatusOr<v1::Plan> plan = Client(m).GetPlan("step-e");
    ASSERT_TRUE(plan.ok()) << "member " << m << ": " << plan.status();
    const std::vector<std::string> planned = PlanSampleIds(*plan);
    EXPECT_EQ(planned.size(), 17u) << "member " << m << " planned from the old record";
    EXPECT_THAT(planned, ::testing::Not(::testing::Contains(dropped))) << "member " << m;
  }

  // A length past the ranks' budget: refused on every member, as a record
  // read for the first time is, for the plan and for both delivery modes.
  v1::ClusterStepRecord forged = record;
  forged.set_num_tokens(0, 40000000);
  ASSERT_TRUE(etcd_client_->Put(key, forged.SerializeAsString()).ok());
  for (size_t m = 0; m < 3; ++m) {
    absl::StatusOr<v1::Plan> plan = Client(m).GetPlan("step-e");
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kDataLoss) << "member " << m << ": "
                                                                 << plan.status();
    EXPECT_THAT(plan.status().message(), HasSubstr("its record does not plan"));
    for (Delivery delivery : {Delivery::kProxy, Delivery::kDirect}) {
      absl::StatusOr<std::vector<std::string>> got =
          FetchRank(members_[m]->address(), "step-e", rank, delivery);
      EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << "member " << m << ": "
                                                                  << got.status();
    }
  }

  // The true bytes back (yet another revision): the step as it was.
  ASSERT_TRUE(etcd_client_->Put(key, original).ok());
  for (size_t m = 0; m < 3; ++m) {
    absl::StatusOr<v1::Plan> plan = Client(m).GetPlan("step-e");
    ASSERT_TRUE(plan.ok()) << "member " << m << ": " << plan.status();
    EXPECT_EQ(PlanSampleIds(*plan).size(), 18u);
    absl::StatusOr<std::vector<std::string>> got =
        FetchRank(members_[m]->address(), "step-e", rank, Delivery::kProxy);
    ASSERT_TRUE(got.ok()) << "member " << m << ": " << got.status();
    EXPECT_EQ(*got, before[m]) << "member " << m;
  }
  absl::StatusOr<v1::ReleaseStepResponse> released = Client(2).ReleaseStep("step-e");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->released_samples(), 18);
}

// Issue 36: a step record deleted from etcd by hand (no ReleaseStep) left
// its samples held on their owners until a restart. Now the owners release
// them once the record has been gone for the hold grace.
TEST_F(ClusterStepsTest, AStepRecordDeletedByHandReleasesItsHolds) {
  StartThreeWithSamples();
  ASSERT_TRUE(Client(1).CreateStep(StepRequest("step-d", InterleavedIds(6))).ok());
  absl::StatusOr<v1::PoolInfo> before = Client(0).GetPool("pool");
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->num_samples(), 24);
  ASSERT_EQ(before->num_free_samples(), 6);
  ASSERT_TRUE(etcd_client_->Delete("/" + name_ + "/steps/step-d").ok());
  // Released as a ReleaseStep releases: the step's 18 samples are consumed.
  EXPECT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::PoolInfo> pool = Client(0).GetPool("pool");
        return pool.ok() && pool->num_samples() == 6;
      },
      absl::Seconds(20)));
  absl::StatusOr<v1::PoolInfo> after = Client(2).GetPool("pool");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->num_free_samples(), 6);
}

TEST_F(ClusterStepsTest, ADownMemberIsNamedAndServesTheSameBytesWhenBack) {
  durable_ = true;
  StartThreeWithSamples();
  const std::vector<std::string> ids = InterleavedIds(4);
  ASSERT_TRUE(Client(0).CreateStep(StepRequest("s", ids)).ok());
  const std::vector<v1::RankCoords> ranks = AllRanks(HybridTopology());
  std::map<int, std::vector<std::string>> before;
  // Proxied: member 0 pulls (and keeps) every rank's samples.
  for (size_t r = 0; r < ranks.size(); ++r) {
    absl::StatusOr<std::vector<std::string>> got =
        FetchRank(members_[0]->address(), "s", ranks[r], Delivery::kProxy);
    ASSERT_TRUE(got.ok()) << got.status();
    before[r] = *got;
  }
  ASSERT_TRUE(Client(1).CreateStep(StepRequest("t", {"m1-rollout-5", "m2-rollout-5"})).ok());

  // Under load: member 0 (which pulled every rank's samples above) keeps
  // streaming the step to trainers while member 2 is killed and restarted.
  std::atomic<bool> stop{false};
  std::atomic<int> streamed{0};
  absl::Status load_error;
  std::thread load([&] {
    while (!stop.load()) {
      for (size_t r = 0; r < ranks.size() && !stop.load(); ++r) {
        absl::StatusOr<std::vector<std::string>> got =
            FetchRank(members_[0]->address(), "s", ranks[r], Delivery::kProxy);
        if (!got.ok() || *got != before[r]) {
          load_error = got.ok() ? absl::DataLossError("other bytes") : got.status();
          return;
        }
        ++streamed;
      }
    }
  });

  const std::string down = members_[2]->address();
  members_[2]->Kill(SIGKILL);
  // A member that has not served the step yet must pull m2's samples for
  // the ranks that receive some (at least one data-parallel rank does).
  int refused = 0;
  for (const v1::RankCoords& rank : ranks) {
    const absl::Time asked = absl::Now();
    absl::StatusOr<std::vector<std::string>> got = FetchRank(members_[1]->address(), "s", rank);
    EXPECT_LT(absl::Now() - asked, absl::Seconds(10)) << "within seconds, never a hang";
    if (got.ok()) continue;
    ++refused;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
    EXPECT_THAT(std::string(got.status().message()), HasSubstr(down));
  }
  EXPECT_GT(refused, 0);

  // Released while m2 is down: the rest is freed now, m2's share later.
  absl::StatusOr<v1::ReleaseStepResponse> released = Client(0).ReleaseStep("t");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->released_samples(), 1);

  StartMember(2);  // same address and --data-dir
  for (size_t r = 0; r < ranks.size(); ++r) {
    absl::StatusOr<std::vector<std::string>> got = FetchRank(members_[1]->address(), "s", ranks[r]);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, before[r]) << "rank " << r;
  }
  stop = true;
  load.join();
  EXPECT_TRUE(load_error.ok()) << load_error;
  EXPECT_GT(streamed.load(), 0);
  // m2 finished the pending release of "t": its sample m2-rollout-5 is gone, and
  // its samples of "s" are still held, not given back.
  EXPECT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::PoolInfo> pool = Client(2).GetPool("pool");
        return pool.ok() && pool->num_samples() == 24 - 2 &&
               pool->num_free_samples() == 24 - 2 - 12;
      },
      absl::Seconds(20)));
}

TEST_F(ClusterStepsTest, StepsKeepServingWhileEtcdIsAway) {
  StartThreeWithSamples();
  const std::vector<std::string> ids = InterleavedIds(2);
  ASSERT_TRUE(Client(0).CreateStep(StepRequest("s", ids)).ok());
  const v1::RankCoords rank = AllRanks(HybridTopology())[0];
  absl::StatusOr<std::vector<std::string>> before = FetchRank(members_[1]->address(), "s", rank);
  ASSERT_TRUE(before.ok()) << before.status();

  etcd_->Stop();
  absl::StatusOr<std::vector<std::string>> during = FetchRank(members_[1]->address(), "s", rank);
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_EQ(*during, *before);
  absl::StatusOr<v1::StepInfo> refused = Client(1).CreateStep(StepRequest("u", {"m0-rollout-7"}));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();

  ASSERT_TRUE(etcd_->Restart().ok());
  EXPECT_TRUE(Eventually([&] { return Client(1).CreateStep(StepRequest("u", {"m0-rollout-7"})).ok(); },
                         absl::Seconds(20)));
}

TEST_F(ClusterStepsTest, AMemberJoiningMidRunTakesPartInTheNextStep) {
  StartThreeWithSamples();
  ASSERT_TRUE(Client(0).CreateStep(StepRequest("before", {}, 20)).ok());
  StartMember(3);
  ASSERT_TRUE(Client(3).PutSamples("pool", ClusterSamples(6, 40, "m3-")).ok());
  // 4 free on the first three, 6 on the newcomer: a step of 10 needs all.
  absl::StatusOr<v1::StepInfo> step = Client(1).CreateStep(StepRequest("after", {}, 10));
  ASSERT_TRUE(step.ok()) << step.status();
  const v1::RankCoords rank = AllRanks(HybridTopology())[0];
  absl::StatusOr<std::vector<std::string>> via_old = FetchRank(members_[0]->address(), "after", rank);
  absl::StatusOr<std::vector<std::string>> via_new = FetchRank(members_[3]->address(), "after", rank);
  ASSERT_TRUE(via_old.ok()) << via_old.status();
  ASSERT_TRUE(via_new.ok()) << via_new.status();
  EXPECT_EQ(*via_old, *via_new);
  EXPECT_EQ(FreeSamples(3), 0);
}

// An etcd that takes at most 64 KiB a request (--max-request-bytes; 1.5 MiB
// by default), so that a step record past it needs few samples.
class ClusterSmallEtcdTest : public ClusterStepsTest {
 protected:
  ClusterSmallEtcdTest() { etcd_options_.max_request_bytes = 64 << 10; }
};

// Issue 36: a step whose record etcd does not take is RESOURCE_EXHAUSTED
// naming the record's size and the limit, and holds nothing. Past etcd's
// limit plus its 512 KiB gRPC allowance, etcd's gRPC server refuses the
// message itself, which was reported UNAVAILABLE (as if etcd were away).
TEST_F(ClusterSmallEtcdTest, AStepRecordTooLargeForEtcdIsResourceExhaustedAndHoldsNothing) {
  for (size_t i = 0; i < 3; ++i) StartMember(i);
  ASSERT_TRUE(Client(0).RegisterModel("pool", ClusterModel()).ok());
  // Ids of about 900 bytes: about 920 bytes of record a sample.
  for (size_t i = 0; i < 3; ++i) {
    for (int batch = 0; batch < 3; ++batch) {
      std::vector<v1::Sample> samples = ClusterSamples(
          100, 50 + 10 * i + batch, absl::StrCat(std::string(900, 'x'), "-m", i, "-b", batch, "-"));
      absl::StatusOr<v1::PutSamplesResponse> put = Client(i).PutSamples("pool", samples);
      ASSERT_TRUE(put.ok()) << put.status();
    }
  }
  ASSERT_EQ(FreeSamples(0), 900);
  struct Case {
    int num_samples;
    std::string limit;  // what the refusal says of etcd's limit
  };
  // ~92 KB: etcd's own refusal ("request is too large", no number in it);
  // ~830 KB: gRPC's, which tells the limit.
  for (const Case& c : {Case{100, "--max-request-bytes"},
                        Case{900, "etcd's request limit of 65536 bytes"}}) {
    const absl::Time asked = absl::Now();
    absl::StatusOr<v1::StepInfo> step =
        Client(1).CreateStep(StepRequest(absl::StrCat("big-", c.num_samples), {}, c.num_samples));
    EXPECT_LT(absl::Now() - asked, absl::Seconds(5)) << "refused at once, not retried";
    ASSERT_EQ(step.status().code(), absl::StatusCode::kResourceExhausted) << step.status();
    const std::string message(step.status().message());
    EXPECT_THAT(message, HasSubstr(absl::StrCat("step \"big-", c.num_samples, "\": its record (",
                                                c.num_samples, " samples) is ")));
    EXPECT_THAT(message, ::testing::ContainsRegex("is [0-9]+ bytes, more than etcd takes"));
    EXPECT_THAT(message, HasSubstr(c.limit));
    EXPECT_EQ(FreeSamples(2), 900) << "a refused step holds nothing: " << message;
  }
  // A record that fits: the step is made and served as any other.
  absl::StatusOr<v1::StepInfo> fits = Client(1).CreateStep(StepRequest("fits", {}, 40));
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(FreeSamples(0), 860);
  absl::StatusOr<std::vector<std::string>> got =
      FetchRank(members_[2]->address(), "fits", AllRanks(HybridTopology())[0]);
  ASSERT_TRUE(got.ok()) << got.status();
}

}  // namespace
}  // namespace rollpack
