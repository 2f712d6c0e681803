// The sample lifecycle at the store (../shared/spec/lifecycle.md): groups,
// versions and staleness, token budgets, reuse, incomplete groups, and all
// of it through the durable log.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/sample_store.h"
#include "testing/durable_store.h"
#include "testing/store_samples.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using store_testing::Model;
using store_testing::Request;
using store_testing::Sample;

std::vector<std::string> Ids(const Step& step) { return step.sample_ids; }

TEST(SampleStoreLifecycle, GroupsAreCheckedAtPutAndNothingChangesOnRefusal) {
  SampleStore store(1 << 24);
  PoolOptions options;
  options.default_group_size = 2;
  ASSERT_TRUE(store.RegisterModel("p", Model(), options).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a1", 4, "a", 3)}).ok());
  absl::StatusOr<PutResult> other_size = store.Put("p", {Sample("a2", 4, "a", 4)});
  EXPECT_EQ(other_size.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other_size.status().message(),
              HasSubstr("sample \"a2\": group \"a\" has group_size 3, this sample declares 4"));
  ASSERT_TRUE(store.Put("p", {Sample("a2", 4, "a", 3), Sample("a3", 4, "a", 3)}).ok());
  // A batch that would overfill the group is refused whole.
  absl::StatusOr<PutResult> full = store.Put("p", {Sample("x", 4), Sample("a4", 4, "a", 3)});
  EXPECT_EQ(full.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(full.status().message(),
              HasSubstr("sample \"a4\": group \"a\" already has 3 samples, its group_size is 3"));
  EXPECT_EQ(store.GetPool("p")->num_samples, 3);
  // The pool's default size applies to a group_id without a size.
  ASSERT_TRUE(store.Put("p", {Sample("b1", 4, "b")}).ok());
  PoolStats pool = *store.GetPool("p");
  EXPECT_EQ(pool.num_complete_groups, 1);
  EXPECT_EQ(pool.num_incomplete_groups, 1);
  ASSERT_EQ(pool.incomplete_groups.size(), 1u);
  EXPECT_EQ(pool.incomplete_groups[0].group_id, "b");
  EXPECT_EQ(pool.incomplete_groups[0].group_size, 2);
  EXPECT_EQ(pool.incomplete_groups[0].num_sealed, 1);
  // An identical re-send is a duplicate, default applied the same way.
  absl::StatusOr<PutResult> again = store.Put("p", {Sample("b1", 4, "b")});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->duplicates, 1);
}

TEST(SampleStoreLifecycle, OptionsAreFixedAtRegistration) {
  SampleStore store(1 << 20);
  PoolOptions options;
  options.max_uses = 3;
  ASSERT_TRUE(*store.RegisterModel("p", Model(), options));
  EXPECT_FALSE(*store.RegisterModel("p", Model(), options));
  EXPECT_FALSE(*store.RegisterModel("p", Model()));  // no options: whatever it has
  PoolOptions other = options;
  other.max_uses = 4;
  absl::StatusOr<bool> refused = store.RegisterModel("p", Model(), other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("max_uses: 3"));
  EXPECT_EQ(store.GetOptions("p")->max_uses, 3);
}

TEST(SampleStoreLifecycle, NumGroupsTakesCompleteGroupsWholeAndExplicitIdsMustCoverThem) {
  SampleStore store(1 << 24);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a1", 4, "a", 2), Sample("b1", 4, "b", 2),
                              Sample("u", 4), Sample("b2", 4, "b", 2), Sample("c1", 4, "c", 2)})
                  .ok());
  StepRequest whole = Request("w");
  whole.sample_ids = {"a1", "u"};
  whole.selection.whole_groups = true;
  absl::StatusOr<std::shared_ptr<const Step>> refused = store.CreateStep(whole);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("group \"a\" is not covered whole: 1 of its 2 samples are missing"));
  EXPECT_EQ(store.GetPool("p")->num_free_samples, 5);

  StepRequest groups = Request("g");
  groups.selection.num_groups = 1;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(groups);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT(Ids(**step), ElementsAre("b1", "b2"));
  EXPECT_EQ((*step)->num_groups, 1);
  groups.step_id = "g2";
  refused = store.CreateStep(groups);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("has 0 complete free groups, 1 requested"));
  // Plain num_samples ignores groups (today's behaviour).
  StepRequest plain = Request("n");
  plain.selection.num_samples = 2;
  step = store.CreateStep(plain);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT(Ids(**step), ElementsAre("a1", "u"));
  EXPECT_EQ((*step)->num_groups, 0);
}

