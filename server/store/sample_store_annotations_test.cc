// Annotations at the store (../shared/spec/lifecycle.md section 6): every
// refusal of AnnotateSamples, all or nothing, the two-phase form a cluster
// uses, and required_scalars in every way a step selects samples.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/convert.h"
#include "server/store/sample_store.h"
#include "testing/store_samples.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using store_testing::Model;
using store_testing::Request;
using store_testing::Sample;
using store_testing::Taken;
using store_testing::Topo;

StoredSample WithReward(StoredSample s, double reward) {
  s.scalars["reward"] = reward;
  return s;
}

std::vector<ScalarAnnotation> Rewards(std::vector<std::pair<std::string, double>> rewards) {
  std::vector<ScalarAnnotation> out;
  for (const auto& [id, r] : rewards) out.push_back({id, {{"reward", r}}});
  return out;
}

PoolOptions Required(std::vector<std::string> names, int32_t default_group_size = 0) {
  PoolOptions options;
  options.required_scalars = std::move(names);
  options.default_group_size = default_group_size;
  return options;
}

class AnnotationsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(store_.RegisterModel("p", Model()).ok()); }
  SampleStore store_{int64_t{1} << 24};
};

TEST_F(AnnotationsTest, EveryRefusalNamesWhatItRefusesAndChangesNothing) {
  ASSERT_TRUE(store_.Put("p", {Sample("a", 4), WithReward(Sample("b", 4), 0.5), Sample("c", 4)})
                  .ok());
  const int64_t bytes = store_.Stats().stored_bytes;
  auto refused = [&](const std::string& pool, std::vector<ScalarAnnotation> annotations,
                     absl::StatusCode code, const std::string& words) {
    absl::StatusOr<int32_t> result = store_.AnnotateSamples(pool, annotations);
    EXPECT_EQ(result.status().code(), code) << result.status();
    EXPECT_THAT(result.status().message(), HasSubstr(words));
    // All or nothing: the valid entry before the refused one is not applied.
    EXPECT_EQ(Taken(store_, "a").scalars.count("reward"), 0u);
    EXPECT_EQ(store_.Stats().stored_bytes, bytes);
  };
  refused("nope", Rewards({{"a", 1}}), absl::StatusCode::kNotFound,
          "pool \"nope\" has no registered model");
  refused("p", Rewards({{"a", 1}, {"c", 2}, {"a", 1}}), absl::StatusCode::kInvalidArgument,
          "sample \"a\" appears twice in one AnnotateSamples request");
  refused("p", Rewards({{"a", 1}, {"zz", 2}}), absl::StatusCode::kNotFound,
          "sample \"zz\" is not in pool \"p\"");
  refused("p", Rewards({{"a", 1}, {"", 2}}), absl::StatusCode::kInvalidArgument, "sample_id");
  refused("p", Rewards({{"a", 1}, {"b", 0.75}}), absl::StatusCode::kFailedPrecondition,
          "sample \"b\": scalar \"reward\" is already 0.5, this annotation sets 0.75");
  // Values that differ in their last bit are told apart in the message.
  refused("p", Rewards({{"a", 1}, {"b", std::nextafter(0.5, 1.0)}}),
          absl::StatusCode::kFailedPrecondition,
          "is already 0.5, this annotation sets 0.5000000000000001");
  // A sample in a live step, named with its step.
  ASSERT_TRUE(store_.CreateStep("s1", "p", {"c"}, 0, Topo()).ok());
  refused("p", Rewards({{"a", 1}, {"c", 2}}), absl::StatusCode::kFailedPrecondition,
          "sample \"c\" is in live step \"s1\"");
  // And one a cluster member holds for a step another member planned.
  ASSERT_TRUE(store_.ReleaseStep("s1").ok());
  ASSERT_TRUE(store_.Put("p", {Sample("c", 4)}).ok());
  ASSERT_TRUE(store_.Hold("h1", "p", std::vector<std::string>{"c"}, "m:1", 7).ok());
  refused("p", Rewards({{"a", 1}, {"c", 2}}), absl::StatusCode::kFailedPrecondition,
          "sample \"c\" is in live step \"h1\"");
}

