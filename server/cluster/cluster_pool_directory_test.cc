// A cluster member's pool directory over the in-memory etcd
// (testing/in_memory_key_value_store.h), with no etcd, peer or gRPC
// server: pools fixed once for every member, adopted by a member's store
// that has not seen them, and the calls before the join.
// tests/cluster_*_test.cc run the same over real etcd and rollpackd processes.
#include "server/cluster/cluster_pool_directory.h"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/cluster/cluster.h"
#include "server/cluster/cluster_steps.h"
#include "server/cluster/incarnation.h"
#include "server/store/convert.h"
#include "testing/in_memory_key_value_store.h"
#include "testing/store_samples.h"

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using store_testing::Model;
using store_testing::Request;
using store_testing::Sample;

// One member: its store, its cluster's steps and its pool directory,
// attached to the cluster once Join'ed.
struct Member {
  explicit Member(const std::string& address) : address(address) {
    ClusterStepsOptions options;
    options.tick = absl::Milliseconds(20);
    steps = std::make_unique<ClusterSteps>(&store, options);
    ClusterPoolsOptions pool_options;
    pool_options.on_step_released = [this](const ReleaseResult&) { ++steps_released; };
    pools = std::make_unique<ClusterPoolDirectory>(&store, steps.get(), pool_options);
    store.AttachPoolDirectory(pools.get());
  }
  ~Member() {
    pools->Attach(nullptr);
    steps->Detach();
  }
  void Join(InMemoryEtcd& etcd) {
    ClusterOptions options;
    options.name = "t";
    options.advertise = address;
    options.incarnation = NewIncarnation();
    absl::StatusOr<std::unique_ptr<Cluster>> joined = Cluster::Join(options, etcd.NewClient());
    ASSERT_TRUE(joined.ok()) << joined.status();
    cluster = *std::move(joined);
    steps->Attach(cluster.get());
    pools->Attach(cluster.get());
  }

  const std::string address;
  SampleStore store{1 << 20};
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<ClusterSteps> steps;
  std::unique_ptr<ClusterPoolDirectory> pools;
  int steps_released = 0;
};

StoredSample WithLogprobs(const std::string& id, v1::DType dtype) {
  StoredSample s = Sample(id, 4);
  s.token_fields["logprobs"].dtype = dtype;
  s.token_fields["logprobs"].data.assign(4 * (dtype == v1::FLOAT32 ? 4 : 2), '\0');
  return s;
}

PoolOptions Options(int64_t max_uses) {
  PoolOptions options;
  options.max_uses = max_uses;
  return options;
}

class ClusterPoolDirectoryTest : public ::testing::Test {
 protected:
  std::shared_ptr<InMemoryEtcd> etcd_ = InMemoryEtcd::Create();
  Member a_{"127.0.0.1:7001"};
};

