#include "server/store/pool.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int64_t kMs = 1'000'000;

ModelSpec Dense() {
  ModelSpec model;
  model.name = "m";
  model.num_layers = 2;
  return model;
}

// A sample of `n` tokens with a float32 "logprobs" row each, of `group`
// (of `size` samples) when `group` is set.
StoredSample Sample(const std::string& id, const std::string& group = "", int32_t size = 0,
                    int n = 2) {
  StoredSample s;
  s.sample_id = id;
  s.group_id = group;
  s.group_size = size;
  s.tokens.assign(n, 7);
  s.token_fields["logprobs"] = StoredField{v1::FLOAT32, {}, std::string(4 * n, '\0')};
  return s;
}

// Piece `index` of sample `id` (of `group`, of `size`), one token.
StoredSample Piece(const std::string& id, int32_t index, bool partial,
                   const std::string& group = "", int32_t size = 0) {
  StoredSample piece = Sample(id, group, size, 1);
  piece.piece_message = PieceMessage{index, partial, 0, false};
  return piece;
}

// Stores `sample` whole as the store does (its bytes counted).
void Add(Pool& pool, StoredSample sample, uint64_t arrival, int64_t now_nanos = 0) {
  pool.stored_bytes += Pool::MemoryBytes(sample);
  pool.AddSealed(std::move(sample), arrival, now_nanos);
}

// Plans and stores a piece; the bytes it added.
int64_t AddPiece(Pool& pool, StoredSample piece, uint64_t* next_arrival, int64_t now_nanos = 0) {
  absl::StatusOr<OpenSamples::Plan> plan =
      pool.open.PlanPiece("p", pool.model, piece, nullptr, nullptr);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return 0;
  return pool.ApplyPiece(*plan, std::move(piece), now_nanos, next_arrival);
}

std::vector<std::string> Ids(const std::vector<SampleCandidate>& candidates) {
  std::vector<std::string> ids;
  for (const SampleCandidate& c : candidates) ids.emplace_back(c.sample_id);
  return ids;
}

const absl::flat_hash_map<std::string, int32_t> kNoBatch;

TEST(PoolTest, TheFirstSampleProposesTheFieldsAndLaterPiecesNone) {
  StoredSample later = Piece("a", 1, true);
  later.token_fields["other"] = StoredField{v1::INT32, {}, ""};
  StoredSample first = Sample("b");
  first.ragged_fields["alts"] = StoredRagged{v1::INT32, {0, 0, 0}, ""};
  const BatchSchema batch = Pool::ProposeSchema({later, first, Sample("c")});
  ASSERT_EQ(batch.token_fields.size(), 1u);
  EXPECT_EQ(batch.token_fields.at("logprobs").dtype, v1::FLOAT32);
  EXPECT_THAT(batch.ragged, ElementsAre("alts"));

  Pool pool(Dense(), PoolOptions{});
  EXPECT_FALSE(pool.schema_complete());
  pool.FixSchema(batch);
  EXPECT_TRUE(pool.schema_complete());
  // Fixed once: a later batch's proposal changes nothing.
  StoredSample other = Sample("d");
  other.token_fields.clear();
  other.token_fields["values"] = StoredField{v1::INT32, {}, ""};
  pool.FixSchema(Pool::ProposeSchema({other}));
  ASSERT_EQ(pool.schema.size(), 1u);
  EXPECT_EQ(pool.schema.count("logprobs"), 1u);
  EXPECT_THAT(*pool.ragged_schema, ElementsAre("alts"));
  EXPECT_EQ(pool.Stats("p").ragged_fields, std::vector<std::string>{"alts"});
}

TEST(PoolTest, CheckSchemaNamesAnExtraAMissingOrAnotherField) {
  Pool pool(Dense(), PoolOptions{});
  // Nothing fixed yet: the batch's proposal is what samples are checked against.
  BatchSchema batch = Pool::ProposeSchema({Sample("a")});
  StoredSample extra = Sample("x");
  extra.token_fields["values"] = StoredField{v1::FLOAT32, {}, std::string(8, '\0')};
  EXPECT_EQ(pool.CheckSchema(extra, batch).message(),
            "sample \"x\": token_fields[\"values\"] is not among the pool's fields {logprobs} "
            "(fixed by its first sample)");
  pool.FixSchema(std::move(batch));
  EXPECT_TRUE(pool.CheckSchema(Sample("b"), BatchSchema{}).ok());
  absl::Status status = pool.CheckSchema(extra, BatchSchema{});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);

  StoredSample missing = Sample("y");
  missing.token_fields.clear();
  EXPECT_EQ(pool.CheckSchema(missing, BatchSchema{}).message(),
            "sample \"y\": token_fields[\"logprobs\"] is missing (every sample of the pool "
            "carries it)");

  StoredSample other = Sample("z");
  other.token_fields["logprobs"] = StoredField{v1::BFLOAT16, {3}, std::string(12, '\0')};
  EXPECT_EQ(pool.CheckSchema(other, BatchSchema{}).message(),
            "sample \"z\": token_fields[\"logprobs\"] is bfloat16 [n, 3], the pool's is "
            "float32 [n]");
}