// Oldest-first selections read a growing prefix of the free samples: a
// group that completes only after thousands of others is still found, and
// the answer is the whole pool's.
TEST(SampleStoreLifecycle, SelectionsFindWhatLiesPastTheFirstThousands) {
  SampleStore store(int64_t{1} << 30);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  std::vector<StoredSample> samples;
  samples.push_back(Sample("late-0", 4, "late", 2));
  for (int i = 0; i < 20000; ++i) samples.push_back(Sample("u" + std::to_string(i), 2));
  samples.push_back(Sample("late-1", 4, "late", 2));
  ASSERT_TRUE(store.Put("p", std::move(samples)).ok());
  StepRequest groups = Request("g");
  groups.selection.num_groups = 1;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(groups);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT(Ids(**step), ElementsAre("late-0", "late-1"));
  StepRequest tokens = Request("t");
  tokens.selection.num_tokens = 30000;
  step = store.CreateStep(tokens);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ((*step)->sample_ids.size(), 15000u);
  StepRequest too_many = Request("x");
  too_many.selection.num_tokens = 10001;
  absl::StatusOr<std::shared_ptr<const Step>> refused = store.CreateStep(too_many);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("has 10000 tokens in 5000 free samples"));
}

TEST(SampleStoreLifecycle, TheStepSizeLimitHoldsPastTheFirstPrefixAndTakesNothing) {
  SampleStore store(int64_t{1} << 30);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  std::vector<StoredSample> samples;
  for (int i = 0; i < 20000; ++i) samples.push_back(Sample("u" + std::to_string(i), 1));
  ASSERT_TRUE(store.Put("p", std::move(samples)).ok());
  // 12,000 one-token samples: the first prefix (4,096) does not decide it.
  StepRequest tokens = Request("t");
  tokens.selection.num_tokens = 12000;
  tokens.selection.max_samples = 11999;
  absl::StatusOr<std::shared_ptr<const Step>> refused = store.CreateStep(tokens);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("step \"t\": pool \"p\": the step would take 12000 samples; the server "
                        "plans at most 11999 per step"));
  StepRequest count = Request("c");
  count.selection.num_samples = 12000;
  count.selection.max_samples = 11999;
  EXPECT_EQ(store.CreateStep(count).status().code(), absl::StatusCode::kResourceExhausted);
  StepRequest ids = Request("i");
  for (int i = 0; i < 3; ++i) ids.sample_ids.push_back("u" + std::to_string(i));
  ids.selection.max_samples = 2;
  EXPECT_EQ(store.CreateStep(ids).status().code(), absl::StatusCode::kResourceExhausted);
  // Nothing was taken: the whole pool is still free for a step at the limit.
  tokens.selection.max_samples = 12000;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(tokens);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ((*step)->sample_ids.size(), 12000u);
  EXPECT_EQ((*step)->sample_ids.front(), "u0");
  count.selection.max_samples = 8000;
  count.selection.num_samples = 8000;
  step = store.CreateStep(count);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ((*step)->sample_ids.front(), "u12000");
}

TEST(SampleStoreLifecycle, TokenBudgetAndNewestVersionSelection) {
  SampleStore store(1 << 24);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store.Put("p", {Sample("old", 100, "", 0, 1), Sample("mid", 50, "", 0, 2),
                              Sample("new", 30, "", 0, 3)})
                  .ok());
  StepRequest tokens = Request("t");
  tokens.selection.num_tokens = 85;
  tokens.selection.order = SelectionOrder::kNewestVersion;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(tokens);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT(Ids(**step), ElementsAre("new", "mid"));
  EXPECT_EQ((*step)->plan.stats.num_tokens, 80);
  tokens.step_id = "t2";
  tokens.selection.num_tokens = 101;
  absl::StatusOr<std::shared_ptr<const Step>> refused = store.CreateStep(tokens);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("has 100 tokens in 1 free samples"));
}

