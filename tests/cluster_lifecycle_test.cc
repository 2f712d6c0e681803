// The sample lifecycle over a cluster with real processes
// (../shared/spec/lifecycle.md: "Everything holds cluster-wide"): a GRPO
// group's samples on several members is one group; whole groups, token
// budgets, staleness, reuse and options hold over every member.
#include <signal.h>
#include <sys/types.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/cluster_fixture.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

v1::Topology Topo() {
  v1::Topology t;
  t.set_dp(2);
  t.set_max_tokens_per_rank(4096);
  return t;
}

v1::CreateStepRequest Request(const std::string& step_id) {
  v1::CreateStepRequest request;
  request.set_step_id(step_id);
  request.set_pool("pool");
  *request.mutable_topology() = Topo();
  return request;
}

class ClusterLifecycleTest : public ClusterFixture {
 protected:
  void StartThree(const v1::PoolOptions& options) {
    for (size_t i = 0; i < 3; ++i) StartMember(i);
    v1::RegisterModelRequest request;
    request.set_pool("pool");
    *request.mutable_model() = ClusterModel();
    *request.mutable_options() = options;
    ASSERT_TRUE(Client(0).RegisterModel(request).ok());
  }

  // `count` samples of group `group` (of `size`) put on member `member`.
  void PutGroup(size_t member, const std::string& group, int size, int first, int count,
                int64_t version = 0) {
    std::vector<v1::Sample> samples =
        ClusterSamples(count, 100 + member * 10 + first, absl::StrCat(group, "-", first, "-"));
    for (v1::Sample& s : samples) {
      s.set_group_id(group);
      s.set_group_size(size);
      s.set_policy_version(version);
    }
    absl::StatusOr<v1::PutSamplesResponse> put = Client(member).PutSamples("pool", samples);
    ASSERT_TRUE(put.ok()) << put.status();
    for (const v1::Sample& s : samples) ids_[group].push_back(s.sample_id());
  }

  std::vector<std::string> PlanIds(size_t via, const std::string& step_id) {
    absl::StatusOr<v1::Plan> plan = Client(via).GetPlan(step_id);
    EXPECT_TRUE(plan.ok()) << plan.status();
    std::vector<std::string> out;
    if (!plan.ok()) return out;
    for (const auto& mb : plan->microbatches()) {
      for (const auto& g : mb.groups()) out.insert(out.end(), g.sample_ids().begin(), g.sample_ids().end());
    }
    return out;
  }

  // The pid of member `i`'s process, found by its --metrics-port-file
  // (unique to the member and the test); -1 when none is found.
  pid_t MemberPid(size_t i) const {
    const std::string flag = "--metrics-port-file=" + MetricsPortFile(i);
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
      const std::string name = entry.path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream in(entry.path() / "cmdline", std::ios::binary);
      const std::string cmdline((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
      // NUL-separated arguments.
      for (size_t start = 0; start < cmdline.size();) {
        size_t end = cmdline.find('\0', start);
        if (end == std::string::npos) end = cmdline.size();
        if (cmdline.compare(start, end - start, flag) == 0) {
          return static_cast<pid_t>(std::stol(name));
        }
        start = end + 1;
      }
    }
    return -1;
  }

  std::map<std::string, std::vector<std::string>> ids_;
};

TEST_F(ClusterLifecycleTest, GroupsSpreadOverMembersAreTakenWholeAndCountedOnce) {
  StartThree(v1::PoolOptions());
  // Group "a" on members 0 and 2; group "b" on member 1 alone; group "c"
  // incomplete over 0 and 1.
  PutGroup(0, "a", 4, 0, 2);
  PutGroup(1, "b", 3, 0, 3);
  PutGroup(2, "a", 4, 2, 2);
  PutGroup(0, "c", 4, 0, 1);
  PutGroup(1, "c", 4, 1, 1);
  absl::StatusOr<v1::PoolInfo> pool = Client(1).GetPool("pool");
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->num_complete_groups(), 2);
  EXPECT_EQ(pool->num_incomplete_groups(), 1);
  EXPECT_EQ(pool->incomplete_group_shares_size(), 0);  // summed, not listed

