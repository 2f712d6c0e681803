// The cluster's rules on one member over the in-memory etcd
// (testing/in_memory_key_value_store.h), with no etcd, peer or gRPC server:
// the hold/commit protocol of a step (cluster_steps.h), the background
// rules every tick runs (cluster_steps_upkeep.cc: pending releases, stale
// holds, orphaned holds, expired groups) and the membership lease lost and
// taken again (cluster.h). tests/cluster_*_test.cc run the same rules over
// real etcd and rollpackd processes.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/wire/deterministic_bytes.h"
#include "rollpack/v1/member.pb.h"
#include "server/cluster/cluster.h"
#include "server/cluster/cluster_steps.h"
#include "server/cluster/incarnation.h"
#include "testing/in_memory_key_value_store.h"
#include "testing/store_samples.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;
using store_testing::Model;
using store_testing::Request;
using store_testing::Sample;

constexpr char kSelf[] = "127.0.0.1:7001";

// Polls `done` every 10 ms for up to `limit`.
template <typename F>
bool Eventually(F done, absl::Duration limit = absl::Seconds(3)) {
  const absl::Time give_up = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() >= give_up) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

class ClusterStepRules : public ::testing::Test {
 protected:
  // One member, cluster "t", its upkeep every 20 ms.
  void Join(absl::Duration hold_grace, absl::Duration lease_ttl = absl::Seconds(3)) {
    etcd_ = InMemoryEtcd::Create();
    ClusterOptions options;
    options.name = "t";
    options.advertise = kSelf;
    options.incarnation = NewIncarnation();
    options.lease_ttl = lease_ttl;
    absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Join(options, etcd_->NewClient());
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    ClusterStepsOptions steps;
    steps.hold_grace = hold_grace;
    steps.tick = absl::Milliseconds(20);
    steps_ = std::make_unique<ClusterSteps>(&store_, steps);
    ASSERT_TRUE(store_.RegisterModel("p", Model()).ok());
    ASSERT_TRUE(store_.Put("p", {Sample("a", 4), Sample("b", 4)}).ok());
  }
  void Attach() { steps_->Attach(cluster_.get()); }
  void TearDown() override {
    if (steps_ != nullptr) steps_->Detach();
  }

  KeyValueStore& kv() { return *cluster_->etcd(); }
  std::string StepKey(const std::string& id) { return cluster_->Key("steps", id); }
  std::string ReleaseKey(const std::string& id) {
    return cluster_->Key("releases", absl::StrCat(kSelf, "/", id));
  }
  bool Holds(const std::string& step_id) {
    for (const std::string& id : store_.HoldIds()) {
      if (id == step_id) return true;
    }
    return false;
  }
  // The committed record of a step of `attempt` holding `samples` here.
  void PutRecord(const std::string& step_id, int64_t attempt,
                 const std::vector<std::string>& samples) {
    v1::ClusterStepRecord record;
    record.set_step_id(step_id);
    record.set_pool("p");
    record.add_members(kSelf);
    for (const std::string& id : samples) {
      record.add_sample_ids(id);
      record.add_owner(0);
      record.add_num_tokens(4);
    }
    record.set_coordinator(kSelf);
    record.set_created_unix_nanos(attempt);
    ASSERT_TRUE(kv().Put(StepKey(step_id), DeterministicBytes(record)).ok());
  }

  SampleStore store_{1 << 20};
  std::shared_ptr<InMemoryEtcd> etcd_;
  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<ClusterSteps> steps_;
};