TEST_F(AnnotationsTest, AddsScalarsAndTheSameValueAgainIsANoOp) {
  ASSERT_TRUE(store_.Put("p", {WithReward(Sample("a", 4), 0.5), Sample("b", 4)}).ok());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<ScalarAnnotation> request = {{"a", {{"reward", 0.5}, {"len", 4}}},
                                           {"b", {{"reward", nan}}}};
  absl::StatusOr<int32_t> annotated = store_.AnnotateSamples("p", request);
  ASSERT_TRUE(annotated.ok()) << annotated.status();
  EXPECT_EQ(*annotated, 2);
  // Again, NaN included (compared bit for bit): every entry a no-op, counted.
  const int64_t bytes = store_.Stats().stored_bytes;
  annotated = store_.AnnotateSamples("p", request);
  ASSERT_TRUE(annotated.ok()) << annotated.status();
  EXPECT_EQ(*annotated, 2);
  EXPECT_EQ(store_.Stats().stored_bytes, bytes);
  // An empty request and an entry without scalars are accepted too.
  EXPECT_EQ(*store_.AnnotateSamples("p", {}), 0);
  EXPECT_EQ(*store_.AnnotateSamples("p", {{"a", {}}}), 1);

  const StoredSample a = Taken(store_, "a");
  EXPECT_EQ(a.scalars.at("reward"), 0.5);
  EXPECT_EQ(a.scalars.at("len"), 4);
  EXPECT_THAT(a.later_scalars, ElementsAre("len"));
  EXPECT_TRUE(std::isnan(Taken(store_, "b").scalars.at("reward")));
  // The bytes held follow the samples (nothing left over once they go).
  ASSERT_TRUE(store_.CreateStep("all", "p", {"a", "b"}, 0, Topo()).ok());
  ASSERT_TRUE(store_.ReleaseStep("all").ok());
  EXPECT_EQ(store_.Stats().stored_bytes, 0);
}

TEST_F(AnnotationsTest, AReusedSampleIsAnnotatedBetweenStepsWithoutChangingTheStepBefore) {
  ASSERT_TRUE(store_.Put("p", {Sample("a", 4)}).ok());
  StepRequest request = Request("s1");
  request.sample_ids = {"a"};
  request.reuse_samples = true;
  absl::StatusOr<std::shared_ptr<const Step>> s1 = store_.CreateStep(request);
  ASSERT_TRUE(s1.ok()) << s1.status();
  ASSERT_TRUE(store_.ReleaseStep("s1").ok());
  // The released step is still held (a stream in flight): its sample is
  // not changed under it.
  ASSERT_TRUE(store_.AnnotateSamples("p", Rewards({{"a", 2}})).ok());
  EXPECT_EQ((*s1)->samples[0]->scalars.count("reward"), 0u);
  EXPECT_EQ(Taken(store_, "a").scalars.at("reward"), 2);
  // Memory stays exact through the copy.
  EXPECT_EQ(store_.Stats().stored_bytes, SampleStore::MemoryBytes(Taken(store_, "a")));
}

TEST_F(AnnotationsTest, RequiredScalarsAreCheckedAtRegistration) {
  v1::PoolOptions wire;
  wire.add_required_scalars("reward");
  wire.add_required_scalars("acc");
  absl::StatusOr<PoolOptions> options = FromProto(wire);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_THAT(options->required_scalars, ElementsAre("acc", "reward"));
  SampleStore store(1 << 20);
  EXPECT_TRUE(store.RegisterModel("q", Model(), *options).ok());
  // The same names in another order are the same options; others are not.
  v1::PoolOptions reordered;
  reordered.add_required_scalars("acc");
  reordered.add_required_scalars("reward");
  EXPECT_TRUE(store.RegisterModel("q", Model(), *FromProto(reordered)).ok());
  absl::StatusOr<bool> other = store.RegisterModel("q", Model(), Required({"reward"}));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), HasSubstr("a pool's options are fixed"));
  EXPECT_THAT(store.GetOptions("q")->required_scalars, ElementsAre("acc", "reward"));
  // Names are non-empty and distinct.
  v1::PoolOptions twice;
  twice.add_required_scalars("reward");
  twice.add_required_scalars("reward");
  EXPECT_THAT(FromProto(twice).status().message(),
              HasSubstr("options.required_scalars names \"reward\" twice"));
  v1::PoolOptions empty;
  empty.add_required_scalars("");
  EXPECT_THAT(FromProto(empty).status().message(),
              HasSubstr("options.required_scalars has an empty name"));
  // And go back to the wire as they are held.
  EXPECT_THAT(ToProto(*options).required_scalars(), ElementsAre("acc", "reward"));
}