TEST(SampleStoreLifecycle, StaleSamplesAreSkippedRefusedByNameAndDroppedWhenAsked) {
  SampleStore store(1 << 24);
  PoolOptions options;
  options.max_staleness = 1;
  options.drop_stale = true;
  ASSERT_TRUE(store.RegisterModel("p", Model(), options).ok());
  ASSERT_TRUE(store.Put("p", {Sample("v1", 4, "", 0, 1), Sample("v2", 4, "", 0, 2),
                              Sample("v3", 4, "", 0, 3), Sample("v1b", 4, "", 0, 1)})
                  .ok());
  // v1b sits in a live step: never touched by a drop.
  StepRequest held = Request("held");
  held.sample_ids = {"v1b"};
  ASSERT_TRUE(store.CreateStep(held).ok());
  absl::StatusOr<PoolStats> after = store.SetPolicyVersion("p", 3);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->policy_version, 3);
  EXPECT_EQ(after->num_stale_dropped, 1);  // v1; v2 is 3 - 1, still fresh
  EXPECT_EQ(after->num_samples, 3);
  // A lower version changes nothing.
  EXPECT_EQ(store.SetPolicyVersion("p", 2)->policy_version, 3);
  // Stale at the request's version (4, bound 0): named, and the refused
  // CreateStep records nothing (v2 is still there, the version still 3).
  StepRequest explicit_stale = Request("x");
  explicit_stale.sample_ids = {"v2"};
  explicit_stale.selection.policy_version = 4;
  explicit_stale.selection.max_staleness = 0;
  absl::StatusOr<std::shared_ptr<const Step>> refused = store.CreateStep(explicit_stale);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("sample \"v2\" is stale: its policy_version 2 is older than 4"));
  EXPECT_EQ(store.GetPool("p")->policy_version, 3);
  EXPECT_EQ(store.GetPool("p")->num_samples, 3);
  // At version 4 under the pool's bound (1), v2 is skipped; the step then
  // records 4, and drop_stale deletes v2.
  StepRequest count = Request("c");
  count.selection.num_samples = 1;
  count.selection.policy_version = 4;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(count);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT(Ids(**step), ElementsAre("v3"));
  EXPECT_EQ(store.GetPool("p")->policy_version, 4);
  EXPECT_EQ(store.GetPool("p")->num_stale_dropped, 2);
  EXPECT_TRUE(store.GetStep("held").ok());
}

TEST(SampleStoreLifecycle, StaleWithoutDropIsSkippedAndExplicitIdIsNamed) {
  SampleStore store(1 << 24);
  PoolOptions options;
  options.max_staleness = 0;
  ASSERT_TRUE(store.RegisterModel("p", Model(), options).ok());
  ASSERT_TRUE(store.Put("p", {Sample("v1", 4, "", 0, 1), Sample("v2", 4, "", 0, 2)}).ok());
  ASSERT_TRUE(store.SetPolicyVersion("p", 2).ok());
  EXPECT_EQ(store.GetPool("p")->num_stale_samples, 1);
  StepRequest explicit_stale = Request("x");
  explicit_stale.sample_ids = {"v1"};
  // Version 0 is "unknown": no staleness check, whatever the pool's.
  StepRequest unknown = explicit_stale;
  unknown.step_id = "unknown";
  ASSERT_TRUE(store.CreateStep(unknown).ok());
  ASSERT_TRUE(store.ReleaseStep("unknown").ok());
  ASSERT_TRUE(store.Put("p", {Sample("v1", 4, "", 0, 1)}).ok());
  explicit_stale.selection.policy_version = 2;
  absl::StatusOr<std::shared_ptr<const Step>> refused = store.CreateStep(explicit_stale);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("sample \"v1\" is stale: its policy_version 1 is older than 2 - "
                        "max_staleness 0"));
  // A step may loosen the bound.
  explicit_stale.selection.max_staleness = 5;
  EXPECT_TRUE(store.CreateStep(explicit_stale).ok());
}

