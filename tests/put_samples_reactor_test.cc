// Ingest with messages parsed in parallel (server/ingest/put_samples_reactor.h) and
// calls striped over several streams (server/ingest/commit_sequencer.h): samples
// still arrive in the pool in the order they were sent, whatever the number
// of messages in flight or of streams, and a refusal commits exactly the
// messages before it.
#include "server/ingest/put_samples_reactor.h"

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "client/cpp/put_samples_stream.h"
#include "testing/synthetic_rollouts.h"
#include "gtest/gtest.h"
#include "server/server.h"

namespace rollpack {
namespace {

v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_name("small");
  m.set_num_layers(24);
  m.set_num_experts(64);
  m.set_topk(8);
  return m;
}

struct IngestCase {
  int messages_in_flight;
  int put_streams;
};

class PutSamplesReactorTest : public ::testing::TestWithParam<IngestCase> {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.ingest.messages_in_flight = GetParam().messages_in_flight;
    options.ingest.threads = 3;
    absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ClientOptions client_options;
    client_options.batch_bytes = 1;  // one sample per message
    client_options.put_streams = GetParam().put_streams;
    client_ = std::make_unique<RollpackClient>(server_->address(), client_options);
    ASSERT_TRUE(client_->RegisterModel("p", Model()).ok());
    SyntheticOptions synth;
    synth.num_samples = 48;
    synth.median_length = 2000;
    synth.sigma = 1.5;
    synth.min_length = 16;
    synth.max_length = 32768;
    samples_ = MakeSyntheticRollouts(Model(), synth);
    // Long and short messages in turn: a short one is parsed and validated
    // before the long one sent ahead of it, so committing in the order
    // messages become ready would reorder the pool.
    std::sort(samples_.begin(), samples_.end(), [](const v1::Sample& a, const v1::Sample& b) {
      return a.tokens().shape(0) > b.tokens().shape(0);
    });
    std::vector<v1::Sample> alternating;
    for (size_t lo = 0, hi = samples_.size(); lo < hi;) {
      alternating.push_back(samples_[lo++]);
      if (lo < hi) alternating.push_back(samples_[--hi]);
    }
    samples_ = std::move(alternating);
  }
  void TearDown() override { server_->Shutdown(absl::Seconds(1)); }

  // The ids of the `n` oldest free samples, as CreateStep picks them.
  std::set<std::string> OldestFree(int n) {
    v1::CreateStepRequest create;
    create.set_step_id("s");
    create.set_pool("p");
    create.set_num_samples(n);
    create.mutable_topology()->set_dp(1);
    create.mutable_topology()->set_max_tokens_per_rank(1 << 20);
    EXPECT_TRUE(client_->CreateStep(create).ok());
    absl::StatusOr<v1::Plan> plan = client_->GetPlan("s");
    EXPECT_TRUE(plan.ok()) << plan.status();
    std::set<std::string> ids;
    if (!plan.ok()) return ids;
    for (const v1::PlanMicrobatch& mb : plan->microbatches()) {
      for (const v1::RankGroup& g : mb.groups()) ids.insert(g.sample_ids().begin(), g.sample_ids().end());
    }
    return ids;
  }

  std::unique_ptr<RollpackServer> server_;
  std::unique_ptr<RollpackClient> client_;
  std::vector<v1::Sample> samples_;
};

TEST_P(PutSamplesReactorTest, CommitsInTheOrderSent) {
  absl::StatusOr<v1::PutSamplesResponse> put = client_->PutSamples("p", samples_);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->accepted(), 48);
  std::set<std::string> first;
  for (int i = 0; i < 20; ++i) first.insert(samples_[i].sample_id());
  EXPECT_EQ(OldestFree(20), first);
}

TEST_P(PutSamplesReactorTest, RefusalCommitsExactlyTheMessagesBefore) {
  samples_[30].mutable_tokens()->clear_data();
  absl::StatusOr<v1::PutSamplesResponse> put = client_->PutSamples("p", samples_);
  ASSERT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument) << put.status();
  const std::string committed =
      GetParam().put_streams == 1
          ? "30 samples of earlier messages of this stream were committed"
          : absl::StrCat("30 samples of earlier messages of this call (", GetParam().put_streams,
                         " streams) were committed");
  EXPECT_NE(put.status().message().find(committed), std::string::npos) << put.status();
  absl::StatusOr<v1::PoolInfo> pool = client_->GetPool("p");
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->num_samples(), 30);
  std::set<std::string> first;
  for (int i = 0; i < 30; ++i) first.insert(samples_[i].sample_id());
  EXPECT_EQ(OldestFree(30), first);
}

