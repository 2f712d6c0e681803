// Faults on the wire: a producer that disconnects mid-stream leaves no
// partial sample; a trainer stream cut after any micro-batch resumes with
// byte-identical micro-batches; a stalled trainer stream does not delay the
// other ranks.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/cpp/client.h"
#include "testing/synthetic_rollouts.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "proto/wire/deterministic_bytes.h"
#include "server/server.h"
#include "testing/in_process_server.h"

namespace rollpack {
namespace {

v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_name("fault");
  m.set_num_layers(16);
  m.set_num_experts(128);
  m.set_topk(8);
  return m;
}

class FaultTest : public InProcessServerTest {
 protected:
  void SetUp() override {
    InProcessServerTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(client_->RegisterModel("p", Model()).ok());
  }

  std::vector<v1::Sample> Make(int num, int64_t length, uint64_t seed, const std::string& prefix) {
    SyntheticOptions options;
    options.num_samples = num;
    options.median_length = static_cast<double>(length);
    options.sigma = 0.01;
    options.max_length = length * 2;
    options.seed = seed;
    std::vector<v1::Sample> samples = MakeSyntheticRollouts(Model(), options);
    for (v1::Sample& s : samples) s.set_sample_id(prefix + s.sample_id());
    return samples;
  }

  std::vector<std::string> FetchAll(const std::string& step, int dp, int start,
                                    int stop_after = -1) {
    auto stub = v1::Trainer::NewStub(channel_);
    grpc::ClientContext context;
    v1::FetchRequest request;
    request.set_step_id(step);
    request.mutable_rank()->set_dp(dp);
    request.set_start_index(start);
    auto reader = stub->FetchMicrobatches(&context, request);
    std::vector<std::string> out;
    v1::Microbatch mb;
    while (static_cast<int>(out.size()) != stop_after && reader->Read(&mb)) out.push_back(DeterministicBytes(mb));
    if (stop_after >= 0) context.TryCancel();  // the connection is cut here
    reader->Finish();
    return out;
  }
};

TEST_F(FaultTest, ProducerDisconnectMidStreamLeavesNoPartialSample) {
  const std::vector<v1::Sample> first = Make(2, 256, 1, "a-");
  // A large second message: 8 samples of ~16k tokens (~20 MB), cut while in flight.
  const std::vector<v1::Sample> second = Make(8, 16384, 2, "b-");
  auto present = [&](const std::vector<v1::Sample>& samples, const std::string& suffix) {
    int count = 0;
    for (const v1::Sample& s : samples) {
      v1::CreateStepRequest create;
      create.set_step_id("probe-" + s.sample_id() + suffix);
      create.set_pool("p");
      create.add_sample_ids(s.sample_id() + suffix);
      create.mutable_topology()->set_max_tokens_per_rank(65536);
      absl::StatusOr<v1::StepInfo> step = client_->CreateStep(create);
      if (step.ok()) {
        ++count;
        EXPECT_TRUE(client_->ReleaseStep(create.step_id()).ok());
      } else {
        EXPECT_EQ(step.status().code(), absl::StatusCode::kNotFound) << step.status();
      }
    }
    return count;
  };
  int committed = 0, dropped = 0;
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::string suffix = "-" + std::to_string(attempt);
    auto stub = v1::Rollouts::NewStub(channel_);
    grpc::ClientContext context;
    v1::PutSamplesResponse response;
    auto writer = stub->PutSamples(&context, &response);
    v1::PutSamplesRequest a, b;
    a.set_pool("p");
    for (v1::Sample s : first) {
      s.set_sample_id(s.sample_id() + suffix);
      *a.add_samples() = s;
    }
    for (v1::Sample s : second) {
      s.set_sample_id(s.sample_id() + suffix);
      *b.add_samples() = s;
    }
    ASSERT_TRUE(writer->Write(a));
    // The client goes away at a different moment each attempt, while the
    // large message is on the wire.
    std::thread cutter([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(300 * attempt));
      context.TryCancel();
    });
    writer->Write(b);
    cutter.join();
    writer->Finish();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int a_count = present(first, suffix);
    const int b_count = present(second, suffix);
    EXPECT_TRUE(a_count == 0 || a_count == 2) << "attempt " << attempt << ": " << a_count;
    EXPECT_TRUE(b_count == 0 || b_count == 8)
        << "attempt " << attempt << ": " << b_count << " of 8 samples of a cut message stored";
    (b_count == 0 ? dropped : committed)++;
  }
  // Everything that was stored was probed and released: nothing partial is left.
  EXPECT_EQ(client_->GetPool("p")->num_samples(), 0);
  std::printf("cut message: dropped whole %d times, arrived whole before the cut %d times\n",
              dropped, committed);
}

