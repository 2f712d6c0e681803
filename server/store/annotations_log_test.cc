// Annotations (../shared/spec/lifecycle.md section 6) with samples sent in
// pieces, and through the durable log: a later piece is compared with the
// scalars a sample has now, re-sends with what was put, and a restart,
// before or after compaction, brings back the same scalars, the same
// re-send answers and the same order of groups.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ingest/sample_validation.h"
#include "server/store/sample_store.h"
#include "testing/durable_store.h"
#include "testing/ndarrays.h"
#include "testing/store_samples.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using store_testing::Model;
using store_testing::Request;
using store_testing::Taken;

// Tokens [begin, end) of sample `id` with routed rows for the same tokens.
v1::Sample Piece(const std::string& id, int piece, bool partial, int64_t begin, int64_t end,
                 std::map<std::string, double> scalars = {}) {
  v1::Sample s;
  s.set_sample_id(id);
  s.set_piece(piece);
  s.set_partial(partial);
  if (piece == 0) {
    s.set_group_id("g-" + id);
    s.set_group_size(1);
  }
  s.mutable_scalars()->insert(scalars.begin(), scalars.end());
  const int64_t t = end - begin;
  std::vector<int32_t> tokens, ids;
  for (int64_t i = begin; i < end; ++i) {
    tokens.push_back(static_cast<int32_t>(100 + i));
    ids.push_back(static_cast<int32_t>(i % 4));
    ids.push_back(static_cast<int32_t>((i + 1) % 4));
  }
  *s.mutable_tokens() = TestArray(v1::INT32, {t}, tokens);
  *s.mutable_routed_experts() = TestArray(v1::INT32, {t, 2, 1}, ids);
  s.set_routed_experts_row_offset(static_cast<int32_t>(begin));
  return s;
}

v1::Sample Whole(const std::string& id, std::map<std::string, double> scalars = {},
                 const std::string& group = "", int32_t group_size = 0) {
  v1::Sample s = Piece(id, 0, false, 0, 4, std::move(scalars));
  s.clear_piece();
  s.set_group_id(group);
  s.set_group_size(group_size);
  return s;
}

absl::StatusOr<PutResult> Put(SampleStore& store, const v1::Sample& message) {
  absl::StatusOr<StoredSample> validated = ValidateSample(message, Model());
  if (!validated.ok()) return validated.status();
  std::vector<StoredSample> batch;
  batch.push_back(*std::move(validated));
  return store.Put("p", std::move(batch));
}

std::vector<ScalarAnnotation> Reward(const std::string& id, double reward) {
  return {{id, {{"reward", reward}}}};
}

// The groups taken one at a time by OLDEST (each step released whole).
std::vector<std::string> GroupOrder(SampleStore& store, int groups) {
  std::vector<std::string> order;
  for (int i = 0; i < groups; ++i) {
    StepRequest request = Request("order-" + std::to_string(i));
    request.selection.num_groups = 1;
    request.reuse_samples = true;
    absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(request);
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) return order;
    order.push_back((*step)->samples.at(0)->group_id);
    // Held until every group was taken once, so each is taken once.
  }
  for (int i = 0; i < groups; ++i) {
    EXPECT_TRUE(store.ReleaseStep("order-" + std::to_string(i)).ok());
  }
  return order;
}

PoolOptions RequiresReward() {
  PoolOptions options;
  options.required_scalars = {"reward"};
  return options;
}