TEST_F(ClusterStepRules, AStepHoldsItsSamplesCommitsItsRecordAndItsReleaseFreesThem) {
  Join(absl::Seconds(10));
  Attach();
  StepRequest first = Request("s1");
  first.sample_ids = {"a", "b"};
  ASSERT_TRUE(steps_->CreateStep(first).ok());
  // Committed: the record in etcd, the hold confirmed.
  absl::StatusOr<std::optional<std::string>> bytes = kv().Get(StepKey("s1"));
  ASSERT_TRUE(bytes.ok() && bytes->has_value());
  v1::ClusterStepRecord record;
  ASSERT_TRUE(record.ParseFromString(**bytes));
  EXPECT_THAT(record.members(), ::testing::ElementsAre(kSelf));
  EXPECT_THAT(record.sample_ids(), ::testing::ElementsAre("a", "b"));
  EXPECT_EQ(store_.HoldAttempt("s1"), record.created_unix_nanos());
  EXPECT_TRUE(store_.UnconfirmedHolds(absl::ZeroDuration()).empty());

  // A second step wanting a held sample is refused, and leaves nothing.
  StepRequest second = Request("s2");
  second.sample_ids = {"b"};
  absl::StatusOr<std::shared_ptr<const Step>> refused = steps_->CreateStep(second);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_FALSE(kv().Get(StepKey("s2"))->has_value());
  EXPECT_FALSE(Holds("s2"));
  // So is the same id again.
  EXPECT_EQ(steps_->CreateStep(first).status().code(), absl::StatusCode::kAlreadyExists);

  absl::StatusOr<ReleaseResult> released = steps_->ReleaseStep("s1");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->released_samples, 2);
  EXPECT_FALSE(kv().Get(StepKey("s1"))->has_value());
  EXPECT_TRUE(kv().GetPrefix(cluster_->Key("releases", ""))->empty());
  EXPECT_FALSE(Holds("s1"));
  EXPECT_EQ(store_.GetPool("p")->num_samples, 0) << "a release consumes a step's samples";
}

TEST_F(ClusterStepRules, APendingReleaseWaitsForTheRecordToGo) {
  // hold_grace far away: only the pending release can release the hold.
  Join(absl::Seconds(30));
  ASSERT_TRUE(store_.Hold("s", "p", {"a"}, kSelf, /*attempt=*/7).ok());
  ASSERT_TRUE(store_.ConfirmHold("s").ok());
  PutRecord("s", 7, {"a"});
  // A release that failed half-way: the key written, the record still there.
  ASSERT_TRUE(kv().Put(ReleaseKey("s"), "").ok());
  Attach();
  absl::SleepFor(absl::Milliseconds(200));  // ten ticks
  EXPECT_TRUE(Holds("s")) << "the step is live while its record is";
  EXPECT_TRUE(kv().Get(ReleaseKey("s"))->has_value());

  ASSERT_TRUE(kv().Delete(StepKey("s")).ok());
  EXPECT_TRUE(Eventually([&] { return !Holds("s"); }));
  EXPECT_TRUE(Eventually([&] { return !kv().Get(ReleaseKey("s"))->has_value(); }));
}

TEST_F(ClusterStepRules, AHoldWhoseRecordLeftWithoutAReleaseIsReleasedAfterTheGrace) {
  Join(absl::Seconds(1));
  ASSERT_TRUE(store_.Hold("s", "p", {"a"}, kSelf, /*attempt=*/7).ok());
  ASSERT_TRUE(store_.ConfirmHold("s").ok());
  PutRecord("s", 7, {"a"});
  Attach();
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(kv().Delete(StepKey("s")).ok());  // by hand, or a restored etcd
  const absl::Time deleted = absl::Now();
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(Holds("s")) << "a record missing for a moment is no release";
  EXPECT_TRUE(Eventually([&] { return !Holds("s"); }, absl::Seconds(5)));
  EXPECT_GE(absl::Now() - deleted, absl::Seconds(1));
}

TEST_F(ClusterStepRules, AnUncommittedHoldIsGivenUpAndItsIdTombstoned) {
  Join(absl::Milliseconds(100));
  // The planner held and died before committing.
  ASSERT_TRUE(store_.Hold("s", "p", {"a"}, "127.0.0.1:7002", /*attempt=*/7).ok());
  Attach();
  EXPECT_TRUE(Eventually([&] { return !Holds("s"); }));
  // The tombstone won the race for the id: the planner's commit would fail.
  absl::StatusOr<std::optional<EtcdKeyValue>> entry = kv().GetEntry(StepKey("s"));
  ASSERT_TRUE(entry.ok() && entry->has_value());
  v1::ClusterStepRecord tombstone;
  ASSERT_TRUE(tombstone.ParseFromString((*entry)->value));
  EXPECT_EQ(tombstone.aborted_by(), kSelf);
  EXPECT_NE((*entry)->lease, 0) << "a tombstone goes by itself";
  bool created = false;
  ASSERT_TRUE(kv().CreateIfAbsent(StepKey("s"), "the planner's record", &created).ok());
  EXPECT_FALSE(created);
  // The sample is free again; the id is refused while the tombstone lives.
  StepRequest again = Request("s");
  again.sample_ids = {"a"};
  absl::StatusOr<std::shared_ptr<const Step>> refused = steps_->CreateStep(again);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAborted) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("gave up waiting"));
  again.step_id = "t";
  EXPECT_TRUE(steps_->CreateStep(again).ok());
}

