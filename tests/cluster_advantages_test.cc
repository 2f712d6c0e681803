// Per-sequence metadata and advantages over a cluster with real processes
// (lifecycle.md section 6, docs/layout.md section 12): groups spread over
// members, the planner computes the advantages once from the scalars the
// holds answer with and writes them into the step's record; every member,
// proxied or direct, sends the bytes a single server holding every sample
// sends; members restarted from their logs (the record read again) send them
// again; an estimator's refusal leaves every sample free.
#include <signal.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/wire/deterministic_bytes.h"
#include "rollpack/v1/member.pb.h"
#include "testing/cluster_fixture.h"
#include "testing/rank_fetch.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

struct Put {
  std::string group;
  double reward = 0;
  int64_t version = 0;
};

class ClusterAdvantagesTest : public ClusterFixture {
 protected:
  void StartThree() {
    for (size_t i = 0; i < 3; ++i) StartMember(i);
    ASSERT_TRUE(Client(0).RegisterModel("pool", ClusterModel()).ok());
  }

  // Samples of `group` (of `size`) on `member`, rewards `rewards`; each has
  // "turns" too, and those of member 0 "m0_only" (which no step of samples
  // from several members carries). `no_reward`: the k-th sample lacks it.
  void PutGroup(size_t member, const std::string& group, int size,
                const std::vector<double>& rewards, int no_reward = -1) {
    const int first = static_cast<int>(ids_[group].size());
    std::vector<v1::Sample> samples = ClusterSamples(
        static_cast<int>(rewards.size()), 300 + member * 17 + first, absl::StrCat(group, "-", first, "-"));
    for (size_t k = 0; k < samples.size(); ++k) {
      v1::Sample& s = samples[k];
      s.set_group_id(group);
      s.set_group_size(size);
      s.set_policy_version(static_cast<int64_t>(member * 10 + k));
      s.clear_scalars();
      if (static_cast<int>(k) != no_reward) (*s.mutable_scalars())["reward"] = rewards[k];
      (*s.mutable_scalars())["turns"] = static_cast<double>(k + 1);
      if (member == 0) (*s.mutable_scalars())["m0_only"] = 1;
      puts_[s.sample_id()] = {group, rewards[k], s.policy_version()};
      ids_[group].push_back(s.sample_id());
    }
    absl::StatusOr<v1::PutSamplesResponse> put = Client(member).PutSamples("pool", samples);
    ASSERT_TRUE(put.ok()) << put.status();
    for (v1::Sample& s : samples) all_samples_.push_back(std::move(s));
  }

  // Groups spread over the members: "a" on 0 and 2, "b" on 1, "c" on all
  // three, "d" on 1 and 2; ties, and one group of equal rewards.
  void PutSpreadGroups() {
    PutGroup(0, "a", 4, {1.0, 0.0});
    PutGroup(1, "b", 3, {0.5, 0.5, 0.5});
    PutGroup(2, "a", 4, {1.0, 0.25});
    PutGroup(0, "c", 5, {-2.0});
    PutGroup(1, "c", 5, {3.5, -2.0});
    PutGroup(2, "c", 5, {0.0, 7.25});
    PutGroup(1, "d", 2, {0.0});
    PutGroup(2, "d", 2, {1.0});
  }

  int64_t FreeSamples(size_t via) {
    absl::StatusOr<v1::PoolInfo> pool = Client(via).GetPool("pool");
    EXPECT_TRUE(pool.ok()) << pool.status();
    return pool.ok() ? pool->num_free_samples() : -1;
  }

  // GRPO of every sample put, by the textbook formula (population std).
  std::map<std::string, double> Grpo() const {
    std::map<std::string, double> out;
    for (const auto& [group, ids] : ids_) {
      double sum = 0;
      for (const std::string& id : ids) sum += puts_.at(id).reward;
      const double mean = sum / ids.size();
      double var = 0;
      for (const std::string& id : ids) var += std::pow(puts_.at(id).reward - mean, 2);
      const double std = std::sqrt(var / ids.size());
      for (const std::string& id : ids) out[id] = (puts_.at(id).reward - mean) / (std + 1e-6);
    }
    return out;
  }