TEST_F(FaultTest, StreamCutAfterAnyMicrobatchResumesByteIdentical) {
  ASSERT_TRUE(client_->PutSamples("p", Make(48, 600, 3, "r-")).ok());
  v1::CreateStepRequest create;
  create.set_step_id("cut");
  create.set_pool("p");
  create.set_num_samples(48);
  create.mutable_topology()->set_dp(2);
  create.mutable_topology()->set_tp(2);
  create.mutable_topology()->set_max_tokens_per_rank(1024);
  ASSERT_TRUE(client_->CreateStep(create).ok());
  for (int dp = 0; dp < 2; ++dp) {
    const std::vector<std::string> full = FetchAll("cut", dp, 0);
    ASSERT_GE(full.size(), 4u);
    for (size_t k = 0; k <= full.size(); ++k) {
      std::vector<std::string> got = FetchAll("cut", dp, 0, static_cast<int>(k));
      ASSERT_EQ(got.size(), k);
      std::vector<std::string> rest = FetchAll("cut", dp, static_cast<int>(k));
      got.insert(got.end(), rest.begin(), rest.end());
      ASSERT_EQ(got.size(), full.size()) << "cut after " << k;
      for (size_t i = 0; i < full.size(); ++i) {
        EXPECT_TRUE(got[i] == full[i]) << "dp " << dp << " cut after " << k << ": micro-batch " << i;
      }
    }
  }
}

TEST_F(FaultTest, StalledTrainerDoesNotDelayOtherRanks) {
  // Big micro-batches (~3 MB each) so a stalled reader fills its flow-control window.
  ASSERT_TRUE(client_->PutSamples("p", Make(32, 8000, 4, "s-")).ok());
  v1::CreateStepRequest create;
  create.set_step_id("slow");
  create.set_pool("p");
  create.set_num_samples(32);
  create.mutable_topology()->set_dp(2);
  create.mutable_topology()->set_max_tokens_per_rank(16384);
  ASSERT_TRUE(client_->CreateStep(create).ok());

  const auto stall = std::chrono::seconds(3);
  auto stub = v1::Trainer::NewStub(channel_);
  grpc::ClientContext slow_context;
  v1::FetchRequest slow_request;
  slow_request.set_step_id("slow");
  slow_request.mutable_rank()->set_dp(0);
  auto slow = stub->FetchMicrobatches(&slow_context, slow_request);
  v1::Microbatch mb;
  ASSERT_TRUE(slow->Read(&mb));  // then stall, holding the stream open

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> other = FetchAll("slow", 1, 0);
  const double other_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(other.size(), 2u);
  EXPECT_LT(other_seconds, 1.0) << "dp 1 waited on the stalled dp 0 stream";
  std::this_thread::sleep_for(stall - std::chrono::duration_cast<std::chrono::seconds>(
                                          std::chrono::steady_clock::now() - t0));
  int rest = 1;
  while (slow->Read(&mb)) ++rest;
  EXPECT_TRUE(slow->Finish().ok());
  EXPECT_GE(rest, 2);
  std::printf("other rank: %zu micro-batches in %.3f s while dp 0 stalled\n", other.size(),
              other_seconds);
}

}  // namespace
}  // namespace rollpack