TEST_F(AnnotationsTest, UnannotatedSamplesAreNotSelectable) {
  SampleStore store(1 << 24);
  ASSERT_TRUE(store.RegisterModel("p", Model(), Required({"reward"})).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a", 4), WithReward(Sample("b", 8), 1), Sample("c", 16),
                              WithReward(Sample("d", 32), 0)})
                  .ok());
  PoolStats pool = *store.GetPool("p");
  EXPECT_EQ(pool.num_unannotated_samples, 2);
  EXPECT_EQ(pool.num_free_samples, 4);

  // By count: the annotated ones, in ingest order.
  StepRequest two = Request("two");
  two.selection.num_samples = 2;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(two);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT((*step)->sample_ids, ElementsAre("b", "d"));
  ASSERT_TRUE(store.ReleaseStep("two").ok());
  StepRequest one = Request("one");
  one.selection.num_samples = 1;
  absl::StatusOr<std::shared_ptr<const Step>> none = store.CreateStep(one);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(),
              HasSubstr("has 0 free samples (2 more lack a required scalar"));

  // An explicit id lacking one, named with the scalar.
  StepRequest explicit_ids = Request("ids");
  explicit_ids.sample_ids = {"c"};
  absl::StatusOr<std::shared_ptr<const Step>> lacking = store.CreateStep(explicit_ids);
  EXPECT_EQ(lacking.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lacking.status().message(), HasSubstr("sample \"c\" lacks scalar \"reward\""));

  // A token budget counts selectable samples only: 20 tokens are free, 4
  // of them selectable.
  StepRequest tokens = Request("tokens");
  tokens.selection.num_tokens = 8;
  absl::StatusOr<std::shared_ptr<const Step>> short_of = store.CreateStep(tokens);
  EXPECT_EQ(short_of.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(short_of.status().message(), HasSubstr("has 0 tokens in 0 free samples"));

  // Annotated, they are selectable, in their ingest (seal) order.
  ASSERT_TRUE(store.AnnotateSamples("p", Rewards({{"c", 3}, {"a", 4}})).ok());
  EXPECT_EQ(store.GetPool("p")->num_unannotated_samples, 0);
  tokens.selection.num_tokens = 20;
  step = store.CreateStep(tokens);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT((*step)->sample_ids, ElementsAre("a", "c"));
}

TEST_F(AnnotationsTest, AGroupIsCompleteOnceEveryMemberIsAnnotated) {
  SampleStore store(1 << 24);
  ASSERT_TRUE(store.RegisterModel("p", Model(), Required({"reward"}, 2)).ok());
  // Group g sealed first but annotated last; group h sealed and annotated
  // in between.
  ASSERT_TRUE(store.Put("p", {Sample("g1", 4, "g"), Sample("g2", 4, "g")}).ok());
  ASSERT_TRUE(store.Put("p", {Sample("h1", 4, "h"), Sample("h2", 4, "h")}).ok());
  ASSERT_TRUE(store.AnnotateSamples("p", Rewards({{"g1", 1}})).ok());
  PoolStats pool = *store.GetPool("p");
  EXPECT_EQ(pool.num_complete_groups, 0);
  EXPECT_EQ(pool.num_incomplete_groups, 2);
  EXPECT_EQ(pool.num_unannotated_samples, 3);
  ASSERT_EQ(pool.incomplete_groups.size(), 2u);
  EXPECT_EQ(pool.incomplete_groups[0].num_sealed, 1);  // g: one counts so far

  StepRequest groups = Request("groups");
  groups.selection.num_groups = 1;
  absl::StatusOr<std::shared_ptr<const Step>> none = store.CreateStep(groups);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("has 0 complete free groups"));

  ASSERT_TRUE(store.AnnotateSamples("p", Rewards({{"h1", 1}, {"h2", 0}})).ok());
  ASSERT_TRUE(store.AnnotateSamples("p", Rewards({{"g2", 0}})).ok());
  pool = *store.GetPool("p");
  EXPECT_EQ(pool.num_complete_groups, 2);
  EXPECT_EQ(pool.num_unannotated_samples, 0);

  // OLDEST: h became complete before g (g's last annotation came later),
  // whatever order they were sealed in.
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(groups);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT((*step)->sample_ids, ElementsAre("h1", "h2"));
  ASSERT_TRUE(store.ReleaseStep("groups").ok());
  // whole_groups with a token budget, and a count of samples, alike.
  StepRequest whole = Request("whole");
  whole.selection.num_samples = 2;
  whole.selection.whole_groups = true;
  step = store.CreateStep(whole);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT((*step)->sample_ids, ElementsAre("g1", "g2"));
}

