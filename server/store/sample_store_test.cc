#include "server/store/sample_store.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

ModelSpec Model() {
  ModelSpec m;
  m.name = "m";
  m.num_layers = 4;
  m.num_experts = 8;
  m.topk = 2;
  return m;
}

StoredSample Sample(const std::string& id, int64_t n, float field_value = 1.0f) {
  StoredSample s;
  s.sample_id = id;
  s.tokens.assign(n, 7);
  s.experts.assign(n * 4 * 2, '\x01');
  s.row_valid.assign(n, 1);
  StoredField f;
  f.dtype = v1::FLOAT32;
  f.data.assign(n * 4, static_cast<char>(field_value));
  s.token_fields["logprobs"] = f;
  return s;
}

Topology Topo(int dp = 1) {
  Topology t;
  t.dp = dp;
  t.max_tokens_per_rank = 1024;
  return t;
}

TEST(SampleStoreTest, RegisterIsIdempotentAndRefusesAnotherSpec) {
  SampleStore store(1 << 20);
  EXPECT_EQ(*store.RegisterModel("p", Model()), true);
  EXPECT_EQ(*store.RegisterModel("p", Model()), false);
  ModelSpec other = Model();
  other.topk = 3;
  absl::StatusOr<bool> r = store.RegisterModel("p", other);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("pool \"p\" already holds model"));
}

TEST(SampleStoreTest, PoolsAndNamesAreBounded) {
  SampleStore store(1 << 20);
  store.set_max_pools(2);
  ASSERT_TRUE(store.RegisterModel("a", Model()).ok());
  ASSERT_TRUE(store.RegisterModel("b", Model()).ok());
  absl::StatusOr<bool> third = store.RegisterModel("c", Model());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(third.status().message()).find("--max-pools is 2"), std::string::npos);
  EXPECT_TRUE(store.RegisterModel("a", Model()).ok()) << "an existing pool is no new pool";
  // An unknown 10 MB name is refused as a name, not echoed in a NOT_FOUND.
  const std::string huge(10 << 20, 'p');
  absl::StatusOr<PoolStats> pool = store.GetPool(huge);
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(pool.status().message().size(), 200u);
  EXPECT_EQ(store.RegisterModel("tab\tname", Model()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.ReleaseStep(std::string(200, 's')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SampleStoreTest, PutToUnknownPoolIsNotFound) {
  SampleStore store(1 << 20);
  std::vector<StoredSample> batch;
  batch.push_back(Sample("a", 4));
  EXPECT_EQ(store.Put("nope", std::move(batch)).status().code(), absl::StatusCode::kNotFound);
}

TEST(SampleStoreTest, IdenticalResendIsIdempotentDifferentContentIsAlreadyExists) {
  SampleStore store(1 << 20);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a", 4)}).ok());
  absl::StatusOr<PutResult> again = store.Put("p", {Sample("a", 4)});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->duplicates, 1);
  EXPECT_EQ(again->stored_bytes, 0);
  absl::StatusOr<PutResult> other = store.Put("p", {Sample("a", 5)});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(other.status().message(), HasSubstr("sample \"a\" already exists"));
  EXPECT_EQ(store.GetPool("p")->num_samples, 1);
}

TEST(SampleStoreTest, BatchIsAllOrNothing) {
  SampleStore store(1 << 20);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a", 4)}).ok());
  std::vector<StoredSample> batch;
  batch.push_back(Sample("b", 4));
  batch.push_back(Sample("a", 9));  // conflicts
  EXPECT_FALSE(store.Put("p", std::move(batch)).ok());
  EXPECT_EQ(store.GetPool("p")->num_samples, 1) << "b must not be stored";
}

TEST(SampleStoreTest, TokenFieldsMustMatchThePool) {
  SampleStore store(1 << 20);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a", 4)}).ok());
  StoredSample wrong = Sample("b", 4);
  wrong.token_fields["logprobs"].dtype = v1::BFLOAT16;
  absl::StatusOr<PutResult> r = store.Put("p", {wrong});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("token_fields[\"logprobs\"] is bfloat16 [n], the pool's is float32 [n]"));
  StoredSample missing = Sample("c", 4);
  missing.token_fields.clear();
  r = store.Put("p", {missing});
  EXPECT_THAT(r.status().message(), HasSubstr("token_fields[\"logprobs\"] is missing"));
}

TEST(SampleStoreTest, MemoryLimitGivesResourceExhaustedAndReleaseFrees) {
  const int64_t one = SampleStore::MemoryBytes(Sample("x", 100));
  SampleStore store(one * 3);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a", 100), Sample("b", 100), Sample("c", 100)}).ok());
  absl::StatusOr<PutResult> full = store.Put("p", {Sample("d", 100)});
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(), HasSubstr("retry after"));
  ASSERT_TRUE(store.CreateStep("s", "p", {}, 2, Topo()).ok());
  absl::StatusOr<ReleaseResult> released = store.ReleaseStep("s");
  ASSERT_TRUE(released.ok());
  EXPECT_EQ(released->released_samples, 2);
  EXPECT_EQ(released->freed_bytes, 2 * one);
  EXPECT_TRUE(store.Put("p", {Sample("d", 100)}).ok());
  EXPECT_EQ(store.Stats().stored_bytes, 2 * one);
}