TEST(PoolTest, DeclaredFieldsAreFixedFromTheStart) {
  PoolOptions options;
  options.token_fields.push_back(DeclaredTokenField{"values", v1::FLOAT32, {}, false});
  Pool pool(Dense(), options);
  EXPECT_TRUE(pool.schema_fixed);
  EXPECT_FALSE(pool.ragged_schema.has_value());
  // The sample's own proposal does not replace the declaration.
  const StoredSample sample = Sample("a");
  EXPECT_EQ(pool.CheckSchema(sample, Pool::ProposeSchema({sample})).message(),
            "sample \"a\": token_fields[\"logprobs\"] is not among the pool's fields {values} "
            "(declared at registration)");
}

TEST(PoolTest, RaggedFieldsAreFixedByTheFirstSample) {
  Pool pool(Dense(), PoolOptions{});
  StoredSample ragged = Sample("a");
  ragged.ragged_fields["alts"] = StoredRagged{v1::INT32, {0, 0, 0}, ""};
  pool.FixSchema(Pool::ProposeSchema({ragged}));
  EXPECT_TRUE(pool.CheckSchema(ragged, BatchSchema{}).ok());
  EXPECT_EQ(pool.CheckSchema(Sample("b"), BatchSchema{}).message(),
            "sample \"b\": ragged_token_fields[\"alts\"] is missing (every sample of the pool "
            "carries it)");
  StoredSample other = ragged;
  other.sample_id = "c";
  other.ragged_fields["more"] = StoredRagged{v1::INT32, {0, 0, 0}, ""};
  EXPECT_EQ(pool.CheckSchema(other, BatchSchema{}).message(),
            "sample \"c\": ragged_token_fields[\"more\"] is not among the pool's ragged fields "
            "{alts} (fixed by its first sample)");
}