TEST_F(AnnotationsTest, GroupOrderAfterAnnotationsHoldsOverAPrefixOfManySamples) {
  // More free samples than the store's first prefix (4096): the group an
  // annotation completed last still sorts last.
  SampleStore store(int64_t{1} << 30);
  ASSERT_TRUE(store.RegisterModel("p", Model(), Required({"reward"}, 2)).ok());
  ASSERT_TRUE(store.Put("p", {Sample("late1", 1, "late"), Sample("late2", 1, "late")}).ok());
  std::vector<StoredSample> batch;
  for (int i = 0; i < 5000; ++i) {
    batch.push_back(WithReward(Sample("x" + std::to_string(i), 1, "g" + std::to_string(i / 2)), 1));
  }
  ASSERT_TRUE(store.Put("p", std::move(batch)).ok());
  ASSERT_TRUE(store.AnnotateSamples("p", Rewards({{"late1", 1}, {"late2", 1}})).ok());
  // The first 4096 free samples hold "late" and 2047 other groups: the
  // 2048th group to complete lies past them, and "late" is not it.
  StepRequest first = Request("first");
  first.topology.max_tokens_per_rank = 1 << 16;
  first.selection.num_groups = 2048;
  first.reuse_samples = true;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(first);
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_EQ((*step)->sample_ids.size(), 4096u);
  for (const std::string& id : (*step)->sample_ids) EXPECT_NE(id.substr(0, 4), "late");
  ASSERT_TRUE(store.ReleaseStep("first").ok());
  first.selection.num_groups = 2501;
  step = store.CreateStep(first);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ((*step)->sample_ids.size(), 5002u);
}

TEST_F(AnnotationsTest, NewestVersionAndStalenessSkipUnannotatedSamples) {
  SampleStore store(1 << 24);
  ASSERT_TRUE(store.RegisterModel("p", Model(), Required({"reward"})).ok());
  ASSERT_TRUE(store.Put("p", {WithReward(Sample("old", 4, "", 0, 1), 1), Sample("new", 4, "", 0, 9),
                              WithReward(Sample("mid", 4, "", 0, 5), 1)})
                  .ok());
  StepRequest newest = Request("n");
  newest.selection.num_samples = 1;
  newest.selection.order = SelectionOrder::kNewestVersion;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(newest);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_THAT((*step)->sample_ids, ElementsAre("mid"));
}

TEST_F(AnnotationsTest, IncompleteGroupTimeoutCountsUnannotatedMembersAsMissing) {
  SampleStore store(1 << 24);
  PoolOptions options = Required({"reward"}, 2);
  options.incomplete_group_timeout_ms = 1000;
  ASSERT_TRUE(store.RegisterModel("p", Model(), options).ok());
  ASSERT_TRUE(store.Put("p", {Sample("g1", 4, "g"), WithReward(Sample("g2", 4, "g"), 1)}).ok());
  ASSERT_TRUE(store.Put("p", {WithReward(Sample("h1", 4, "h"), 1),
                              WithReward(Sample("h2", 4, "h"), 1)})
                  .ok());
  absl::StatusOr<DropResult> dropped = store.DropExpiredGroups(absl::Now() + absl::Seconds(2));
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(dropped->groups, 1);
  EXPECT_EQ(dropped->group_samples, 2);
  PoolStats pool = *store.GetPool("p");
  EXPECT_EQ(pool.num_samples, 2);
  EXPECT_EQ(pool.num_unannotated_samples, 0);
  EXPECT_EQ(pool.num_complete_groups, 1);
}