TEST(SampleStoreTest, WhatCanNeverFitIsFailedPreconditionNotResourceExhausted) {
  const int64_t one = SampleStore::MemoryBytes(Sample("x", 100));
  SampleStore store(one * 3);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  // A sample larger than the whole limit: no release makes room for it.
  // (Ten times the tokens: with its object, map node and index entries
  // counted, ~900 bytes here, four times the tokens is not three times the
  // bytes.)
  absl::StatusOr<PutResult> huge = store.Put("p", {Sample("huge", 1000)});
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kFailedPrecondition);
  const int64_t huge_bytes = SampleStore::MemoryBytes(Sample("huge", 1000));
  EXPECT_THAT(huge.status().message(),
              HasSubstr("sample \"huge\" takes " + std::to_string(huge_bytes) +
                        " bytes, more than --max-memory"));
  // Samples that fit alone, in a message that never can: send smaller ones.
  absl::StatusOr<PutResult> batch = store.Put(
      "p", {Sample("a", 100), Sample("b", 100), Sample("c", 100), Sample("d", 100)});
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(batch.status().message(), HasSubstr("send smaller messages"));
  // The pool's own limit too.
  store.set_max_pool_bytes(one * 2);
  absl::StatusOr<PutResult> pool = store.Put("p", {Sample("e", 400)});
  EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(pool.status().message(), HasSubstr("more than --max-pool-memory"));
  EXPECT_EQ(store.Stats().stored_bytes, 0);
}

TEST(SampleStoreTest, StepTakesOldestFreeSamplesInArrivalOrder) {
  SampleStore store(1 << 20);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  for (const char* id : {"z", "y", "x", "w"}) ASSERT_TRUE(store.Put("p", {Sample(id, 8)}).ok());
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep("s", "p", {}, 3, Topo());
  ASSERT_TRUE(step.ok()) << step.status();
  std::vector<std::string> ids;
  for (const auto& s : (*step)->samples) ids.push_back(s->sample_id);
  EXPECT_EQ(ids, (std::vector<std::string>{"z", "y", "x"}));
  EXPECT_EQ(store.GetPool("p")->num_free_samples, 1);
}

TEST(SampleStoreTest, SampleBelongsToOneLiveStep) {
  SampleStore store(1 << 20);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a", 8), Sample("b", 8)}).ok());
  ASSERT_TRUE(store.CreateStep("s1", "p", std::vector<std::string>{"a"}, 0, Topo()).ok());
  absl::StatusOr<std::shared_ptr<const Step>> again =
      store.CreateStep("s2", "p", std::vector<std::string>{"a", "b"}, 0, Topo());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("sample \"a\" is already in a live step"));
  EXPECT_EQ(store.GetPool("p")->num_free_samples, 1) << "b must stay free";
  EXPECT_EQ(store.CreateStep("s1", "p", std::vector<std::string>{"b"}, 0, Topo()).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store.CreateStep("s3", "p", std::vector<std::string>{"nope"}, 0, Topo()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SampleStoreTest, ReleaseHoldReleasesOnlyHoldsNotThisServersOwnSteps) {
  SampleStore store(1 << 20);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a", 8), Sample("b", 8)}).ok());
  ASSERT_TRUE(store.CreateStep("own", "p", std::vector<std::string>{"a"}, 0, Topo()).ok());
  ASSERT_TRUE(store.Hold("held", "p", std::vector<std::string>{"b"}, "m:1", 1).ok());
  // A peer's ReleaseHold naming a step of this server's own: not found,
  // the step stays live.
  EXPECT_EQ(store.ReleaseHold("own").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store.GetStep("own").ok());
  absl::StatusOr<ReleaseResult> released = store.ReleaseHold("held");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->released_samples, 1);
  EXPECT_EQ(store.ReleaseHold("held").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store.ReleaseStep("own").ok());
}

TEST(SampleStoreTest, TooLongSampleIsRefusedByNameAndSamplesStayFree) {
  SampleStore store(1 << 20);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store.Put("p", {Sample("short", 8), Sample("long", 2000)}).ok());
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep("s", "p", {}, 2, Topo());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(step.status().message(), HasSubstr("sample \"long\" has 2000 tokens"));
  EXPECT_THAT(step.status().message(), HasSubstr("is 1024"));
  EXPECT_EQ(store.GetPool("p")->num_free_samples, 2);
}

TEST(SampleStoreTest, TooFewFreeSamples) {
  SampleStore store(1 << 20);
  ASSERT_TRUE(store.RegisterModel("p", Model()).ok());
  ASSERT_TRUE(store.Put("p", {Sample("a", 8)}).ok());
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep("s", "p", {}, 5, Topo());
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(step.status().message(), HasSubstr("has 1 free samples, 5 requested"));
}

TEST(SampleStoreTest, ReleaseUnknownStepIsNotFound) {
  SampleStore store(1 << 20);
  EXPECT_EQ(store.ReleaseStep("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.GetStep("nope").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace rollpack