  // A plain oldest-7 step holds "a" (two members) and "b" whole: counted.
  v1::CreateStepRequest plain = Request("plain");
  plain.set_num_samples(7);
  plain.set_reuse_samples(true);
  absl::StatusOr<v1::StepInfo> counted = Client(1).CreateStep(plain);
  ASSERT_TRUE(counted.ok()) << counted.status();
  EXPECT_EQ(counted->num_groups(), 2);
  ASSERT_EQ(Client(1).ReleaseStep("plain")->returned_samples(), 7);

  // Oldest complete first: "b" completed before "a".
  v1::CreateStepRequest groups = Request("g1");
  groups.set_num_groups(1);
  absl::StatusOr<v1::StepInfo> step = Client(2).CreateStep(groups);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->num_groups(), 1);
  EXPECT_THAT(PlanIds(0, "g1"), UnorderedElementsAreArray(ids_["b"]));
  groups.set_step_id("g2");
  step = Client(0).CreateStep(groups);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT(PlanIds(1, "g2"), UnorderedElementsAreArray(ids_["a"]));
  groups.set_step_id("g3");
  absl::StatusOr<v1::StepInfo> none = Client(1).CreateStep(groups);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("0 complete free groups"));

  // Explicit ids covering part of "c" (its samples on two members).
  v1::CreateStepRequest partial = Request("c1");
  partial.add_sample_ids(ids_["c"][0]);
  partial.add_sample_ids(ids_["c"][1]);
  partial.set_whole_groups(true);
  absl::StatusOr<v1::StepInfo> refused = Client(2).CreateStep(partial);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("group \"c\" is not covered whole: 2 of its 4 samples are missing"));
  EXPECT_EQ(Client(0).GetPool("pool")->num_free_samples(), 2);
}

TEST_F(ClusterLifecycleTest, PolicyVersionReachesEveryMemberAndStaleSamplesGo) {
  v1::PoolOptions options;
  options.set_max_staleness(1);
  options.set_drop_stale(true);
  StartThree(options);
  PutGroup(0, "x", 0, 0, 2, /*version=*/1);
  PutGroup(1, "y", 0, 0, 2, /*version=*/1);
  PutGroup(2, "z", 0, 0, 2, /*version=*/3);
  // Another member adopted the pool with the cluster's options.
  absl::StatusOr<v1::PoolInfo> info = Client(2).SetPolicyVersion("pool", 3);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->policy_version(), 3);
  EXPECT_EQ(info->num_stale_dropped(), 4);
  EXPECT_EQ(info->num_samples(), 2);
  absl::StatusOr<v1::PoolInfo> pool = Client(0).GetPool("pool");
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->policy_version(), 3);
  EXPECT_EQ(pool->options().max_staleness(), 1);
  for (const v1::MemberPoolInfo& m : pool->members()) EXPECT_TRUE(m.error().empty()) << m.error();
  // Other options on the cluster's pool are refused by any member.
  v1::RegisterModelRequest other;
  other.set_pool("pool");
  *other.mutable_model() = ClusterModel();
  other.mutable_options()->set_max_uses(2);
  EXPECT_EQ(Client(1).RegisterModel(other).status().code(), absl::StatusCode::kFailedPrecondition);
  // Issue 36: an invalid version is INVALID_ARGUMENT through every member, as
  // on a single server (it was UNAVAILABLE through a member whose peer
  // answered first), and a member's refusal keeps its code.
  for (size_t m = 0; m < 3; ++m) {
    absl::StatusOr<v1::PoolInfo> negative = Client(m).SetPolicyVersion("pool", -1);
    EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument)
        << "member " << m << ": " << negative.status();
  }
}

