// The single server's pool directory: every call is the store's own.
#include "server/store/local_pools.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/sample_store.h"
#include "server/store/step_directory.h"
#include "testing/store_samples.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using store_testing::Model;
using store_testing::Request;
using store_testing::Sample;

class LocalPoolsTest : public ::testing::Test {
 protected:
  LocalPoolsTest()
      : steps_(&store_),
        pools_(&store_, &steps_, [this](const ReleaseResult& r) { released_.push_back(r); }) {
    store_.AttachPoolDirectory(&pools_);
  }

  // Pool "p" with samples "a" and "b" of 4 tokens.
  void Fill() {
    ASSERT_TRUE(pools_.Register("p", Model(), std::nullopt).ok());
    ASSERT_TRUE(store_.Put("p", {Sample("a", 4), Sample("b", 4)}).ok());
  }

  SampleStore store_{1 << 20};
  LocalSteps steps_;
  std::vector<ReleaseResult> released_;
  LocalPools pools_;
};

TEST_F(LocalPoolsTest, RegisterCreatesOnceAndRefusesAnotherModelNamingThePool) {
  absl::StatusOr<bool> created = pools_.Register("p", Model(), std::nullopt);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(*created);
  created = pools_.Register("p", Model(), std::nullopt);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_FALSE(*created);
  ModelSpec other = Model();
  other.num_experts = 8;
  created = pools_.Register("p", other, std::nullopt);
  EXPECT_EQ(created.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(created.status().message(), HasSubstr("\"p\""));
}

TEST_F(LocalPoolsTest, NoPoolIsDefinedOutsideTheStore) {
  absl::StatusOr<std::optional<PoolDefinition>> resolved = pools_.Resolve("q");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_FALSE(resolved->has_value());
  // The store adopts nothing: an unknown pool stays unknown.
  EXPECT_EQ(store_.GetOrAdoptModel("q").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(pools_.FixesSchemasBeforePut());
  EXPECT_TRUE(pools_.AcceptsNewSamples().ok());
}

TEST_F(LocalPoolsTest, TheFirstAcceptedSampleFixesThePoolsFields) {
  Fill();
  StoredSample other = Sample("c", 4);
  other.token_fields["logprobs"].dtype = v1::FLOAT32;
  other.token_fields["logprobs"].data.assign(4 * sizeof(float), '\0');
  EXPECT_EQ(store_.Put("p", {other}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LocalPoolsTest, GetPoolAndPoolNamesAreTheStores) {
  Fill();
  ASSERT_TRUE(pools_.Register("o", Model(), std::nullopt).ok());
  absl::StatusOr<std::vector<std::string>> names = pools_.PoolNames();
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ElementsAre("o", "p"));
  absl::StatusOr<v1::PoolInfo> whole = pools_.GetPool("p");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->pool(), "p");
  EXPECT_EQ(whole->num_samples(), 2);
  absl::StatusOr<v1::PoolInfo> here = pools_.GetPoolHere("p");
  ASSERT_TRUE(here.ok()) << here.status();
  EXPECT_EQ(here->SerializeAsString(), whole->SerializeAsString());
  EXPECT_EQ(pools_.GetPool("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(LocalPoolsTest, AnnotateAndListSamplesGoToTheStore) {
  Fill();
  absl::StatusOr<int32_t> annotated = pools_.Annotate("p", {ScalarAnnotation{"a", {{"r", 1.5}}}});
  ASSERT_TRUE(annotated.ok()) << annotated.status();
  EXPECT_EQ(*annotated, 1);
  v1::ListSamplesRequest request;
  request.set_pool("p");
  absl::StatusOr<v1::ListSamplesResponse> page = pools_.ListSamples(request);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->samples_size(), 2);
  EXPECT_EQ(page->samples(0).sample_id(), "a");
  EXPECT_EQ(page->samples(0).scalars().at("r"), 1.5);
  EXPECT_EQ(page->samples(1).sample_id(), "b");
}

TEST_F(LocalPoolsTest, AForcedDeletionReleasesTheLiveStepsThroughTheStepDirectory) {
  Fill();
  StepRequest step = Request("s1");
  step.sample_ids = {"a"};
  ASSERT_TRUE(steps_.CreateStep(step).ok());
  v1::DeletePoolRequest request;
  request.set_pool("p");
  // Not forced: the live step is named and nothing changes.
  absl::StatusOr<v1::DeletePoolResponse> refused = pools_.DeletePool(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("s1"));
  EXPECT_TRUE(released_.empty());
  request.set_force(true);
  absl::StatusOr<v1::DeletePoolResponse> deleted = pools_.DeletePool(request);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(deleted->pool(), "p");
  EXPECT_THAT(deleted->released_steps(), ElementsAre("s1"));
  EXPECT_EQ(deleted->deleted_samples(), 1);  // "b": "a" went with its step
  ASSERT_EQ(released_.size(), 1u);
  EXPECT_EQ(released_[0].released_samples, 1);
  EXPECT_EQ(store_.GetModel("p").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(pools_.DeletePool(request).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace rollpack
