// Rollouts.AnnotateSamples over a cluster of real processes
// (../shared/spec/lifecycle.md section 6: "any member accepts the call"):
// a member that holds none of the samples annotates those of the others,
// all or nothing when one owner refuses its share, and required_scalars
// gates what CreateStep selects over every member.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rollpack/v1/rollouts.grpc.pb.h"
#include "testing/cluster_fixture.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

class ClusterAnnotationsTest : public ClusterFixture {
 protected:
  void StartThree() {
    for (size_t i = 0; i < 3; ++i) StartMember(i);
    v1::RegisterModelRequest request;
    request.set_pool("pool");
    *request.mutable_model() = ClusterModel();
    request.mutable_options()->add_required_scalars("reward");
    ASSERT_TRUE(Client(0).RegisterModel(request).ok());
  }

  // `count` samples put on member `member`, in group `group` of `size`.
  std::vector<std::string> PutOn(size_t member, const std::string& prefix, int count,
                                 const std::string& group = "", int size = 0) {
    std::vector<v1::Sample> samples = ClusterSamples(count, 50 + member, prefix);
    std::vector<std::string> ids;
    for (v1::Sample& s : samples) {
      s.clear_scalars();  // the rewards come later
      s.set_group_id(group);
      s.set_group_size(size);
      ids.push_back(s.sample_id());
    }
    absl::StatusOr<v1::PutSamplesResponse> put = Client(member).PutSamples("pool", samples);
    EXPECT_TRUE(put.ok()) << put.status();
    return ids;
  }

  grpc::Status Annotate(size_t via, const std::vector<std::pair<std::string, double>>& rewards,
                        int32_t* annotated = nullptr) {
    auto stub = v1::Rollouts::NewStub(MakeChannel(members_[via]->address()));
    v1::AnnotateSamplesRequest request;
    request.set_pool("pool");
    for (const auto& [id, reward] : rewards) {
      v1::SampleAnnotation* a = request.add_annotations();
      a->set_sample_id(id);
      (*a->mutable_scalars())["reward"] = reward;
    }
    v1::AnnotateSamplesResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status s = stub->AnnotateSamples(&context, request, &response);
    if (annotated != nullptr) *annotated = response.annotated();
    return s;
  }

  int64_t Unannotated(size_t via) {
    absl::StatusOr<v1::PoolInfo> pool = Client(via).GetPool("pool");
    EXPECT_TRUE(pool.ok()) << pool.status();
    return pool.ok() ? pool->num_unannotated_samples() : -1;
  }
};

TEST_F(ClusterAnnotationsTest, AnyMemberAnnotatesSamplesOfTheOthersAllOrNothing) {
  StartThree();
  const std::vector<std::string> a = PutOn(0, "a-", 3);
  const std::vector<std::string> b = PutOn(1, "b-", 3);
  EXPECT_EQ(Unannotated(2), 6);

  // Member 2 holds none of them.
  int32_t annotated = 0;
  grpc::Status s =
      Annotate(2, {{a[0], 1}, {b[0], 2}, {a[1], 3}, {b[1], 4}}, &annotated);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(annotated, 4);
  EXPECT_EQ(Unannotated(0), 2);

  // The same values again, through another member: no-ops.
  s = Annotate(1, {{a[0], 1}, {b[0], 2}}, &annotated);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(annotated, 2);

  // One owner refuses its share (another value): nothing is applied on
  // the other owner either, and the refusal names the sample and values.
  s = Annotate(2, {{a[2], 5}, {b[0], 7}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(),
              HasSubstr(absl::StrCat("sample \"", b[0], "\": scalar \"reward\" is already 2, "
                                     "this annotation sets 7")));
  EXPECT_EQ(Unannotated(0), 2);
  // a[2] was reserved and is free again at once: another value for it is
  // taken now.
  s = Annotate(0, {{a[2], 6}});
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Unannotated(1), 1);

  // An id no member holds; an id twice.
  s = Annotate(1, {{a[1], 3}, {"nowhere", 1}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("sample \"nowhere\" is not in pool \"pool\" on any of the 3 members"));
  s = Annotate(1, {{a[1], 3}, {a[1], 3}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // A sample in a live step, named with the step by its owner.
  v1::CreateStepRequest step;
  step.set_step_id("s1");
  step.set_pool("pool");
  step.add_sample_ids(a[0]);
  step.mutable_topology()->set_max_tokens_per_rank(4096);
  absl::StatusOr<v1::StepInfo> created = Client(2).CreateStep(step);
  ASSERT_TRUE(created.ok()) << created.status();
  s = Annotate(1, {{b[2], 1}, {a[0], 1}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("sample \"", a[0], "\" is in live step \"s1\"")));
  EXPECT_EQ(Unannotated(2), 1);  // b[2] was not annotated
}

TEST_F(ClusterAnnotationsTest, RequiredScalarsGateSelectionOverEveryMember) {
  StartThree();
  // Group g spread over members 0 and 1; x on member 2.
  const std::vector<std::string> g0 = PutOn(0, "g0-", 2, "g", 4);
  const std::vector<std::string> g1 = PutOn(1, "g1-", 2, "g", 4);
  const std::vector<std::string> x = PutOn(2, "x-", 2);
  v1::CreateStepRequest by_count;
  by_count.set_step_id("count");
  by_count.set_pool("pool");
  by_count.set_num_samples(1);
  by_count.mutable_topology()->set_max_tokens_per_rank(4096);
  absl::StatusOr<v1::StepInfo> none = Client(0).CreateStep(by_count);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("more lack a required scalar"));
  v1::CreateStepRequest explicit_id = by_count;
  explicit_id.set_step_id("explicit");
  explicit_id.set_num_samples(0);
  explicit_id.add_sample_ids(x[0]);
  absl::StatusOr<v1::StepInfo> lacking = Client(0).CreateStep(explicit_id);
  EXPECT_EQ(lacking.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lacking.status().message(), HasSubstr(absl::StrCat("sample \"", x[0], "\" lacks scalar \"reward\"")));

  // Three of the group's four annotated: not complete anywhere yet.
  ASSERT_TRUE(Annotate(2, {{g0[0], 1}, {g0[1], 0}, {g1[0], 1}}).ok());
  absl::StatusOr<v1::PoolInfo> pool = Client(2).GetPool("pool");
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->num_complete_groups(), 0);
  EXPECT_EQ(pool->num_unannotated_samples(), 3);
  v1::CreateStepRequest groups = by_count;
  groups.set_step_id("groups");
  groups.set_num_samples(0);
  groups.set_num_groups(1);
  EXPECT_EQ(Client(1).CreateStep(groups).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(Annotate(0, {{g1[1], 0}}).ok());
  pool = Client(2).GetPool("pool");
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->num_complete_groups(), 1);
  absl::StatusOr<v1::StepInfo> step = Client(1).CreateStep(groups);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->num_groups(), 1);
  absl::StatusOr<v1::Plan> plan = Client(1).GetPlan("groups");
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::string> taken;
  for (const auto& mb : plan->microbatches()) {
    for (const auto& g : mb.groups()) taken.insert(taken.end(), g.sample_ids().begin(), g.sample_ids().end());
  }
  EXPECT_THAT(taken, UnorderedElementsAreArray({g0[0], g0[1], g1[0], g1[1]}));
}

}  // namespace
}  // namespace rollpack
