// Rollouts.AnnotateSamples against a real rollpackd in durable mode
// (../shared/spec/lifecycle.md section 6): rewards added after the samples,
// refused as the contract says, gating selection through required_scalars,
// and back after kill -9 and a restart.
#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "rollpack/v1/rollouts.grpc.pb.h"
#include "rollpack/v1/scheduler.grpc.pb.h"
#include "testing/durable_daemon_test.h"
#include "testing/ndarrays.h"

#ifndef ROLLPACKD_PATH
#error "ROLLPACKD_PATH must name the rollpackd binary"
#endif

namespace rollpack {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_name("annotated");
  m.set_num_layers(2);
  m.set_num_experts(4);
  m.set_topk(1);
  return m;
}

v1::Sample Sample(const std::string& id, const std::string& group) {
  v1::Sample s;
  s.set_sample_id(id);
  s.set_group_id(group);
  std::vector<int32_t> tokens = {5, 6, 7, 8};
  std::vector<int32_t> experts = {0, 1, 1, 2, 2, 3, 3, 0};
  *s.mutable_tokens() = TestArray(v1::INT32, {4}, tokens);
  *s.mutable_routed_experts() = TestArray(v1::INT32, {4, 2, 1}, experts);
  return s;
}

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return context;
}

class AnnotationsTest : public DurableDaemonTest {
 protected:
  AnnotationsTest() : DurableDaemonTest(ROLLPACKD_PATH) {}

  void Start() {
    ASSERT_NO_FATAL_FAILURE(StartDaemon());
    auto channel = grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials());
    rollouts_ = v1::Rollouts::NewStub(channel);
    scheduler_ = v1::Scheduler::NewStub(channel);
  }

  grpc::Status Annotate(const std::vector<std::pair<std::string, double>>& rewards,
                        int32_t* annotated = nullptr, const std::string& pool = "grpo") {
    v1::AnnotateSamplesRequest request;
    request.set_pool(pool);
    for (const auto& [id, reward] : rewards) {
      v1::SampleAnnotation* a = request.add_annotations();
      a->set_sample_id(id);
      (*a->mutable_scalars())["reward"] = reward;
    }
    v1::AnnotateSamplesResponse response;
    grpc::Status s = rollouts_->AnnotateSamples(Context().get(), request, &response);
    if (annotated != nullptr) *annotated = response.annotated();
    return s;
  }

  v1::PoolInfo Pool() {
    v1::GetPoolRequest request;
    request.set_pool("grpo");
    v1::PoolInfo info;
    grpc::Status s = rollouts_->GetPool(Context().get(), request, &info);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return info;
  }

  grpc::Status CreateStep(const std::string& step_id, std::vector<std::string> ids,
                          int num_groups, v1::StepInfo* info) {
    v1::CreateStepRequest request;
    request.set_step_id(step_id);
    request.set_pool("grpo");
    for (const std::string& id : ids) request.add_sample_ids(id);
    request.set_num_groups(num_groups);
    request.mutable_topology()->set_max_tokens_per_rank(4096);
    return scheduler_->CreateStep(Context().get(), request, info);
  }

  std::unique_ptr<v1::Rollouts::Stub> rollouts_;
  std::unique_ptr<v1::Scheduler::Stub> scheduler_;
};

TEST_F(AnnotationsTest, RewardsAddedLaterGateSelectionAndSurviveKillNine) {
  Start();
  {
    v1::RegisterModelRequest request;
    request.set_pool("grpo");
    *request.mutable_model() = Model();
    request.mutable_options()->set_default_group_size(2);
    request.mutable_options()->add_required_scalars("reward");
    v1::RegisterModelResponse response;
    grpc::Status s = rollouts_->RegisterModel(Context().get(), request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_THAT(response.options().required_scalars(), ElementsAre("reward"));
  }
  {
    v1::PutSamplesResponse response;
    auto context = Context();
    auto writer = rollouts_->PutSamples(context.get(), &response);
    v1::PutSamplesRequest put;
    put.set_pool("grpo");
    *put.add_samples() = Sample("a1", "a");
    *put.add_samples() = Sample("a2", "a");
    *put.add_samples() = Sample("b1", "b");
    *put.add_samples() = Sample("b2", "b");
    ASSERT_TRUE(writer->Write(put));
    writer->WritesDone();
    grpc::Status s = writer->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(Pool().num_unannotated_samples(), 4);
  EXPECT_EQ(Pool().num_free_samples(), 4);
  EXPECT_EQ(Pool().num_complete_groups(), 0);

  int32_t annotated = 0;
  grpc::Status s = Annotate({{"a1", 1}, {"a2", 0.25}, {"b1", 0.5}}, &annotated);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(annotated, 3);
  EXPECT_EQ(Pool().num_unannotated_samples(), 1);
  EXPECT_EQ(Pool().num_complete_groups(), 1);

  // The refusals, over the wire, with their codes and words.
  s = Annotate({{"a1", 2}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(),
              HasSubstr("sample \"a1\": scalar \"reward\" is already 1, this annotation sets 2"));
  s = Annotate({{"nope", 2}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("sample \"nope\""));
  s = Annotate({{"b2", 2}, {"b2", 2}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = Annotate({{"a1", 1}}, nullptr, "other");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);

  daemon_->Kill(SIGKILL);
  Start();

  // The annotations are back: the same counts, the same values.
  EXPECT_EQ(Pool().num_unannotated_samples(), 1);
  EXPECT_EQ(Pool().num_complete_groups(), 1);
  s = Annotate({{"a1", 1}}, &annotated);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(annotated, 1);
  s = Annotate({{"a2", 0.5}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("is already 0.25, this annotation sets 0.5"));

  v1::StepInfo info;
  s = CreateStep("lacking", {"b2"}, 0, &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("sample \"b2\" lacks scalar \"reward\""));
  s = CreateStep("s1", {}, 1, &info);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(info.num_groups(), 1);
  // In a live step: refused, naming the step.
  s = Annotate({{"a1", 1}});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("sample \"a1\" is in live step \"s1\""));
  // The last reward completes group b.
  ASSERT_TRUE(Annotate({{"b2", 0}}).ok());
  EXPECT_EQ(Pool().num_unannotated_samples(), 0);
  s = CreateStep("s2", {}, 1, &info);
  ASSERT_TRUE(s.ok()) << s.error_message();
}

}  // namespace
}  // namespace rollpack