  // Every rank's micro-batches from member `m` (deterministic bytes).
  std::map<int, std::vector<std::string>> FetchAll(const std::string& address,
                                                    const std::string& step, Delivery delivery) {
    std::map<int, std::vector<std::string>> out;
    const std::vector<v1::RankCoords> ranks = AllRanks(HybridTopology());
    for (size_t r = 0; r < ranks.size(); ++r) {
      absl::StatusOr<std::vector<v1::Microbatch>> got =
          FetchRankMicrobatches(address, step, ranks[r], delivery);
      EXPECT_TRUE(got.ok()) << address << " rank " << ranks[r].ShortDebugString() << ": "
                            << got.status();
      if (!got.ok()) continue;
      for (const v1::Microbatch& mb : *got) out[r].push_back(DeterministicBytes(mb));
    }
    return out;
  }

  std::map<std::string, std::vector<std::string>> ids_;
  std::map<std::string, Put> puts_;
};

v1::CreateStepRequest Request(const std::string& step_id, v1::AdvantageEstimator estimator) {
  v1::CreateStepRequest request;
  request.set_step_id(step_id);
  request.set_pool("pool");
  *request.mutable_topology() = HybridTopology();
  request.set_advantage(estimator);
  return request;
}

TEST_F(ClusterAdvantagesTest, EveryMemberSendsTheSingleServersBytesAlsoAfterARestart) {
  durable_ = true;
  StartThree();
  PutSpreadGroups();
  std::unique_ptr<DaemonProcess> single = StartReference();
  ASSERT_NE(single, nullptr);
  // Explicit ids, groups interleaved (and over members): the same step on
  // the cluster and on the single server.
  v1::CreateStepRequest request = Request("adv", v1::ADVANTAGE_GRPO);
  for (int k = 0; k < 5; ++k) {
    for (const char* g : {"c", "a", "d", "b"}) {
      if (k < static_cast<int>(ids_[g].size())) request.add_sample_ids(ids_[g][k]);
    }
  }
  ASSERT_EQ(request.sample_ids_size(), 14);
  absl::StatusOr<v1::StepInfo> info = Client(1).CreateStep(request);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->num_groups(), 4);
  RollpackClient reference(MakeChannel(single->address()));
  ASSERT_TRUE(reference.CreateStep(request).ok());
  const std::map<int, std::vector<std::string>> want =
      FetchAll(single->address(), "adv", Delivery::kProxy);
  ASSERT_EQ(want.size(), AllRanks(HybridTopology()).size());

  // What the micro-batches say: the single server's, checked once.
  const std::map<std::string, double> grpo = Grpo();
  int sequences = 0;
  for (const auto& [rank, microbatches] : want) {
    for (const std::string& bytes : microbatches) {
      v1::Microbatch mb;
      ASSERT_TRUE(mb.ParseFromString(bytes));
      const int n = mb.sample_ids_size();
      ASSERT_EQ(mb.group_ids_size(), n);
      ASSERT_EQ(mb.policy_versions_size(), n);
      ASSERT_EQ(mb.scalars_size(), 2) << "reward and turns; m0_only is not on every sample";
      ASSERT_EQ(mb.advantages().data().size(), 4u * n);
      ASSERT_EQ(mb.scalars().at("reward").data().size(), 8u * n);
      for (int j = 0; j < n; ++j) {
        const Put& put = puts_.at(mb.sample_ids(j));
        EXPECT_EQ(mb.group_ids(j), put.group);
        EXPECT_EQ(mb.policy_versions(j), put.version);
        double reward;
        float advantage;
        std::memcpy(&reward, mb.scalars().at("reward").data().data() + 8 * j, 8);
        std::memcpy(&advantage, mb.advantages().data().data() + 4 * j, 4);
        EXPECT_EQ(reward, put.reward);
        EXPECT_NEAR(advantage, grpo.at(mb.sample_ids(j)), 1e-6) << mb.sample_ids(j);
        if (put.group == "b") {
          EXPECT_EQ(advantage, 0.0f);  // std 0
        }
        ++sequences;
      }
    }
  }
  EXPECT_GE(sequences, 14);

  for (size_t m = 0; m < 3; ++m) {
    for (Delivery delivery : {Delivery::kProxy, Delivery::kDirect}) {
      EXPECT_EQ(FetchAll(members_[m]->address(), "adv", delivery), want)
          << "member " << m << (delivery == Delivery::kDirect ? " direct" : " proxied");
    }
  }
  // Killed and restarted from their logs: the record is read again.
  for (size_t m = 0; m < 3; ++m) members_[m]->Kill(SIGKILL);
  for (size_t m = 0; m < 3; ++m) StartMember(m);
  for (size_t m = 0; m < 3; ++m) {
    EXPECT_EQ(FetchAll(members_[m]->address(), "adv", Delivery::kDirect), want)
        << "member " << m << " after the restart";
  }
}