TEST_F(ClusterLifecycleTest, ReuseStepsReturnSamplesOnEveryOwnerAndTokenBudgetsSpanMembers) {
  v1::PoolOptions options;
  options.set_max_uses(2);
  StartThree(options);
  PutGroup(0, "u", 0, 0, 2);
  PutGroup(1, "v", 0, 0, 2);
  int64_t total = 0;
  absl::StatusOr<v1::PoolInfo> pool = Client(0).GetPool("pool");
  ASSERT_TRUE(pool.ok());
  ASSERT_EQ(pool->num_samples(), 4);
  for (int epoch = 0; epoch < 2; ++epoch) {
    v1::CreateStepRequest request = Request(absl::StrCat("e", epoch));
    request.set_num_samples(4);
    request.set_reuse_samples(true);
    absl::StatusOr<v1::StepInfo> step = Client(2).CreateStep(request);
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_TRUE(step->reuse_samples());
    total = step->num_tokens();
    absl::StatusOr<v1::ReleaseStepResponse> released = Client(epoch).ReleaseStep(request.step_id());
    ASSERT_TRUE(released.ok()) << released.status();
    EXPECT_EQ(released->returned_samples(), epoch == 0 ? 4 : 0);
    EXPECT_EQ(released->released_samples(), epoch == 0 ? 0 : 4);
  }
  EXPECT_GT(total, 0);
  EXPECT_EQ(Client(1).GetPool("pool")->num_samples(), 0);

  // A budget over samples on two members, and its refusal naming the total.
  PutGroup(0, "w", 0, 0, 2);
  PutGroup(1, "t", 0, 0, 2);
  const int64_t free_tokens = [&] {
    v1::CreateStepRequest probe = Request("probe");
    probe.set_num_tokens(int64_t{1} << 40);
    absl::StatusOr<v1::StepInfo> refused = Client(0).CreateStep(probe);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string message(refused.status().message());
    const size_t at = message.find(" has ");
    return at == std::string::npos ? int64_t{-1} : std::stoll(message.substr(at + 5));
  }();
  ASSERT_GT(free_tokens, 0);
  v1::CreateStepRequest budget = Request("budget");
  budget.set_num_tokens(free_tokens);
  absl::StatusOr<v1::StepInfo> step = Client(2).CreateStep(budget);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->num_samples(), 4);
  EXPECT_EQ(step->num_tokens(), free_tokens);
}

TEST_F(ClusterLifecycleTest, AGroupIncompleteOverTheClusterIsDroppedAndOneCompleteIsNot) {
  v1::PoolOptions options;
  options.set_incomplete_group_timeout_ms(500);
  StartThree(options);
  PutGroup(0, "done", 2, 0, 1);
  PutGroup(1, "done", 2, 1, 1);  // complete only over two members
  PutGroup(2, "lost", 3, 0, 1);  // incomplete over two members
  PutGroup(0, "lost", 3, 1, 1);
  // Complete on member 0, one sample more on member 2: over-full. Member 2
  // alone sees it incomplete; the cluster holds more than its size, so it
  // is never dropped (nor member 0's complete share with it).
  PutGroup(0, "over", 2, 0, 2);
  PutGroup(2, "over", 2, 2, 1);
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::PoolInfo> pool = Client(0).GetPool("pool");
        return pool.ok() && pool->num_incomplete_groups_dropped() == 1;
      },
      absl::Seconds(15)));
  // Both members dropped their share; one counted it. Checks go on.
  absl::SleepFor(absl::Seconds(3));
  for (size_t via = 0; via < 3; ++via) {
    absl::StatusOr<v1::PoolInfo> pool = Client(via).GetPool("pool");
    ASSERT_TRUE(pool.ok());
    EXPECT_EQ(pool->num_incomplete_groups_dropped(), 1) << "through member " << via;
    EXPECT_EQ(pool->num_samples(), 2 + 3) << "through member " << via;
    EXPECT_EQ(pool->num_complete_groups(), 1) << "\"done\" only, through member " << via;
    EXPECT_EQ(pool->num_incomplete_groups(), 0) << "through member " << via;
  }
}

