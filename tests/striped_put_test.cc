// The producer's side of a striped PutSamples call (RollpackClient with
// put_streams > 1), against a stand-in server that answers each stream as
// the test says: every stream of a call carries the call's fresh id, and a
// stream that fails on its own cancels the others instead of leaving them to
// wait for the deadline (the real server would wait for its messages).
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "testing/synthetic_rollouts.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "rollpack/v1/rollouts.pb.h"
#include "proto/wire/byte_buffer.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

// What the stand-in does with the stream of each stripe.
enum class Answer { kCountMessages, kFailAtOnce, kWaitForCancel };

class StandInRollouts final : public grpc::CallbackGenericService {
 public:
  explicit StandInRollouts(std::vector<Answer> answers) : answers_(std::move(answers)) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    std::string stripe_metadata;
    auto it = context->client_metadata().find("rollpack-stripe");
    if (it != context->client_metadata().end()) {
      stripe_metadata.assign(it->second.data(), it->second.size());
    }
    int stripe = 0;
    if (size_t slash = stripe_metadata.find('/'); slash != std::string::npos) {
      stripe = std::stoi(stripe_metadata.substr(slash + 1));
    }
    {
      absl::MutexLock lock(&mu_);
      stripe_metadata_.push_back(stripe_metadata);
    }
    const Answer answer =
        stripe < static_cast<int>(answers_.size()) ? answers_[stripe] : Answer::kCountMessages;
    Stream* stream = new Stream(this, answer);
    // A failing stream fails once every stripe of the call has reached the
    // server: a stream the client cancels before the server saw it would
    // never be cancelled here, and whether it was seen is a race.
    std::vector<Stream*> fail_now;
    {
      absl::MutexLock lock(&mu_);
      if (answer == Answer::kFailAtOnce) waiting_to_fail_.push_back(stream);
      if (++created_ >= static_cast<int>(answers_.size())) fail_now.swap(waiting_to_fail_);
    }
    for (Stream* s : fail_now) s->Fail();
    return stream;
  }

  std::vector<std::string> stripe_metadata() {
    absl::MutexLock lock(&mu_);
    return stripe_metadata_;
  }
  int cancelled() {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

 private:
  class Stream final : public grpc::ServerGenericBidiReactor {
   public:
    Stream(StandInRollouts* service, Answer answer) : service_(service), answer_(answer) {
      if (answer_ != Answer::kFailAtOnce) StartRead(&incoming_);
    }
    void Fail() { Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "stand-in: this stream fails")); }
    void OnReadDone(bool ok) override {
      if (ok) {
        ++messages_;
        StartRead(&incoming_);
        return;
      }
      if (answer_ == Answer::kWaitForCancel) return;  // OnCancel finishes
      v1::PutSamplesResponse response;
      response.set_accepted(messages_);
      outgoing_ = wire::SerializeToByteBuffer(response);
      StartWriteAndFinish(&outgoing_, grpc::WriteOptions(), grpc::Status::OK);
    }
    void OnCancel() override {
      absl::MutexLock lock(&service_->mu_);
      ++service_->cancelled_;
      if (answer_ == Answer::kWaitForCancel) Finish(grpc::Status::CANCELLED);
    }
    void OnDone() override { delete this; }

   private:
    StandInRollouts* const service_;
    const Answer answer_;
    grpc::ByteBuffer incoming_;
    grpc::ByteBuffer outgoing_;
    int messages_ = 0;
  };

  const std::vector<Answer> answers_;
  absl::Mutex mu_;
  std::vector<std::string> stripe_metadata_ ABSL_GUARDED_BY(mu_);
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  int created_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Stream*> waiting_to_fail_ ABSL_GUARDED_BY(mu_);
};

class StripedPutTest : public ::testing::Test {
 protected:
  void Serve(std::vector<Answer> answers) {
    service_ = std::make_unique<StandInRollouts>(std::move(answers));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterCallbackGenericService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  static std::vector<v1::Sample> Samples(int n) {
    v1::ModelSpec model;
    model.set_num_layers(2);
    model.set_num_experts(8);
    model.set_topk(2);
    SyntheticOptions options;
    options.num_samples = n;
    options.median_length = 64;
    options.max_length = 256;
    return MakeSyntheticRollouts(model, options);
  }

  std::unique_ptr<StandInRollouts> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(StripedPutTest, EveryStreamOfACallCarriesTheCallsFreshId) {
  Serve({});
  ClientOptions options;
  options.batch_bytes = 1;  // one sample per message
  options.put_streams = 3;
  RollpackClient client(address_, options);
  const std::vector<v1::Sample> samples = Samples(7);
  for (int call = 0; call < 2; ++call) {
    absl::StatusOr<v1::PutSamplesResponse> put = client.PutSamples("p", samples);
    ASSERT_TRUE(put.ok()) << put.status();
    EXPECT_EQ(put->accepted(), 7);  // 3 + 2 + 2 messages, summed
  }
  const std::vector<std::string> metadata = service_->stripe_metadata();
  ASSERT_EQ(metadata.size(), 6u);
  std::set<std::string> ids;
  std::set<std::string> streams;
  for (const std::string& value : metadata) {
    const std::string id = value.substr(0, value.find('/'));
    EXPECT_EQ(id.size(), 32u) << value;
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << value;
    ids.insert(id);
    streams.insert(value);
  }
  EXPECT_EQ(ids.size(), 2u);      // one id per call, shared by its streams
  EXPECT_EQ(streams.size(), 6u);  // each stripe once per call
  for (const std::string& id : ids) {
    for (int s = 0; s < 3; ++s) EXPECT_EQ(streams.count(id + "/" + std::to_string(s) + "/3"), 1u);
  }
}

TEST_F(StripedPutTest, AStreamThatFailsCancelsTheOthersAndNamesTheCause) {
  Serve({Answer::kWaitForCancel, Answer::kFailAtOnce});
  ClientOptions options;
  options.batch_bytes = 1;
  options.put_streams = 2;
  options.deadline = absl::Seconds(60);
  RollpackClient client(address_, options);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::PutSamplesResponse> put = client.PutSamples("p", Samples(6));
  // Not the deadline: stream 0 was cancelled once stream 1 failed.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_EQ(put.status().code(), absl::StatusCode::kUnavailable) << put.status();
  EXPECT_THAT(std::string(put.status().message()), HasSubstr("stand-in: this stream fails"));
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (service_->cancelled() < 1 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_GE(service_->cancelled(), 1);
}

}  // namespace
}  // namespace rollpack