TEST(AnnotationsPieces, ALaterPieceIsComparedWithTheScalarsTheSampleHasNow) {
  SampleStore store(1 << 24);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(Put(store, Piece("s", 0, true, 0, 3, {{"len", 3}})).ok());
  ASSERT_TRUE(store.AnnotateSamples("p", Reward("s", 0.5)).ok());
  EXPECT_EQ(store.GetOpenSample("p", "s")->scalars.at("reward"), 0.5);
  // Another value than the annotation's.
  absl::StatusOr<PutResult> other = Put(store, Piece("s", 1, true, 3, 5, {{"reward", 1}}));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.status().message(),
              HasSubstr("sample \"s\" piece 1: scalars[\"reward\"] is 1, the sample has 0.5"));
  // A name the sample lacks, on a piece that does not seal it.
  absl::StatusOr<PutResult> early = Put(store, Piece("s", 1, true, 3, 5, {{"acc", 1}}));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(early.status().message(), HasSubstr("scalars[\"acc\"] is 1, a scalar the sample lacks"));
  // The same values (piece 0's, the annotation's) again are fine.
  ASSERT_TRUE(Put(store, Piece("s", 1, true, 3, 5, {{"reward", 0.5}, {"len", 3}})).ok());
  // The sealing piece may bring a scalar the sample lacks.
  ASSERT_TRUE(Put(store, Piece("s", 2, false, 5, 7, {{"acc", 1}})).ok());
  StoredSample sealed = Taken(store, "s");
  EXPECT_EQ(sealed.scalars.at("acc"), 1);
  EXPECT_EQ(sealed.scalars.at("reward"), 0.5);
  EXPECT_EQ(sealed.scalars.at("len"), 3);
  EXPECT_THAT(sealed.later_scalars, ElementsAre("acc", "reward"));

  // Re-sends are compared with the pieces as put: each is a duplicate.
  for (const v1::Sample& again :
       {Piece("s", 0, true, 0, 3, {{"len", 3}}), Piece("s", 1, true, 3, 5),
        Piece("s", 2, false, 5, 7, {{"acc", 1}})}) {
    absl::StatusOr<PutResult> resent = Put(store, again);
    ASSERT_TRUE(resent.ok()) << resent.status();
    EXPECT_EQ(resent->duplicates, 1);
  }
  // Piece 0 with the later scalars is not piece 0 as put.
  absl::StatusOr<PutResult> changed = Put(store, Piece("s", 0, true, 0, 3, {{"len", 3}, {"acc", 1}}));
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(AnnotationsPieces, AWholeSampleResentAfterAnnotationsIsADuplicate) {
  SampleStore store(1 << 24);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(Put(store, Whole("w", {{"len", 4}})).ok());
  ASSERT_TRUE(store.AnnotateSamples("p", Reward("w", 1)).ok());
  absl::StatusOr<PutResult> again = Put(store, Whole("w", {{"len", 4}}));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->duplicates, 1);
  absl::StatusOr<PutResult> with_reward = Put(store, Whole("w", {{"len", 4}, {"reward", 1}}));
  EXPECT_EQ(with_reward.status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(AnnotationsPieces, APieceWaitsForAPreparedAnnotationOfTheSameName) {
  SampleStore store(1 << 24);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(Put(store, Piece("s", 0, true, 0, 3)).ok());
  ASSERT_TRUE(store.PrepareAnnotations("p", "t", Reward("s", 1), absl::Seconds(30)).ok());
  absl::StatusOr<PutResult> sealing = Put(store, Piece("s", 1, false, 3, 5, {{"reward", 1}}));
  EXPECT_EQ(sealing.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(sealing.status().message(), HasSubstr("an annotation of this sample that sets it"));
  // Other names, and sealing, go on meanwhile.
  ASSERT_TRUE(Put(store, Piece("s", 1, false, 3, 5, {{"acc", 1}})).ok());
  ASSERT_TRUE(store.CommitAnnotations("p", "t").ok());
  EXPECT_EQ(Taken(store, "s").scalars.at("reward"), 1);
}

TEST(AnnotationsLog, ARestartBringsBackAnnotationsBeforeAndAfterCompaction) {
  TempDir dir;
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    PoolOptions options = RequiresReward();
    options.default_group_size = 2;
    ASSERT_TRUE(d->store->RegisterModel("p", Model(), options).ok());
    // Groups a (sealed first, annotated last), b (annotated at once),
    // c (one member never annotated), and an open sample with a reward.
    for (const char* g : {"a", "b", "c"}) {
      for (int k = 1; k <= 2; ++k) {
        const std::string id = std::string(g) + std::to_string(k);
        ASSERT_TRUE(Put(*d->store, Whole(id, {{"len", 4}}, g)).ok());
      }
      if (std::string(g) == "b") {
        ASSERT_TRUE(d->store->AnnotateSamples("p", {{"b1", {{"reward", 1}}},
                                                    {"b2", {{"reward", 0}}}})
                        .ok());
      }
    }
    ASSERT_TRUE(d->store->AnnotateSamples("p", Reward("c1", 2)).ok());
    // A scalar the pool does not require, on a sample still lacking one.
    ASSERT_TRUE(d->store->AnnotateSamples("p", {{"c2", {{"acc", 7}}}}).ok());
    ASSERT_TRUE(d->store->AnnotateSamples("p", {{"a1", {{"reward", 3}}}, {"a2", {{"reward", 4}}}})
                    .ok());
    ASSERT_TRUE(Put(*d->store, Piece("o", 0, true, 0, 3)).ok());
    ASSERT_TRUE(d->store->AnnotateSamples("p", Reward("o", 5)).ok());
    // A two-phase annotation is durable once committed.
    ASSERT_TRUE(Put(*d->store, Whole("x", {}, "", 0)).ok());
    ASSERT_TRUE(d->store->PrepareAnnotations("p", "t", Reward("x", 6), absl::Seconds(30)).ok());
    ASSERT_TRUE(d->store->CommitAnnotations("p", "t").ok());
  }
  auto check = [&](SampleStore& store, const std::string& when) {
    SCOPED_TRACE(when);
    const PoolStats pool = *store.GetPool("p");
    EXPECT_EQ(pool.num_unannotated_samples, 1);  // c2
    EXPECT_EQ(pool.num_complete_groups, 2);
    EXPECT_EQ(pool.num_open_samples, 1);
    EXPECT_EQ(store.GetOpenSample("p", "o")->scalars.at("reward"), 5);
    // b completed before a, whatever the order they were sealed in.
    EXPECT_THAT(GroupOrder(store, 2), ElementsAre("b", "a"));
    EXPECT_EQ(Taken(store, "a2").scalars.at("reward"), 4);
    EXPECT_THAT(Taken(store, "a2").later_scalars, ElementsAre("reward"));
    EXPECT_EQ(Taken(store, "x").scalars.at("reward"), 6);
    absl::StatusOr<int32_t> other = store.AnnotateSamples("p", {{"c2", {{"acc", 8}}}});
    EXPECT_THAT(other.status().message(), HasSubstr("scalar \"acc\" is already 7"));
    // Re-sends are still duplicates.
    absl::StatusOr<PutResult> again = Put(store, Whole("a2", {{"len", 4}}, "a"));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->duplicates, 1);
    again = Put(store, Piece("o", 0, true, 0, 3));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->duplicates, 1);
  };
  int64_t bytes = 0;
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    check(*d->store, "replayed");
    bytes = d->store->Stats().stored_bytes;
    ASSERT_TRUE(d->store->CompactLog().ok());
  }
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    check(*d->store, "compacted");
    EXPECT_EQ(d->store->Stats().stored_bytes, bytes);
    // Sealing after the restart: the open sample's annotation is kept.
    ASSERT_TRUE(Put(*d->store, Piece("o", 1, false, 3, 5)).ok());
    EXPECT_EQ(Taken(*d->store, "o").scalars.at("reward"), 5);
  }
}