TEST_F(ClusterAdvantagesTest, WholeGroupsOverMembersGetTheSameRlooFromEveryMember) {
  StartThree();
  PutSpreadGroups();
  v1::CreateStepRequest request = Request("rloo", v1::ADVANTAGE_RLOO);
  request.set_num_groups(4);
  absl::StatusOr<v1::StepInfo> info = Client(0).CreateStep(request);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->num_samples(), 14);
  const std::map<int, std::vector<std::string>> want =
      FetchAll(members_[2]->address(), "rloo", Delivery::kProxy);
  int checked = 0;
  for (const auto& [rank, microbatches] : want) {
    for (const std::string& bytes : microbatches) {
      v1::Microbatch mb;
      ASSERT_TRUE(mb.ParseFromString(bytes));
      for (int j = 0; j < mb.sample_ids_size(); ++j) {
        const std::string& id = mb.sample_ids(j);
        const std::vector<std::string>& group = ids_.at(puts_.at(id).group);
        double others = 0;
        for (const std::string& o : group) others += o == id ? 0 : puts_.at(o).reward;
        float advantage;
        std::memcpy(&advantage, mb.advantages().data().data() + 4 * j, 4);
        EXPECT_NEAR(advantage, puts_.at(id).reward - others / (group.size() - 1), 1e-6) << id;
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 14);
  for (size_t m = 0; m < 2; ++m) {
    EXPECT_EQ(FetchAll(members_[m]->address(), "rloo", Delivery::kAuto), want) << "member " << m;
  }

  // The record is what every member encodes from: one edited behind the
  // cluster's back is refused whole, never half-used.
  const std::string key = "/" + name_ + "/steps/rloo";
  absl::StatusOr<std::optional<std::string>> held = etcd_client_->Get(key);
  ASSERT_TRUE(held.ok() && held->has_value()) << held.status();
  v1::ClusterStepRecord record;
  ASSERT_TRUE(record.ParseFromString(**held));
  ASSERT_EQ(record.advantages_size(), 14);
  EXPECT_EQ(record.advantage(), v1::ADVANTAGE_RLOO);
  EXPECT_EQ(record.group_ids_size(), 14);
  const auto forge = [&](const std::function<void(v1::ClusterStepRecord*)>& edit,
                         const std::string& says) {
    v1::ClusterStepRecord forged = record;
    edit(&forged);
    ASSERT_TRUE(etcd_client_->Put(key, forged.SerializeAsString()).ok());
    for (size_t m = 0; m < 3; ++m) {
      absl::StatusOr<std::vector<v1::Microbatch>> got = FetchRankMicrobatches(
          members_[m]->address(), "rloo", AllRanks(HybridTopology())[0], Delivery::kProxy);
      EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
      EXPECT_THAT(std::string(got.status().message()), HasSubstr(says)) << "member " << m;
    }
  };
  forge([](v1::ClusterStepRecord* r) { r->set_advantages(3, std::nanf("")); },
        "advantage nan");
  forge([](v1::ClusterStepRecord* r) { r->mutable_advantages()->RemoveLast(); },
        "has 13 advantages (ADVANTAGE_RLOO) for 14 samples");
  forge([](v1::ClusterStepRecord* r) { r->mutable_group_ids()->RemoveLast(); },
        "has 13 group ids and 14 policy versions for 14 samples");
  forge([](v1::ClusterStepRecord* r) { r->add_scalars()->set_name("turns"); },
        "has scalar \"turns\" with 0 values for 14 samples");
  forge([](v1::ClusterStepRecord* r) { r->set_advantage(static_cast<v1::AdvantageEstimator>(9)); },
        "names advantage estimator 9");
  // Put back: served again, the same bytes.
  ASSERT_TRUE(etcd_client_->Put(key, record.SerializeAsString()).ok());
  EXPECT_EQ(FetchAll(members_[1]->address(), "rloo", Delivery::kProxy), want);
}

TEST_F(ClusterAdvantagesTest, AnEstimatorsRefusalLeavesEverySampleFree) {
  StartThree();
  PutSpreadGroups();
  // Group "e": its member-2 sample has no reward.
  PutGroup(0, "e", 2, {1.0});
  PutGroup(2, "e", 2, {0.0}, /*no_reward=*/0);
  PutGroup(1, "single", 1, {1.0});
  const int64_t free = FreeSamples(0);
  ASSERT_EQ(free, 17);

  // Refused before holding: a group split by num_samples.
  v1::CreateStepRequest split = Request("split", v1::ADVANTAGE_GRPO);
  split.set_num_samples(3);
  absl::StatusOr<v1::StepInfo> refused = Client(1).CreateStep(split);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("of its 4 samples in the step"));
  // Refused after holding (the scalars come with the holds): dropped.
  v1::CreateStepRequest missing = Request("missing", v1::ADVANTAGE_GRPO_MEAN);
  for (const std::string& id : ids_["e"]) missing.add_sample_ids(id);
  for (const std::string& id : ids_["a"]) missing.add_sample_ids(id);
  refused = Client(0).CreateStep(missing);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr(absl::StrCat("sample \"", ids_["e"][1], "\" has no scalar \"reward\"")));
  v1::CreateStepRequest rloo = Request("rloo1", v1::ADVANTAGE_RLOO);
  rloo.set_num_groups(6);
  refused = Client(2).CreateStep(rloo);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("group \"single\" has 1 sample; ADVANTAGE_RLOO needs groups of at least 2"));
  v1::CreateStepRequest eps = Request("eps", v1::ADVANTAGE_GRPO);
  eps.set_num_groups(1);
  eps.set_advantage_eps(-0.5);
  refused = Client(2).CreateStep(eps);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("advantage_eps is -0.5"));

  for (size_t m = 0; m < 3; ++m) EXPECT_EQ(FreeSamples(m), free) << "member " << m;
  // Every id is free for the next step: "missing" again without an
  // estimator carries the scalars every sample has, and no advantages.
  missing.set_step_id("plain");
  missing.set_advantage(v1::ADVANTAGE_NONE);
  ASSERT_TRUE(Client(0).CreateStep(missing).ok());
  absl::StatusOr<std::vector<v1::Microbatch>> got =
      FetchRankMicrobatches(members_[1]->address(), "plain", AllRanks(HybridTopology())[0]);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_FALSE(got->empty());
  for (const v1::Microbatch& mb : *got) {
    EXPECT_FALSE(mb.has_advantages());
    EXPECT_EQ(mb.scalars_size(), 1);  // "turns": one sample lacks "reward"
    EXPECT_EQ(mb.scalars().count("turns"), 1u);
  }
}

}  // namespace
}  // namespace rollpack