TEST_F(ClusterLifecycleTest, AnOpenSampleIsNamedAndGoesWithItsExpiredGroup) {
  v1::PoolOptions options;
  options.set_incomplete_group_timeout_ms(500);
  StartThree(options);
  // Group "slow": one sealed sample on the last member in id order, one
  // still receiving pieces on the first (which holds no sealed sample of it,
  // so it must not be the one that acts).
  size_t first = 0, last = 0;
  for (size_t i = 1; i < members_.size(); ++i) {
    if (members_[i]->address() < members_[first]->address()) first = i;
    if (members_[i]->address() > members_[last]->address()) last = i;
  }
  PutGroup(last, "slow", 2, 0, 1);
  std::vector<v1::Sample> open = ClusterSamples(1, 7, "slow-open-");
  open[0].set_group_id("slow");
  open[0].set_group_size(2);
  open[0].set_partial(true);
  absl::StatusOr<v1::PutSamplesResponse> put = Client(first).PutSamples("pool", open);
  ASSERT_TRUE(put.ok()) << put.status();
  // Named explicitly, it is refused as open, naming its member.
  v1::CreateStepRequest named = Request("named");
  named.add_sample_ids(open[0].sample_id());
  absl::StatusOr<v1::StepInfo> refused = Client(2).CreateStep(named);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(absl::StrCat("sample \"", open[0].sample_id(), "\" is open on member")));
  // The group expires on the last member's clock; the open sample goes with it.
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::PoolInfo> pool = Client(2).GetPool("pool");
        return pool.ok() && pool->num_samples() == 0 && pool->num_open_samples() == 0;
      },
      absl::Seconds(15)));
  absl::StatusOr<v1::PoolInfo> pool = Client(0).GetPool("pool");
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->num_incomplete_groups_dropped(), 1);
  EXPECT_EQ(pool->num_incomplete_groups(), 0);
  // Its next piece finds nothing to extend.
  open[0].set_piece(1);
  open[0].set_partial(false);
  open[0].clear_tokens();
  open[0].clear_routed_experts();
  open[0].clear_token_fields();
  EXPECT_EQ(Client(first).PutSamples("pool", open).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClusterLifecycleTest, ListStepsAndListPoolsSeeTheWholeCluster) {
  StartThree(v1::PoolOptions());
  PutGroup(0, "a", 0, 0, 2);
  PutGroup(1, "b", 0, 0, 2);
  v1::CreateStepRequest request = Request("listed");
  request.set_num_samples(4);
  const int64_t before = absl::GetCurrentTimeNanos();
  ASSERT_TRUE(Client(0).CreateStep(request).ok());
  // Another member lists the step, planned from its record.
  absl::StatusOr<v1::ListStepsResponse> steps = Client(2).ListSteps();
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->steps_size(), 1);
  EXPECT_EQ(steps->steps(0).step_id(), "listed");
  EXPECT_EQ(steps->steps(0).num_samples(), 4);
  EXPECT_GE(steps->steps(0).created_unix_nanos(), before);
  absl::StatusOr<v1::ListPoolsResponse> pools = Client(1).ListPools();
  ASSERT_TRUE(pools.ok()) << pools.status();
  ASSERT_EQ(pools->pools_size(), 1);
  EXPECT_EQ(pools->pools(0).pool(), "pool");
  EXPECT_EQ(pools->pools(0).num_samples(), 4);
  ASSERT_TRUE(Client(1).ReleaseStep("listed").ok());
  absl::StatusOr<v1::ListStepsResponse> after = Client(2).ListSteps("pool");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->steps_size(), 0);
}