TEST_F(ClusterPoolDirectoryTest, BeforeTheJoinEveryCallButTheLocalShareIsUnavailable) {
  ClusterPoolDirectory& pools = *a_.pools;
  const auto joining = [](const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_EQ(s.message(), "this member is still joining its cluster");
  };
  joining(pools.Register("p", Model(), std::nullopt).status());
  joining(pools.AcceptsNewSamples());
  joining(pools.GetPool("p").status());
  joining(pools.PoolNames().status());
  joining(pools.Annotate("p", {}).status());
  v1::DeletePoolRequest deletion;
  deletion.set_pool("p");
  joining(pools.DeletePool(deletion).status());
  deletion.set_local_only(true);
  joining(pools.DeletePool(deletion).status());
  v1::ListSamplesRequest listing;
  listing.set_pool("p");
  joining(pools.ListSamples(listing).status());
  // The store's own lookups say it in their words.
  const auto not_in = [](const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_EQ(s.message(), "this member is not in its cluster");
  };
  not_in(pools.Resolve("p").status());
  not_in(pools.FixSchema("p", {}).status());
  not_in(a_.store.GetOrAdoptModel("p").status());
  // A peer's local_only GetPool needs no cluster: the store's share.
  EXPECT_EQ(pools.GetPoolHere("p").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(pools.FixesSchemasBeforePut());
}

TEST_F(ClusterPoolDirectoryTest, RegisterFixesModelAndOptionsThatAnotherMemberAdopts) {
  a_.Join(*etcd_);
  Member b("127.0.0.1:7002");
  b.Join(*etcd_);
  absl::StatusOr<bool> created = a_.pools->Register("p", Model(), Options(3));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(*created);
  absl::StatusOr<std::optional<PoolDefinition>> resolved = b.pools->Resolve("p");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  ASSERT_TRUE(resolved->has_value());
  EXPECT_TRUE((*resolved)->model == Model());
  EXPECT_EQ((*resolved)->options.max_uses, 3);
  // b's store has not seen the pool: it adopts the cluster's definition.
  ASSERT_EQ(b.store.GetModel("p").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<ModelSpec> adopted = b.store.GetOrAdoptModel("p");
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_TRUE(*adopted == Model());
  absl::StatusOr<PoolOptions> options = b.store.GetOptions("p");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->max_uses, 3);
  // Registered again through b: the same pool, not a new one.
  created = b.pools->Register("p", Model(), std::nullopt);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_FALSE(*created);
  // Nobody registered "q".
  resolved = b.pools->Resolve("q");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_FALSE(resolved->has_value());
  EXPECT_EQ(b.store.GetOrAdoptModel("q").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::vector<std::string>> names = b.pools->PoolNames();
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ElementsAre("p"));
}

TEST_F(ClusterPoolDirectoryTest, ARefusedRegistrationNamesThePoolAndTheCluster) {
  a_.Join(*etcd_);
  ASSERT_TRUE(a_.pools->Register("p", Model(), Options(3)).ok());
  ModelSpec other = Model();
  other.num_experts = 8;
  absl::Status refused = a_.pools->Register("p", other, std::nullopt).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("pool \"p\" already holds model \"m\""));
  EXPECT_THAT(refused.message(), HasSubstr("cluster \"t\""));
  refused = a_.pools->Register("p", Model(), Options(5)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("pool \"p\" was registered with other options"));
  // A name the store would refuse is refused before etcd fixes anything.
  EXPECT_EQ(a_.pools->Register("", Model(), std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<std::string>> names = a_.pools->PoolNames();
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ElementsAre("p"));
}

TEST_F(ClusterPoolDirectoryTest, TheFirstProposedSchemaHoldsForEveryMember) {
  a_.Join(*etcd_);
  Member b("127.0.0.1:7002");
  b.Join(*etcd_);
  ASSERT_TRUE(a_.pools->Register("p", Model(), std::nullopt).ok());
  // a's first batch fixes the pool's fields for the cluster.
  ASSERT_TRUE(a_.store.Put("p", {WithLogprobs("a1", v1::FLOAT32)}).ok());
  std::map<std::string, FieldSchema> proposed;
  proposed["logprobs"] = FieldSchema{v1::BFLOAT16, {}};
  absl::StatusOr<std::map<std::string, FieldSchema>> fixed = b.pools->FixSchema("p", proposed);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  ASSERT_EQ(fixed->count("logprobs"), 1u);
  EXPECT_EQ(fixed->at("logprobs").dtype, v1::FLOAT32);
  // b's store, whose first batch for the pool this is, takes a's fields.
  ASSERT_TRUE(b.store.GetOrAdoptModel("p").ok());
  absl::Status s = b.store.Put("p", {WithLogprobs("b1", v1::BFLOAT16)}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("logprobs"));
  EXPECT_TRUE(b.store.Put("p", {WithLogprobs("b2", v1::FLOAT32)}).ok());
}

TEST_F(ClusterPoolDirectoryTest, AOneMemberClusterAnswersWholePoolCallsFromItsShare) {
  a_.Join(*etcd_);
  ASSERT_TRUE(a_.pools->Register("p", Model(), std::nullopt).ok());
  ASSERT_TRUE(a_.store.Put("p", {Sample("a", 4), Sample("b", 4)}).ok());
  EXPECT_TRUE(a_.pools->AcceptsNewSamples().ok());
  absl::StatusOr<v1::PoolInfo> whole = a_.pools->GetPool("p");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->num_samples(), 2);
  ASSERT_EQ(whole->members_size(), 1);
  EXPECT_EQ(whole->members(0).member(), a_.address);
  absl::Status unknown = a_.pools->GetPool("q").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.message(), "pool \"q\" has no registered model in cluster \"t\"");
  absl::StatusOr<int32_t> annotated =
      a_.pools->Annotate("p", {ScalarAnnotation{"a", {{"r", 1.5}}}});
  ASSERT_TRUE(annotated.ok()) << annotated.status();
  EXPECT_EQ(*annotated, 1);
  v1::ListSamplesRequest listing;
  listing.set_pool("p");
  absl::StatusOr<v1::ListSamplesResponse> page = a_.pools->ListSamples(listing);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->samples_size(), 2);
  EXPECT_EQ(page->samples(0).scalars().at("r"), 1.5);
  listing.set_local_only(true);
  page = a_.pools->ListSamples(listing);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->samples_size(), 2);
  // A forced deletion releases the cluster's live step of the pool.
  StepRequest step = Request("s1");
  step.sample_ids = {"a"};
  ASSERT_TRUE(a_.steps->CreateStep(step).ok());
  v1::DeletePoolRequest deletion;
  deletion.set_pool("p");
  deletion.set_force(true);
  absl::StatusOr<v1::DeletePoolResponse> deleted = a_.pools->DeletePool(deletion);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(deleted->released_steps(), ElementsAre("s1"));
  EXPECT_EQ(a_.steps_released, 1);
  EXPECT_EQ(a_.pools->GetPool("p").status().code(), absl::StatusCode::kNotFound);
  // The name is free again, for another model.
  ModelSpec other = Model();
  other.num_experts = 8;
  EXPECT_TRUE(a_.pools->Register("p", other, std::nullopt).ok());
}

}  // namespace
}  // namespace rollpack
