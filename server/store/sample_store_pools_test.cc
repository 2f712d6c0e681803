// Whole pools at the store: DeletePool (bytes freed, steps refused or ended,
// durable, the name free again) and ListSamplePage (complete, in id order,
// filtered).
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/durable_store.h"
#include "testing/store_samples.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using store_testing::Model;
using store_testing::Request;
using store_testing::Sample;
using store_testing::Topo;

ModelSpec OtherModel() {
  ModelSpec m = Model();
  m.name = "other";
  m.num_experts = 8;
  return m;
}

TEST(DeletePoolTest, FreesEveryByteAndForgetsThePool) {
  SampleStore store(int64_t{1} << 24);
  ASSERT_TRUE(store.RegisterModel("keep", Model()).ok());
  ASSERT_TRUE(store.Put("keep", {Sample("k", 8)}).ok());
  const int64_t kept = store.Stats().stored_bytes;
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a", 4), Sample("b", 16, "g", 2), Sample("c", 5, "g", 2)})
                  .ok());
  const int64_t pool_bytes = store.GetPool("p")->stored_bytes;
  ASSERT_GT(pool_bytes, 0);

  absl::StatusOr<SampleStore::PoolDeletion> dry = store.DeletePool("p", false, /*dry_run=*/true);
  ASSERT_TRUE(dry.ok()) << dry.status();
  EXPECT_EQ(dry->samples, 3);
  EXPECT_EQ(dry->bytes, pool_bytes);
  EXPECT_TRUE(store.GetPool("p").ok()) << "a dry run deletes nothing";

  absl::StatusOr<SampleStore::PoolDeletion> deleted = store.DeletePool("p", false);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->samples, 3);
  EXPECT_EQ(deleted->bytes, pool_bytes);
  EXPECT_EQ(store.Stats().stored_bytes, kept);
  EXPECT_EQ(store.Stats().num_samples, 1);
  EXPECT_THAT(store.PoolNames(), ElementsAre("keep"));
  EXPECT_EQ(store.GetPool("p").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Put("p", {Sample("a", 4)}).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<SampleStore::PoolDeletion> again = store.DeletePool("p", true);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(again.status().message(), HasSubstr("pool \"p\" has no registered model"));
  EXPECT_EQ(store.DeletePool("", false).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeletePoolTest, LiveStepsAndHoldsAreNamedUnlessForceEndsThem) {
  SampleStore store(int64_t{1} << 24);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a", 4), Sample("b", 4), Sample("c", 4)}).ok());
  ASSERT_TRUE(store.CreateStep("s1", "p", {"a"}, 0, Topo()).ok());
  ASSERT_TRUE(store.Hold("h1", "p", {"b"}, "member-0:1", 7).ok());
  const int64_t bytes = store.Stats().stored_bytes;

  for (bool dry_run : {false, true}) {
    absl::StatusOr<SampleStore::PoolDeletion> refused = store.DeletePool("p", false, dry_run);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(),
                HasSubstr("pool \"p\" has samples in live steps \"h1\", \"s1\": release them "
                          "first, or delete with force"));
  }
  EXPECT_EQ(store.Stats().stored_bytes, bytes);
  EXPECT_TRUE(store.GetStep("s1").ok());

  absl::StatusOr<SampleStore::PoolDeletion> forced = store.DeletePool("p", true);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_THAT(forced->ended_steps, ElementsAre("h1", "s1"));
  EXPECT_EQ(forced->samples, 3);
  EXPECT_EQ(store.Stats().stored_bytes, 0);
  EXPECT_EQ(store.Stats().num_live_steps, 0);
  EXPECT_EQ(store.GetStep("s1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(store.HoldIds(), IsEmpty());
  EXPECT_EQ(store.ReleaseStep("s1").status().code(), absl::StatusCode::kNotFound);
  // The step ids are free again, in a pool of the same name.
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a", 4)}).ok());
  EXPECT_TRUE(store.CreateStep("s1", "p", {"a"}, 0, Topo()).ok());
}

TEST(DeletePoolTest, TheNameTakesAnotherModelAndOptionsAfterwards) {
  SampleStore store(int64_t{1} << 24);
  PoolOptions options;
  options.default_group_size = 4;
  ASSERT_TRUE(store.RegisterModel("p", Model(), options).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a", 4, "g")}).ok());
  EXPECT_EQ(store.RegisterModel("p", OtherModel()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store.DeletePool("p", false).ok());
  absl::StatusOr<bool> created = store.RegisterModel("p", OtherModel());
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(*created);
  EXPECT_EQ(store.GetModel("p")->name, "other");
  EXPECT_EQ(store.GetOptions("p")->default_group_size, 0);
  // Nothing of the old pool is left: the same id is a new sample, its group new.
  ASSERT_TRUE(store.Put("p", {Sample("a", 9, "g", 2)}).ok());
  EXPECT_EQ(store.GetPool("p")->num_samples, 1);
  EXPECT_EQ(store.GetPool("p")->num_incomplete_groups, 1);
}

TEST(DeletePoolTest, ADurableDeletionStaysThroughReplayAndCompaction) {
  TempDir dir;
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    SampleStore& store = *d->store;
    ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
    ASSERT_TRUE(store.RegisterModel("q", Model()).ok());
    ASSERT_TRUE(store.Put("p", {Sample("a", 4), Sample("b", 4)}).ok());
    ASSERT_TRUE(store.Put("q", {Sample("x", 4)}).ok());
    ASSERT_TRUE(store.CreateStep("s1", "p", {"a"}, 0, Topo()).ok());
    ASSERT_TRUE(store.DeletePool("p", /*force=*/true).ok());
    ASSERT_TRUE(store.DeletePool("q", false).ok());
    // q again, with another model: the log holds both of its lives.
    ASSERT_TRUE(store.RegisterModel("q", OtherModel()).ok());
    ASSERT_TRUE(store.Put("q", {Sample("y", 6)}).ok());
  }
  for (int reopen = 0; reopen < 2; ++reopen) {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    SampleStore& store = *d->store;
    EXPECT_THAT(store.PoolNames(), ElementsAre("q")) << "reopen " << reopen;
    EXPECT_EQ(store.GetStep("s1").status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(store.GetModel("q")->name, "other");
    absl::StatusOr<SampleStore::SamplePage> page = store.ListSamplePage("q", {});
    ASSERT_TRUE(page.ok()) << page.status();
    ASSERT_EQ(page->samples.size(), 1u);
    EXPECT_EQ(page->samples[0].sample_id(), "y");
    EXPECT_EQ(store.Stats().stored_bytes, store.GetPool("q")->stored_bytes);
    // The second reopen reads the compacted log: no record of p is left.
    ASSERT_TRUE(store.CompactLog().ok());
  }
}

class ListSamplePageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PoolOptions options;
    options.max_staleness = 1;
    ASSERT_TRUE(store_.RegisterModel("p", Model(), options).ok());
    std::vector<StoredSample> samples;
    for (int i = 0; i < 250; ++i) {
      char id[16];
      snprintf(id, sizeof(id), "s%03d", i);
      // Groups of 5; versions 1 and 3 alternating.
      samples.push_back(Sample(id, 1 + i % 7, "g" + std::to_string(i / 5), 5, i % 2 ? 3 : 1));
      samples.back().scalars["reward"] = i;
    }
    // Stored in an order that is not the ids'.
    std::shuffle(samples.begin(), samples.end(), std::mt19937(42));
    ASSERT_TRUE(store_.Put("p", std::move(samples)).ok());
  }

  std::vector<v1::SampleInfo> All(SampleStore::SamplePageRequest request) {
    std::vector<v1::SampleInfo> all;
    for (int pages = 0; pages < 1000; ++pages) {
      absl::StatusOr<SampleStore::SamplePage> page = store_.ListSamplePage("p", request);
      EXPECT_TRUE(page.ok()) << page.status();
      if (!page.ok()) break;
      EXPECT_LE(page->samples.size(), static_cast<size_t>(request.limit));
      all.insert(all.end(), page->samples.begin(), page->samples.end());
      if (!page->more) break;
      EXPECT_EQ(page->samples.size(), static_cast<size_t>(request.limit));
      request.after = page->samples.back().sample_id();
    }
    return all;
  }

  SampleStore store_{int64_t{1} << 26};
};

TEST_F(ListSamplePageTest, PagesAreCompleteInIdOrderAndTheSameEachTime) {
  for (int limit : {1, 7, 100, 250, 10000}) {
    SampleStore::SamplePageRequest request;
    request.limit = limit;
    std::vector<v1::SampleInfo> all = All(request);
    ASSERT_EQ(all.size(), 250u) << "limit " << limit;
    for (int i = 0; i < 250; ++i) {
      char id[16];
      snprintf(id, sizeof(id), "s%03d", i);
      EXPECT_EQ(all[i].sample_id(), id);
      EXPECT_EQ(all[i].num_tokens(), 1 + i % 7);
      EXPECT_EQ(all[i].group_id(), "g" + std::to_string(i / 5));
      EXPECT_EQ(all[i].group_size(), 5);
      EXPECT_EQ(all[i].policy_version(), i % 2 ? 3 : 1);
      EXPECT_EQ(all[i].state(), v1::SAMPLE_STATE_FREE);
      EXPECT_EQ(all[i].scalars().at("reward"), i);
      EXPECT_GT(all[i].stored_bytes(), 0);
      EXPECT_GT(all[i].arrival_unix_nanos(), 0);
    }
  }
  SampleStore::SamplePageRequest past_the_end;
  past_the_end.after = "s999";
  EXPECT_THAT(store_.ListSamplePage("p", past_the_end)->samples, IsEmpty());
  EXPECT_EQ(store_.ListSamplePage("nope", {}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ListSamplePageTest, StatesAndGroupsFilterWithTheStepNamed) {
  ASSERT_TRUE(store_.CreateStep("s1", "p", {"s010", "s002"}, 0, Topo()).ok());
  // Version 3 makes the version-1 samples stale (max_staleness 1).
  ASSERT_TRUE(store_.SetPolicyVersion("p", 3).ok());
  SampleStore::SamplePageRequest request;
  request.limit = 3;
  request.state = v1::SAMPLE_STATE_HELD;
  std::vector<v1::SampleInfo> held = All(request);
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[0].sample_id(), "s002");
  EXPECT_EQ(held[1].sample_id(), "s010");
  EXPECT_EQ(held[0].step_id(), "s1");
  EXPECT_EQ(held[1].step_id(), "s1");

  request.state = v1::SAMPLE_STATE_STALE;
  std::vector<v1::SampleInfo> stale = All(request);
  // The 125 even (version 1) samples but the two held ones.
  EXPECT_EQ(stale.size(), 123u);
  for (const v1::SampleInfo& s : stale) EXPECT_EQ(s.policy_version(), 1) << s.sample_id();

  request.state = v1::SAMPLE_STATE_FREE;
  EXPECT_EQ(All(request).size(), 125u);

  request.state = v1::SAMPLE_STATE_UNSPECIFIED;
  request.group_id = "g2";
  std::vector<v1::SampleInfo> group = All(request);
  ASSERT_EQ(group.size(), 5u);
  EXPECT_EQ(group[0].sample_id(), "s010");
  EXPECT_EQ(group[0].state(), v1::SAMPLE_STATE_HELD);
  EXPECT_EQ(group[1].state(), v1::SAMPLE_STATE_FREE);
  EXPECT_EQ(group[2].state(), v1::SAMPLE_STATE_STALE);
}

TEST(CompleteGroupsTest, AnswersTheGroupsAskedThatAreCompleteHereInIdOrder) {
  SampleStore store(int64_t{1} << 24);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store
                  .Put("p", {Sample("z1", 4, "z", 2), Sample("z2", 4, "z", 2),
                             Sample("a1", 4, "a", 2), Sample("a2", 6, "a", 2),
                             Sample("half", 4, "h", 2), Sample("loose", 4)})
                  .ok());
  absl::StatusOr<std::vector<GroupShareStats>> complete =
      store.CompleteGroups("p", {"z", "h", "a", "nowhere", "a"});
  ASSERT_TRUE(complete.ok()) << complete.status();
  ASSERT_EQ(complete->size(), 2u) << "\"h\" is incomplete, \"nowhere\" not here, \"a\" asked twice";
  EXPECT_EQ((*complete)[0].group_id, "a");
  EXPECT_EQ((*complete)[0].group_size, 2);
  EXPECT_EQ((*complete)[0].num_sealed, 2);
  EXPECT_EQ((*complete)[1].group_id, "z");
  EXPECT_THAT(*store.CompleteGroups("p", {}), IsEmpty());
  EXPECT_EQ(store.CompleteGroups("q", {"z"}).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace rollpack