TEST(AnnotationsLog, ASealingPiecesScalarsSurviveCompaction) {
  TempDir dir;
  {
    absl::StatusOr<Durable> d = OpenDurable(dir.path());
    ASSERT_TRUE(d.ok()) << d.status();
    PoolOptions options = RequiresReward();
    ASSERT_TRUE(d->store->RegisterModel("p", Model(), options).ok());
    // s gets its reward with the piece that seals it: complete when sealed,
    // before w (sealed later, annotated later still) and after v.
    ASSERT_TRUE(Put(*d->store, Piece("s", 0, true, 0, 3)).ok());
    ASSERT_TRUE(Put(*d->store, Whole("v", {{"reward", 1}}, "v", 1)).ok());
    ASSERT_TRUE(Put(*d->store, Piece("s", 1, false, 3, 5, {{"reward", 2}})).ok());
    ASSERT_TRUE(Put(*d->store, Whole("w", {}, "w", 1)).ok());
    ASSERT_TRUE(d->store->AnnotateSamples("p", Reward("w", 3)).ok());
    ASSERT_TRUE(d->store->CompactLog().ok());
  }
  absl::StatusOr<Durable> d = OpenDurable(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->store->GetPool("p")->num_unannotated_samples, 0);
  EXPECT_THAT(GroupOrder(*d->store, 3), ElementsAre("v", "g-s", "w"));
  // Piece 0 as put, re-sent, is still a duplicate.
  absl::StatusOr<PutResult> again = Put(*d->store, Piece("s", 0, true, 0, 3));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->duplicates, 1);
  EXPECT_EQ(Taken(*d->store, "s").scalars.at("reward"), 2);
}

}  // namespace
}  // namespace rollpack