TEST_F(AnnotationsTest, PreparedAnnotationsReserveTheirSamplesUntilCommitOrAbort) {
  ASSERT_TRUE(store_.Put("p", {Sample("a", 4), Sample("b", 4), WithReward(Sample("c", 4), 1)})
                  .ok());
  // Prepare refuses as AnnotateSamples does, and reserves nothing then.
  absl::Status conflict =
      store_.PrepareAnnotations("p", "t0", Rewards({{"a", 1}, {"c", 2}}), absl::Seconds(30));
  EXPECT_EQ(conflict.code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(
      store_.PrepareAnnotations("p", "t1", Rewards({{"a", 1}, {"b", 2}}), absl::Seconds(30)).ok());
  // A retry of the prepare is fine.
  ASSERT_TRUE(
      store_.PrepareAnnotations("p", "t1", Rewards({{"a", 1}, {"b", 2}}), absl::Seconds(30)).ok());
  // Reserved: no step takes them, by id or by count, no hold either, nor
  // another annotation.
  absl::StatusOr<std::shared_ptr<const Step>> by_id = store_.CreateStep("s", "p", {"a"}, 0, Topo());
  EXPECT_EQ(by_id.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(by_id.status().message(), HasSubstr("sample \"a\" is being annotated"));
  absl::StatusOr<std::shared_ptr<const Step>> by_count = store_.CreateStep("s", "p", {}, 3, Topo());
  EXPECT_EQ(by_count.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store_.Hold("h", "p", std::vector<std::string>{"b"}, "m:1", 1).code(),
            absl::StatusCode::kAborted);
  absl::StatusOr<int32_t> other = store_.AnnotateSamples("p", {{"b", {{"acc", 1}}}});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(other.status().message(), HasSubstr("sample \"b\": another AnnotateSamples call"));
  EXPECT_EQ(
      store_.PrepareAnnotations("p", "t2", Rewards({{"b", 2}}), absl::Seconds(30)).code(),
      absl::StatusCode::kAborted);
  // A sample the reservation does not hold is free to go.
  ASSERT_TRUE(store_.CreateStep("c-step", "p", {"c"}, 0, Topo()).ok());
  ASSERT_TRUE(store_.ReleaseStep("c-step").ok());

  absl::StatusOr<int32_t> committed = store_.CommitAnnotations("p", "t1");
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*committed, 2);
  // Its retry answers as the first; the samples are free again.
  EXPECT_EQ(*store_.CommitAnnotations("p", "t1"), 2);
  EXPECT_EQ(Taken(store_, "b").scalars.at("reward"), 2);

  ASSERT_TRUE(store_.Put("p", {Sample("d", 4)}).ok());
  ASSERT_TRUE(store_.PrepareAnnotations("p", "t3", Rewards({{"d", 5}}), absl::Seconds(30)).ok());
  ASSERT_TRUE(store_.AbortAnnotations("p", "t3").ok());
  ASSERT_TRUE(store_.AbortAnnotations("p", "t3").ok());
  EXPECT_EQ(Taken(store_, "d").scalars.count("reward"), 0u);
  absl::StatusOr<int32_t> aborted = store_.CommitAnnotations("p", "t3");
  EXPECT_EQ(aborted.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(aborted.status().message(), HasSubstr("annotation ticket \"t3\""));
}

TEST_F(AnnotationsTest, AnExpiredReservationLapses) {
  ASSERT_TRUE(store_.Put("p", {Sample("a", 4)}).ok());
  ASSERT_TRUE(
      store_.PrepareAnnotations("p", "t", Rewards({{"a", 1}}), absl::Milliseconds(20)).ok());
  absl::SleepFor(absl::Milliseconds(60));
  ASSERT_TRUE(store_.CreateStep("s", "p", {"a"}, 0, Topo()).ok());
  ASSERT_TRUE(store_.ReleaseStep("s").ok());
  ASSERT_TRUE(store_.Put("p", {Sample("b", 4)}).ok());
  absl::StatusOr<int32_t> late = store_.CommitAnnotations("p", "t");
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_.PrepareAnnotations("p", "u", Rewards({{"b", 1}}), absl::ZeroDuration()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(AnnotationsTest, ACommitLeavesOutSamplesDeletedMeanwhile) {
  SampleStore store(1 << 24);
  PoolOptions options;
  options.incomplete_group_timeout_ms = 1000;
  ASSERT_TRUE(store.RegisterModel("p", Model(), options).ok());
  ASSERT_TRUE(store.Put("p", {Sample("g1", 4, "g", 2), Sample("a", 4)}).ok());
  ASSERT_TRUE(
      store.PrepareAnnotations("p", "t", Rewards({{"g1", 1}, {"a", 2}}), absl::Seconds(30)).ok());
  ASSERT_TRUE(store.DropExpiredGroups(absl::Now() + absl::Seconds(2)).ok());
  // A new sample of the same id is not the one prepared.
  ASSERT_TRUE(store.Put("p", {Sample("g1", 4)}).ok());
  absl::StatusOr<int32_t> committed = store.CommitAnnotations("p", "t");
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*committed, 1);
  EXPECT_EQ(Taken(store, "g1").scalars.count("reward"), 0u);
  EXPECT_EQ(Taken(store, "a").scalars.at("reward"), 2);
}

}  // namespace
}  // namespace rollpack