TEST(SampleStoreLifecycle, ReuseReturnsSamplesInIngestOrderUntilMaxUses) {
  SampleStore store(1 << 24);
  PoolOptions options;
  options.max_uses = 2;
  ASSERT_TRUE(store.RegisterModel("p", Model(), options).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a", 4), Sample("b", 4), Sample("c", 4)}).ok());
  StepRequest epoch = Request("e1");
  epoch.selection.num_samples = 2;
  epoch.reuse_samples = true;
  ASSERT_TRUE(store.CreateStep(epoch).ok());
  absl::StatusOr<ReleaseResult> released = store.ReleaseStep("e1");
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(released->returned_samples, 2);
  EXPECT_EQ(released->released_samples, 0);
  // Back in ingest order: a and b are again the oldest.
  epoch.step_id = "e2";
  absl::StatusOr<std::shared_ptr<const Step>> again = store.CreateStep(epoch);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(Ids(**again), ElementsAre("a", "b"));
  // A sample in a live step is in no other.
  StepRequest explicit_a = Request("x");
  explicit_a.sample_ids = {"a"};
  EXPECT_EQ(store.CreateStep(explicit_a).status().code(), absl::StatusCode::kFailedPrecondition);
  released = store.ReleaseStep("e2");
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(released->returned_samples, 0);
  EXPECT_EQ(released->released_samples, 2);  // second use: max_uses reached
  EXPECT_GT(released->freed_bytes, 0);
  EXPECT_EQ(store.GetPool("p")->num_samples, 1);
}

// A group that expires while some of its samples are in a live step is
// counted once, takes no late sample, and comes back the same from the log
// (compacted too) until its last sample goes.
TEST(SampleStoreLifecycle, AGroupExpiredWithSamplesInAStepIsCountedOnceAndClosed) {
  TempDir dir;
  PoolOptions options;
  options.incomplete_group_timeout_ms = 1000;
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    SampleStore& store = *d->store;
    ASSERT_TRUE(store.RegisterModel("p", Model(), options).ok());
    ASSERT_TRUE(store.Put("p", {Sample("x", 4, "g", 3), Sample("y", 4, "g", 3)}).ok());
    StepRequest held = Request("held");
    held.sample_ids = {"x"};
    ASSERT_TRUE(store.CreateStep(held).ok());
    const absl::Time later = absl::Now() + absl::Seconds(2);
    EXPECT_EQ(store.DropExpiredGroups(later)->groups, 1);
    EXPECT_EQ(store.DropExpiredGroups(later)->groups, 0);  // not again
    absl::StatusOr<PutResult> late = store.Put("p", {Sample("z", 4, "g", 3)});
    EXPECT_EQ(late.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(late.status().message(), HasSubstr("group \"g\" was dropped"));
    ASSERT_TRUE(store.CompactLog().ok());
  }
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  PoolStats pool = *d->store->GetPool("p");
  EXPECT_EQ(pool.num_incomplete_groups_dropped, 1);
  EXPECT_EQ(pool.num_incomplete_groups, 0);
  EXPECT_EQ(pool.num_samples, 1);
  EXPECT_EQ(d->store->DropExpiredGroups(absl::Now() + absl::Seconds(2))->groups, 0);
  EXPECT_EQ(d->store->Put("p", {Sample("z", 4, "g", 3)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Its last sample released, the id may start a new group.
  ASSERT_TRUE(d->store->ReleaseStep("held").ok());
  EXPECT_TRUE(d->store->Put("p", {Sample("z", 4, "g", 3)}).ok());
  EXPECT_EQ(d->store->GetPool("p")->num_incomplete_groups_dropped, 1);
}

// Reused samples keep holding memory: --max-memory refuses more until a
// release deletes them (max_uses) or a plain release frees them.
TEST(SampleStoreLifecycle, ReusedSamplesHoldMemoryUntilTheirLastUse) {
  const int64_t one = SampleStore::MemoryBytes(Sample("x", 64));  // every id here is one character
  SampleStore store(3 * one);
  PoolOptions options;
  options.max_uses = 2;
  ASSERT_TRUE(store.RegisterModel("p", Model(), options).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a", 64), Sample("b", 64), Sample("c", 64)}).ok());
  StepRequest epoch = Request("e1");
  epoch.sample_ids = {"a", "b"};
  epoch.reuse_samples = true;
  ASSERT_TRUE(store.CreateStep(epoch).ok());
  ASSERT_EQ(store.ReleaseStep("e1")->freed_bytes, 0);
  EXPECT_EQ(store.Put("p", {Sample("d", 64)}).status().code(),
            absl::StatusCode::kResourceExhausted);
  epoch.step_id = "e2";
  ASSERT_TRUE(store.CreateStep(epoch).ok());
  absl::StatusOr<ReleaseResult> last = store.ReleaseStep("e2");
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->released_samples, 2);
  EXPECT_EQ(last->freed_bytes, 2 * one);
  EXPECT_TRUE(store.Put("p", {Sample("d", 64)}).ok());
}

// A sample of a dropped group that comes back from a reuse step, or from a
// CreateStep that failed while the group was dropped, is deleted, not
// returned to the free set (where nothing would ever take or drop it); the
// log replays the same.
TEST(SampleStoreLifecycle, AClosedGroupsSampleIsDeletedWhenItComesBack) {
  TempDir dir;
  PoolOptions options;
  options.incomplete_group_timeout_ms = 1000;
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    SampleStore& store = *d->store;
    ASSERT_TRUE(store.RegisterModel("p", Model(), options).ok());
    ASSERT_TRUE(store.Put("p", {Sample("x", 4, "g", 3), Sample("y", 4, "g", 3),
                                Sample("u", 4)})
                    .ok());
    StepRequest reuse = Request("r");
    reuse.sample_ids = {"x", "u"};
    reuse.reuse_samples = true;
    ASSERT_TRUE(store.CreateStep(reuse).ok());
    ASSERT_EQ(store.DropExpiredGroups(absl::Now() + absl::Seconds(2))->groups, 1);
    absl::StatusOr<ReleaseResult> released = store.ReleaseStep("r");
    ASSERT_TRUE(released.ok());
    EXPECT_EQ(released->returned_samples, 1);  // u
    EXPECT_EQ(released->released_samples, 1);  // x, its group closed
    EXPECT_EQ(store.GetPool("p")->num_samples, 1);
  }
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  PoolStats pool = *d->store->GetPool("p");
  EXPECT_EQ(pool.num_samples, 1);
  EXPECT_EQ(pool.num_free_samples, 1);
  EXPECT_EQ(pool.num_incomplete_groups_dropped, 1);
  // The group is forgotten with its last sample: its id starts afresh.
  EXPECT_TRUE(d->store->Put("p", {Sample("z", 4, "g", 3)}).ok());
}

TEST(SampleStoreLifecycle, IncompleteGroupsPastTheirTimeoutAreDroppedAndCounted) {
  SampleStore store(1 << 24);
  PoolOptions options;
  options.incomplete_group_timeout_ms = 1000;
  ASSERT_TRUE(store.RegisterModel("p", Model(), options).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a1", 4, "a", 2), Sample("b1", 4, "b", 2),
                              Sample("b2", 4, "b", 2), Sample("u", 4)})
                  .ok());
  EXPECT_EQ(store.DropExpiredGroups(absl::Now())->groups, 0);
  absl::StatusOr<DropResult> dropped = store.DropExpiredGroups(absl::Now() + absl::Seconds(2));
  ASSERT_TRUE(dropped.ok());
  EXPECT_EQ(dropped->groups, 1);
  EXPECT_EQ(dropped->group_samples, 1);
  PoolStats pool = *store.GetPool("p");
  EXPECT_EQ(pool.num_samples, 3);
  EXPECT_EQ(pool.num_incomplete_groups_dropped, 1);
  EXPECT_EQ(pool.num_incomplete_groups, 0);
  EXPECT_EQ(pool.num_complete_groups, 1);
}

// Every lifecycle change is in the log: a reopened store (and one reopened
// after compaction) is the same pool.
TEST(SampleStoreLifecycle, TheDurableLogKeepsGroupsVersionsDropsAndUses) {
  TempDir dir;
  PoolOptions options;
  options.max_staleness = 0;
  options.drop_stale = true;
  options.max_uses = 2;
  options.default_group_size = 2;
  auto check = [](SampleStore& store) {
    PoolStats pool = *store.GetPool("p");
    EXPECT_EQ(pool.options.max_uses, 2);
    EXPECT_EQ(pool.policy_version, 5);
    EXPECT_EQ(pool.num_stale_dropped, 1);
    EXPECT_EQ(pool.num_complete_groups, 1);
    EXPECT_EQ(pool.num_samples, 3);
  };
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_TRUE(d->store->RegisterModel("p", Model(), options).ok());
    ASSERT_TRUE(d->store->Put("p", {Sample("old", 4, "", 0, 1), Sample("g1", 4, "g", 0, 5),
                                    Sample("g2", 4, "g", 0, 5), Sample("r", 4, "", 0, 5)})
                    .ok());
    ASSERT_TRUE(d->store->SetPolicyVersion("p", 5).ok());
    StepRequest reuse = Request("r1");
    reuse.sample_ids = {"r"};
    reuse.reuse_samples = true;
    ASSERT_TRUE(d->store->CreateStep(reuse).ok());
    ASSERT_EQ(d->store->ReleaseStep("r1")->returned_samples, 1);
    check(*d->store);
  }
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    check(*d->store);
    if (round == 0) ASSERT_TRUE(d->store->CompactLog().ok());
  }
  // The use count came back: r's second use deletes it.
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  StepRequest reuse = Request("r2");
  reuse.sample_ids = {"r"};
  reuse.reuse_samples = true;
  ASSERT_TRUE(d->store->CreateStep(reuse).ok());
  EXPECT_EQ(d->store->ReleaseStep("r2")->released_samples, 1);
  StepRequest group = Request("g");
  group.selection.num_groups = 1;
  absl::StatusOr<std::shared_ptr<const Step>> step = d->store->CreateStep(group);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT(Ids(**step), ElementsAre("g1", "g2"));
}

}  // namespace
}  // namespace rollpack