TEST_F(ClusterStepRules, AnUnconfirmedHoldWhoseAttemptWasCommittedIsConfirmed) {
  Join(absl::Milliseconds(100));
  ASSERT_TRUE(store_.Hold("mine", "p", {"a"}, "127.0.0.1:7002", /*attempt=*/7).ok());
  PutRecord("mine", 7, {"a"});  // committed; the confirmation was lost
  ASSERT_TRUE(store_.Hold("other", "p", {"b"}, "127.0.0.1:7002", /*attempt=*/8).ok());
  PutRecord("other", 9, {"b"});  // committed by another attempt at the id
  Attach();
  EXPECT_TRUE(Eventually([&] { return store_.UnconfirmedHolds(absl::ZeroDuration()).empty(); }));
  EXPECT_TRUE(Holds("mine"));
  EXPECT_FALSE(Holds("other"));
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(Holds("mine")) << "a confirmed hold with its record stays";
}

TEST_F(ClusterStepRules, AGroupIncompletePastItsTimeoutIsDropped) {
  Join(absl::Seconds(10));
  PoolOptions options;
  options.incomplete_group_timeout_ms = 1000;
  ASSERT_TRUE(store_.RegisterModel("g", Model(), options).ok());
  ASSERT_TRUE(store_.Put("g", {Sample("x", 4, "open", 3), Sample("y", 4, "open", 3),
                               Sample("z", 4, "full", 1)}).ok());
  Attach();
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(store_.GetPool("g")->num_samples, 3) << "not before its timeout";
  EXPECT_TRUE(Eventually([&] { return store_.GetPool("g")->num_incomplete_groups_dropped == 1; },
                         absl::Seconds(5)));
  EXPECT_EQ(store_.GetPool("g")->num_samples, 1) << "the complete group stays";
}

TEST_F(ClusterStepRules, AMemberWhoseLeaseRanOutJoinsAgainOnANewOne) {
  Join(absl::Seconds(10), /*lease_ttl=*/absl::Seconds(3));  // renewed every second
  const std::string key = cluster_->Key("members", kSelf);
  absl::StatusOr<std::optional<EtcdKeyValue>> before = kv().GetEntry(key);
  ASSERT_TRUE(before.ok() && before->has_value());
  ASSERT_TRUE(etcd_->ExpireLease((*before)->lease).ok());
  EXPECT_FALSE(kv().Get(key)->has_value());
  EXPECT_TRUE(Eventually(
      [&] {
        absl::StatusOr<std::optional<EtcdKeyValue>> now = kv().GetEntry(key);
        return now.ok() && now->has_value() && (*now)->lease != (*before)->lease;
      },
      absl::Seconds(5)));
  absl::StatusOr<std::vector<ClusterMember>> members = cluster_->Members();
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 1u);
  EXPECT_EQ((*members)[0].id, kSelf);
}

TEST_F(ClusterStepRules, AnEtcdOutageIsAnEventEachWayAndPoolFactsStayKnown) {
  Join(absl::Seconds(10), /*lease_ttl=*/absl::Seconds(3));
  absl::Mutex mu;
  std::vector<bool> changes;
  cluster_->SetEtcdListener([&](bool reachable) {
    absl::MutexLock lock(&mu);
    changes.push_back(reachable);
  });
  bool created = false;
  ASSERT_TRUE(cluster_->RegisterPool("p", Model(), &created).ok());
  etcd_->StartOutage();
  // The keep-alive thread's next renewal sees it.
  EXPECT_TRUE(Eventually([&] { return !cluster_->etcd_reachable(); }));
  absl::StatusOr<std::optional<ModelSpec>> known = cluster_->LookupPool("p");
  ASSERT_TRUE(known.ok()) << known.status();
  EXPECT_TRUE(known->has_value()) << "what this member wrote before, while etcd is away";
  EXPECT_TRUE(absl::IsUnavailable(cluster_->LookupPool("unknown").status()));
  etcd_->EndOutage();
  EXPECT_TRUE(Eventually([&] { return cluster_->etcd_reachable(); }));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(changes, (std::vector<bool>{false, true}));
}

}  // namespace
}  // namespace rollpack