TEST(PoolTest, CheckGroupRefusesAnotherSizeAndAFullGroup) {
  Pool pool(Dense(), PoolOptions{});
  Add(pool, Sample("a", "g", 3), 0);
  EXPECT_TRUE(pool.CheckGroup(Sample("b", "g", 3), kNoBatch).ok());
  EXPECT_TRUE(pool.CheckGroup(Sample("u"), kNoBatch).ok());
  absl::Status size = pool.CheckGroup(Sample("b", "g", 4), kNoBatch);
  EXPECT_EQ(size.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(size.message(), "sample \"b\": group \"g\" has group_size 3, this sample declares 4");
  // One stored and two in the batch fill it.
  absl::flat_hash_map<std::string, int32_t> batch{{"g", 2}};
  EXPECT_EQ(pool.CheckGroup(Sample("d", "g", 3), batch).message(),
            "sample \"d\": group \"g\" already has 3 samples, its group_size is 3");
  // A new group is checked against the batch alone.
  EXPECT_EQ(pool.CheckGroup(Sample("e", "h", 1), {{"h", 1}}).message(),
            "sample \"e\": group \"h\" already has 1 samples, its group_size is 1");
}

TEST(PoolTest, OpenSamplesCountAgainstTheirGroupUntilSealed) {
  Pool pool(Dense(), PoolOptions{});
  uint64_t arrival = 10;
  EXPECT_GT(AddPiece(pool, Piece("a", 0, true, "g", 2), &arrival), 0);
  EXPECT_EQ(arrival, 10u);
  EXPECT_EQ(pool.groups.at("g").open, 1);
  EXPECT_EQ(pool.groups.at("g").stored, 0);
  Add(pool, Sample("b", "g", 2), arrival++);
  // One open and one sealed: full, though incomplete.
  EXPECT_EQ(pool.CheckGroup(Sample("c", "g", 2), kNoBatch).message(),
            "sample \"c\": group \"g\" already has 2 samples, its group_size is 2");
  EXPECT_EQ(pool.Stats("p").num_incomplete_groups, 1);
  EXPECT_EQ(pool.Stats("p").num_open_samples, 1);

  AddPiece(pool, Piece("a", 1, false, "g", 2), &arrival, 5 * kMs);
  EXPECT_EQ(arrival, 12u);  // the sealed sample took the next arrival
  EXPECT_FALSE(pool.open.contains("a"));
  EXPECT_EQ(pool.groups.at("g").open, 0);
  EXPECT_EQ(pool.groups.at("g").stored, 2);
  EXPECT_EQ(pool.arrival_of.at("a"), 11u);
  EXPECT_EQ(pool.arrival_unix_nanos.at("a"), 5 * kMs);
  EXPECT_THAT(Ids(pool.FreeCandidates(-1)), ElementsAre("b", "a"));
  EXPECT_EQ(pool.Stats("p").num_complete_groups, 1);
  int64_t bytes = 0;
  for (const auto& [id, sample] : pool.samples) bytes += Pool::MemoryBytes(*sample);
  EXPECT_EQ(pool.stored_bytes, bytes);
}

TEST(PoolTest, ErasingAnOpenSampleFreesItsShareOfTheGroup) {
  Pool pool(Dense(), PoolOptions{});
  uint64_t arrival = 0;
  const int64_t held = AddPiece(pool, Piece("a", 0, true, "g", 2), &arrival);
  EXPECT_EQ(pool.EraseOpen({"a", "unknown"}), held);
  EXPECT_EQ(pool.stored_bytes, 0);
  EXPECT_TRUE(pool.groups.empty());
}

TEST(PoolTest, CandidatesComeInArrivalOrderWithTheirReadiness) {
  PoolOptions options;
  options.required_scalars = {"reward"};
  Pool pool(Dense(), options);
  StoredSample ready = Sample("c");
  ready.scalars["reward"] = 1.0;
  StoredSample annotated = Sample("a");
  annotated.scalars["reward"] = 1.0;
  Add(pool, Sample("b"), 7);
  Add(pool, std::move(ready), 3);
  Add(pool, std::move(annotated), 9);
  // As if an annotation had given "a" its reward at sequence 20.
  pool.ready_at["a"] = Pool::Ready{20, 0};
  const std::vector<SampleCandidate> all = pool.FreeCandidates(-1);
  EXPECT_THAT(Ids(all), ElementsAre("c", "b", "a"));
  EXPECT_EQ(all[0].missing_scalar, "");
  EXPECT_EQ(all[1].missing_scalar, "reward");
  EXPECT_EQ(all[2].missing_scalar, "");
  EXPECT_EQ(all[0].ready_key, 4);
  EXPECT_EQ(all[1].ready_key, 8);
  EXPECT_EQ(all[2].ready_key, 21);
  EXPECT_EQ(pool.unannotated, 1);

  std::vector<Pool::FreeSamples::const_iterator> where;
  EXPECT_THAT(Ids(pool.FreeCandidates(2, &where)), ElementsAre("c", "b"));
  ASSERT_EQ(where.size(), 2u);
  EXPECT_EQ(where[1]->first, 7u);
  EXPECT_THAT(Ids(pool.FreeCandidates(0)), IsEmpty());
}

TEST(PoolTest, UnannotatedSamplesDoNotCompleteTheirGroup) {
  PoolOptions options;
  options.required_scalars = {"reward"};
  Pool pool(Dense(), options);
  StoredSample a = Sample("a", "g", 2);
  a.scalars["reward"] = 1.0;
  Add(pool, std::move(a), 0);
  Add(pool, Sample("b", "g", 2), 1);
  const PoolStats stats = pool.Stats("p");
  EXPECT_EQ(stats.num_complete_groups, 0);
  ASSERT_EQ(stats.incomplete_groups.size(), 1u);
  EXPECT_EQ(stats.incomplete_groups[0].num_sealed, 1);
  EXPECT_THAT(pool.CompleteGroups({"g"}), IsEmpty());
  EXPECT_THAT(pool.StillIncomplete({"g", "unknown"}), ElementsAre("g"));
  // Erasing the unready sample forgets it was unready.
  pool.free_by_arrival.erase(1);
  pool.EraseSealed("b");
  EXPECT_EQ(pool.unannotated, 0);
  EXPECT_EQ(pool.groups.at("g").unready, 0);
}

TEST(PoolTest, AnAnnotationThatCompletesAGroupCompletesItThen) {
  PoolOptions options;
  options.required_scalars = {"reward"};
  Pool pool(Dense(), options);
  StoredSample a = Sample("a", "g", 2);
  a.scalars["reward"] = 1.0;
  Add(pool, std::move(a), 0, 1 * kMs);
  StoredSample b = Sample("b", "g", 2);
  Add(pool, b, 1, 2 * kMs);
  EXPECT_THAT(pool.CompleteGroups({"g"}), IsEmpty());
  b.scalars["reward"] = 0.5;  // as AnnotateSamples changes it in place
  pool.MarkReady(b, 30, 9 * kMs);
  EXPECT_EQ(pool.unannotated, 0);
  EXPECT_EQ(pool.ready_at.at("b").seq, 30u);
  EXPECT_EQ(pool.ready_at.at("b").unix_nanos, 9 * kMs);
  const std::vector<GroupShareStats> complete = pool.CompleteGroups({"g"});
  ASSERT_EQ(complete.size(), 1u);
  EXPECT_EQ(complete[0].num_sealed, 2);
  EXPECT_EQ(complete[0].first_sealed_unix_nanos, 1 * kMs);
}

TEST(PoolTest, GroupsExpireOnlyPastTheTimeoutFromTheirFirstSealedSample) {
  PoolOptions options;
  options.incomplete_group_timeout_ms = 100;
  Pool pool(Dense(), options);
  Add(pool, Sample("a", "late", 2), 0, 50 * kMs);
  Add(pool, Sample("b", "early", 2), 1, 10 * kMs);
  Add(pool, Sample("c", "early", 2), 2, 200 * kMs);
  Add(pool, Sample("d", "open", 2), 3, 0);
  Add(pool, Sample("e", "open", 2), 4, 0);
  EXPECT_THAT(pool.ExpiredGroups(109 * kMs), IsEmpty());
  EXPECT_THAT(pool.ExpiredGroups(150 * kMs), ElementsAre("late"));
  // "early" is complete ("open" too): never expired.
  EXPECT_THAT(pool.ExpiredGroups(1000 * kMs), ElementsAre("late"));
  EXPECT_EQ(pool.CompleteGroups({"open", "early", "open", "late"}).size(), 2u);

  // A group whose samples are all gone is forgotten; one with samples
  // (in a live step, say) is marked and refuses late samples.
  pool.free_by_arrival.erase(0);
  pool.EraseSealed("a");
  EXPECT_FALSE(pool.groups.contains("late"));
  Add(pool, Sample("f", "late", 2), 5, 300 * kMs);
  pool.free_by_arrival.erase(5);  // "f" is taken by a step
  pool.ExpireGroups({"late", "unknown"});
  EXPECT_TRUE(pool.groups.at("late").expired);
  EXPECT_THAT(pool.ExpiredGroups(10'000 * kMs), IsEmpty());
  EXPECT_THAT(pool.StillIncomplete({"late"}), IsEmpty());
  EXPECT_EQ(pool.CheckGroup(Sample("g", "late", 2), kNoBatch).message(),
            "sample \"g\": group \"late\" was dropped for staying incomplete past "
            "incomplete_group_timeout_ms (100 ms); 1 of its samples are still in live steps");
  EXPECT_EQ(pool.Stats("p").num_incomplete_groups, 0);
  pool.EraseSealed("f");
  EXPECT_FALSE(pool.groups.contains("late"));
}

TEST(PoolTest, ExpiredGroupsComeSortedById) {
  PoolOptions options;
  options.incomplete_group_timeout_ms = 1;
  Pool pool(Dense(), options);
  uint64_t arrival = 0;
  for (const std::string group : {"q", "b", "x", "a", "m", "k"}) {
    Add(pool, Sample("s-" + group, group, 2), arrival++);
  }
  EXPECT_THAT(pool.ExpiredGroups(kMs), ElementsAre("a", "b", "k", "m", "q", "x"));
}

TEST(PoolTest, ErasingASealedSampleForgetsEverythingKeptAboutIt) {
  Pool pool(Dense(), PoolOptions{});
  Add(pool, Sample("a", "g", 2), 0);
  pool.uses["a"] = 1;
  pool.free_by_arrival.erase(0);
  const int64_t bytes = Pool::MemoryBytes(*pool.samples.at("a"));
  const Pool::Erased erased = pool.EraseSealed("a");
  EXPECT_EQ(erased.bytes, bytes);
  EXPECT_EQ(erased.dead_log_bytes, 0);
  EXPECT_EQ(pool.stored_bytes, 0);
  EXPECT_TRUE(pool.samples.empty());
  EXPECT_TRUE(pool.arrival_of.empty());
  EXPECT_TRUE(pool.arrival_unix_nanos.empty());
  EXPECT_TRUE(pool.uses.empty());
  EXPECT_TRUE(pool.groups.empty());
}

TEST(PoolTest, TheRequestsStalenessBoundOrElseThePools) {
  PoolOptions options;
  options.max_staleness = 2;
  Pool pool(Dense(), options);
  SelectionRequest request;
  EXPECT_EQ(pool.Effective(request).max_staleness.value_or(-1), 2);
  request.max_staleness = 0;
  EXPECT_EQ(pool.Effective(request).max_staleness.value_or(-1), 0);
}

}  // namespace
}  // namespace rollpack