// Issue 36: etcd frozen (SIGSTOP) past the members' lease TTL revokes their
// leases when it goes on, and every member key with them. Until each member
// had noticed and joined again, GetPool through any member counted only the
// members whose key was back (fewer free samples), and CreateStep selected
// over those alone. Now every answer once etcd is back counts every member.
// It also failed about one run in ten ("17.1ms after etcd returned: 2
// members, 8 free samples"): etcd is frozen within a renewal period of the
// last member's join, before the second had listed it, and a member waited
// only for the members it had listed; the roster (docs/cluster.md) tells it.
TEST_F(ClusterLifecycleTest, FreeSamplesAreCountedAgainRightAfterEtcdReturns) {
  StartThree(v1::PoolOptions());
  for (size_t m = 0; m < 3; ++m) PutGroup(m, absl::StrCat("g", m), 0, 0, 4);
  absl::StatusOr<v1::PoolInfo> before = Client(0).GetPool("pool");
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->members_size(), 3);
  ASSERT_EQ(before->num_free_samples(), 12);

  for (int round = 0; round < 2; ++round) {
    etcd_->Pause();
    absl::SleepFor(absl::Seconds(3 * kLeaseSeconds));
    etcd_->Resume();
    const absl::Time resumed = absl::Now();
    if (round == 1) {
      // The first call once etcd is back selects over every member.
      v1::CreateStepRequest all = Request("all");
      all.set_num_samples(12);
      absl::StatusOr<v1::StepInfo> step = Client(1).CreateStep(all);
      ASSERT_TRUE(step.ok()) << step.status();
      EXPECT_EQ(step->num_samples(), 12);
      break;
    }
    // Every member asked at once, again and again, from the moment etcd
    // answers: no answer may miss a member or its samples.
    std::vector<std::thread> askers;
    std::vector<int> answers(3, 0);
    std::vector<std::string> wrong(3);
    for (size_t m = 0; m < 3; ++m) {
      askers.emplace_back([&, m] {
        RollpackClient client = Client(m);
        while (absl::Now() - resumed < absl::Seconds(2 * kLeaseSeconds)) {
          absl::StatusOr<v1::PoolInfo> pool = client.GetPool("pool");
          if (!pool.ok()) {
            if (wrong[m].empty()) wrong[m] = pool.status().ToString();
            continue;
          }
          ++answers[m];
          if (wrong[m].empty() && (pool->members_size() != 3 || pool->num_free_samples() != 12)) {
            wrong[m] = absl::StrCat(absl::FormatDuration(absl::Now() - resumed),
                                    " after etcd returned: ", pool->members_size(),
                                    " members, ", pool->num_free_samples(), " free samples");
          }
        }
      });
    }
    for (std::thread& t : askers) t.join();
    for (size_t m = 0; m < 3; ++m) {
      EXPECT_GT(answers[m], 0) << "member " << m << " never answered GetPool";
      EXPECT_EQ(wrong[m], "") << "GetPool through member " << m;
    }
  }
}

// The race the test above met one run in ten, made certain: member 0 is
// frozen (SIGSTOP) while member 2 joins, and etcd is frozen before member 0
// goes on, so member 0 never listed member 2. etcd revokes every lease when
// it goes on; member 2, frozen too, joins again only while member 0
// answers. Member 0 waited only for the members it had listed and answered
// with 2 members of 3; etcd's roster tells it member 2 had joined.
TEST_F(ClusterLifecycleTest, AMemberThatJoinedJustBeforeEtcdWentAwayIsWaitedFor) {
  StartMember(0);
  StartMember(1);
  v1::RegisterModelRequest request;
  request.set_pool("pool");
  *request.mutable_model() = ClusterModel();
  ASSERT_TRUE(Client(0).RegisterModel(request).ok());
  PutGroup(0, "g0", 0, 0, 4);
  PutGroup(1, "g1", 0, 0, 4);
  const pid_t first = MemberPid(0);
  ASSERT_GT(first, 0);
  ASSERT_EQ(kill(first, SIGSTOP), 0);
  StartMember(2);
  PutGroup(2, "g2", 0, 0, 4);
  const pid_t third = MemberPid(2);
  ASSERT_GT(third, 0);
  etcd_->Pause();
  ASSERT_EQ(kill(first, SIGCONT), 0);
  absl::SleepFor(absl::Seconds(3 * kLeaseSeconds));
  ASSERT_EQ(kill(third, SIGSTOP), 0);
  etcd_->Resume();
  // Asked once etcd revoked member 2's key, while member 2 is away.
  const std::string absent = members_[2]->address();
  const bool revoked =
      Eventually([&] { return MemberKeys().count(absent) == 0; }, absl::Seconds(kLeaseSeconds));
  std::thread wake([third] {
    absl::SleepFor(absl::Milliseconds(300));
    kill(third, SIGCONT);
  });
  const absl::Time asked = absl::Now();
  absl::StatusOr<v1::PoolInfo> pool = Client(0).GetPool("pool");
  const absl::Duration took = absl::Now() - asked;
  wake.join();
  ASSERT_TRUE(revoked) << "etcd did not revoke member 2's key";
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->members_size(), 3) << "answered after " << absl::FormatDuration(took);
  EXPECT_EQ(pool->num_free_samples(), 12);
}

}  // namespace
}  // namespace rollpack