// A stream that claims to be part of a call it does not fit is refused
// before anything is read.
TEST_P(PutSamplesReactorTest, RefusesMalformedStripeMetadata) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->AddMetadata("rollpack-stripe", "abcdefgh/3/2");
  PutSamplesStream stream(MakeChannel(server_->address()), std::move(context));
  v1::PutSamplesResponse response;
  grpc::Status status = stream.Finish(&response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("the stripe must be 0 to COUNT - 1"), std::string::npos)
      << status.error_message();
}

// The streams of a call striped over two, opened by hand.
std::vector<std::unique_ptr<PutSamplesStream>> OpenStripes(const std::string& address,
                                                           const std::string& call_id) {
  std::vector<std::unique_ptr<PutSamplesStream>> streams;
  for (int s = 0; s < 2; ++s) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("rollpack-stripe", absl::StrCat(call_id, "/", s, "/2"));
    streams.push_back(std::make_unique<PutSamplesStream>(MakeChannel(address), std::move(context)));
  }
  return streams;
}

// One sample as message `m` of the call, naming the pool or not.
grpc::ByteBuffer Message(const std::vector<v1::Sample>& samples, int m, bool name_pool) {
  return EncodePutSamplesRequest(name_pool ? "p" : "", absl::MakeConstSpan(samples).subspan(m, 1))
      .value();
}

// The pool a message leaves out is the call's, not its stream's: message 1
// travels alone on stream 1 and goes where message 0 went.
TEST_P(PutSamplesReactorTest, AMessageWithoutAPoolGoesToThePoolOfTheMessageBeforeIt) {
  auto streams = OpenStripes(server_->address(), "pool-of-the-call");
  ASSERT_TRUE(streams[0]->Write(Message(samples_, 0, /*name_pool=*/true)));
  ASSERT_TRUE(streams[1]->Write(Message(samples_, 1, /*name_pool=*/false)));
  ASSERT_TRUE(streams[0]->Write(Message(samples_, 2, /*name_pool=*/false)));
  v1::PutSamplesResponse first, second;
  grpc::Status status = streams[0]->Finish(&first);
  ASSERT_TRUE(status.ok()) << status.error_message();
  status = streams[1]->Finish(&second);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(first.accepted(), 2);
  EXPECT_EQ(second.accepted(), 1);
  absl::StatusOr<v1::PoolInfo> pool = client_->GetPool("p");
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(pool->num_samples(), 3);
}

// A cancelled stream ends its call; the other streams did not fail, they
// were stopped: ABORTED, naming the stream.
TEST_P(PutSamplesReactorTest, ACancelledStreamAbortsTheOthers) {
  auto streams = OpenStripes(server_->address(), "cancelled-call");
  ASSERT_TRUE(streams[0]->Write(Message(samples_, 0, true)));
  ASSERT_TRUE(streams[1]->Write(Message(samples_, 1, true)));
  // Both committed: both streams have joined the call.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  int64_t stored = 0;
  while (stored < 2 && absl::Now() < give_up) {
    absl::StatusOr<v1::PoolInfo> pool = client_->GetPool("p");
    stored = pool.ok() ? pool->num_samples() : 0;
    if (stored < 2) absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_EQ(stored, 2);
  ASSERT_TRUE(streams[1]->Write(Message(samples_, 3, true)));  // waits for message 2
  streams[0]->Cancel();
  v1::PutSamplesResponse response;
  grpc::Status status = streams[1]->Finish(&response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED) << status.error_message();
  // gRPC may end stream 0's reads before it reports the cancel: either way
  // the others are told stream 0 stopped.
  EXPECT_TRUE(
      status.error_message().find("stream 0 of this PutSamples call was cancelled") !=
          std::string::npos ||
      status.error_message().find("(stream 0 of 2 ended after 1 messages)") != std::string::npos)
      << status.error_message();
  EXPECT_EQ(streams[0]->Finish(&response).error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(client_->GetPool("p")->num_samples(), 2);
}

INSTANTIATE_TEST_SUITE_P(Ingest, PutSamplesReactorTest,
                         ::testing::Values(IngestCase{1, 1}, IngestCase{2, 1}, IngestCase{8, 1},
                                           IngestCase{1, 4}, IngestCase{8, 3}),
                         [](const ::testing::TestParamInfo<IngestCase>& info) {
                           return absl::StrCat("InFlight", info.param.messages_in_flight,
                                               "Streams", info.param.put_streams);
                         });

}  // namespace
}  // namespace rollpack
