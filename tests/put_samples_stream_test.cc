// The producer's hand-encoded PutSamples path: the bytes are protobuf's own,
// and a call fed with them behaves like the typed one (every message
// committed on its own, a refusal ends the call naming the sample).
#include "client/cpp/put_samples_stream.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "testing/synthetic_rollouts.h"
#include "gmock/gmock.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "proto/wire/deterministic_bytes.h"
#include "testing/in_process_server.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

v1::ModelSpec Model() {
  v1::ModelSpec m;
  m.set_name("small");
  m.set_num_layers(4);
  m.set_num_experts(32);
  m.set_topk(4);
  return m;
}

std::vector<v1::Sample> Samples(int n, uint64_t seed = 1) {
  SyntheticOptions options;
  options.num_samples = n;
  options.median_length = 300;
  options.max_length = 2000;
  options.seed = seed;
  return MakeSyntheticRollouts(Model(), options);  // mixed forms, token fields
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

TEST(EncodePutSamplesRequestTest, WritesProtobufsOwnBytes) {
  const std::vector<v1::Sample> samples = Samples(7);
  ASSERT_GE(samples[0].token_fields_size(), 2);  // map order matters
  for (const std::string pool : {"pool-a", ""}) {
    for (size_t n : {size_t{0}, size_t{1}, samples.size()}) {
      v1::PutSamplesRequest request;
      request.set_pool(pool);
      for (size_t i = 0; i < n; ++i) *request.add_samples() = samples[i];
      const std::string encoded =
          Flatten(EncodePutSamplesRequest(pool, absl::MakeConstSpan(samples).subspan(0, n)).value());
      EXPECT_EQ(encoded, DeterministicBytes(request)) << "pool '" << pool << "', " << n;
      v1::PutSamplesRequest parsed;
      ASSERT_TRUE(parsed.ParseFromString(encoded));
      EXPECT_EQ(parsed.samples_size(), static_cast<int>(n));
    }
  }
}

TEST(EncodeBufferPoolTest, ReusesReleasedBuffersBestFitWithinItsLimit) {
  constexpr size_t kMiB = size_t{1} << 20;
  std::shared_ptr<EncodeBufferPool> pool = EncodeBufferPool::Create(/*max_kept=*/1);
  grpc_slice a = pool->Allocate(1000);
  grpc_slice b = pool->Allocate(1000);
  const uint8_t* a_data = GRPC_SLICE_START_PTR(a);
  EXPECT_NE(a_data, GRPC_SLICE_START_PTR(b));  // both in use: two buffers
  grpc_slice_unref(a);
  grpc_slice_unref(b);  // over the limit, and no larger than the kept one: freed
  // Buffers come in whole MiB: a message a little longer still fits.
  grpc_slice c = pool->Allocate(kMiB - 10);
  EXPECT_EQ(GRPC_SLICE_START_PTR(c), a_data);
  EXPECT_EQ(GRPC_SLICE_LENGTH(c), kMiB - 10);
  grpc_slice d = pool->Allocate(3 * kMiB);  // nothing kept is big enough
  const uint8_t* d_data = GRPC_SLICE_START_PTR(d);
  grpc_slice_unref(d);  // kept
  grpc_slice_unref(c);  // full, and smaller than the kept 3 MiB: freed
  grpc_slice e = pool->Allocate(2 * kMiB);
  EXPECT_EQ(GRPC_SLICE_START_PTR(e), d_data);
  // A slice outliving every other owner of the pool keeps it alive.
  pool.reset();
  grpc_slice_unref(e);
}

TEST(EncodeBufferPoolTest, PooledEncodingIsTheSameBytes) {
  const std::vector<v1::Sample> samples = Samples(5, /*seed=*/3);
  std::shared_ptr<EncodeBufferPool> buffers = EncodeBufferPool::Create();
  v1::PutSamplesRequest request;
  request.set_pool("p");
  for (const v1::Sample& s : samples) *request.add_samples() = s;
  for (int round = 0; round < 3; ++round) {  // later rounds reuse the buffer
    EXPECT_EQ(Flatten(EncodePutSamplesRequest("p", samples, buffers.get()).value()),
              DeterministicBytes(request));
  }
}

// Borrowing: protobuf's bytes still, but the payload of large arrays is sent
// from the samples' own memory, and lent only while a message holds it.
TEST(EncodePutSamplesRequestTest, BorrowingWritesTheSameBytesAndLendsThePayload) {
  SyntheticOptions options;
  options.num_samples = 6;
  options.median_length = 3000;  // routed experts of 48 KB, spread both sides of a 64 KiB block
  options.max_length = 40000;
  options.seed = 5;
  const std::vector<v1::Sample> samples = MakeSyntheticRollouts(Model(), options);
  BorrowedSlices borrowed;
  for (const std::string pool : {"pool-a", ""}) {
    for (size_t n : {size_t{0}, size_t{1}, samples.size()}) {
      v1::PutSamplesRequest request;
      request.set_pool(pool);
      for (size_t i = 0; i < n; ++i) *request.add_samples() = samples[i];
      const auto some = absl::MakeConstSpan(samples).subspan(0, n);
      {
        const grpc::ByteBuffer message =
            EncodePutSamplesRequestBorrowing(pool, some, &borrowed).value();
        EXPECT_EQ(Flatten(message), DeterministicBytes(request)) << "pool '" << pool << "', " << n;
        std::vector<grpc::Slice> slices;
        ASSERT_TRUE(message.Dump(&slices).ok());
        int lent = 0;
        for (const grpc::Slice& slice : slices) {
          for (const v1::Sample& sample : some) {
            lent += slice.begin() ==
                    reinterpret_cast<const uint8_t*>(sample.routed_experts().data().data());
          }
        }
        if (n == samples.size()) {
          EXPECT_GT(lent, 0) << "no routing array was sent from the sample's memory";
          EXPECT_GT(borrowed.outstanding(), 0);
        }
      }
      EXPECT_EQ(borrowed.outstanding(), 0);  // the message is gone: all given back
    }
  }
}

class PutSamplesStreamTest : public InProcessServerTest {
 protected:
  void SetUp() override {
    InProcessServerTest::SetUp();
    ASSERT_TRUE(client_->RegisterModel("p", Model()).ok());
  }

  int64_t PoolSamples() {
    absl::StatusOr<v1::PoolInfo> info = client_->GetPool("p");
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->num_samples() : -1;
  }
};

TEST_F(PutSamplesStreamTest, OneMessagePerSampleAllStored) {
  const std::vector<v1::Sample> samples = Samples(9);
  ClientOptions options;
  options.batch_bytes = 1;  // every sample its own message
  RollpackClient client(channel_, options);
  absl::StatusOr<v1::PutSamplesResponse> put = client.PutSamples("p", samples);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->accepted(), 9);
  EXPECT_EQ(put->duplicates(), 0);
  EXPECT_GT(put->stored_bytes(), 0);
  EXPECT_EQ(PoolSamples(), 9);
  // Sent again in one message: all duplicates.
  put = client_->PutSamples("p", samples);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->accepted(), 9);
  EXPECT_EQ(put->duplicates(), 9);
}

TEST_F(PutSamplesStreamTest, RefusedMessageEndsTheCallEarlierOnesStay) {
  std::vector<v1::Sample> samples = Samples(6);
  samples[4].mutable_routed_experts()->mutable_shape()->Set(0, 1);  // rows != tokens
  ClientOptions options;
  options.batch_bytes = 1;
  RollpackClient client(channel_, options);
  absl::StatusOr<v1::PutSamplesResponse> put = client.PutSamples("p", samples);
  ASSERT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument) << put.status();
  EXPECT_THAT(put.status().message(), HasSubstr(samples[4].sample_id()));
  EXPECT_EQ(PoolSamples(), 4);
}

TEST_F(PutSamplesStreamTest, WritesAfterARefusalReportFailure) {
  std::vector<v1::Sample> samples = Samples(3);
  samples[0].clear_tokens();
  PutSamplesStream stream(channel_, std::make_unique<grpc::ClientContext>());
  ASSERT_TRUE(
      stream.Write(EncodePutSamplesRequest("p", absl::MakeConstSpan(samples).subspan(0, 1)).value()));
  // The server refuses the first message and ends the call; a later write
  // learns it once the server's status has arrived (on a loaded machine
  // that may take more than a few writes).
  bool open = true;
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (open && absl::Now() < give_up) {
    open = stream.Write(
        EncodePutSamplesRequest("p", absl::MakeConstSpan(samples).subspan(1, 1)).value());
    if (open) absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_FALSE(open);
  v1::PutSamplesResponse response;
  const grpc::Status status = stream.Finish(&response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr(samples[0].sample_id()));
  EXPECT_EQ(PoolSamples(), 0);
}

TEST_F(PutSamplesStreamTest, UnknownPoolIsNotFound) {
  absl::StatusOr<v1::PutSamplesResponse> put = client_->PutSamples("nope", Samples(2));
  EXPECT_EQ(put.status().code(), absl::StatusCode::kNotFound) << put.status();
}

TEST_F(PutSamplesStreamTest, AbandonedStreamIsCancelledNotCommittedTwice) {
  const std::vector<v1::Sample> samples = Samples(2);
  {
    PutSamplesStream stream(channel_, std::make_unique<grpc::ClientContext>());
    ASSERT_TRUE(stream.Write(EncodePutSamplesRequest("p", samples).value()));
    // No Finish: the destructor cancels and waits for the call to end.
  }
  // The message may or may not have been committed before the cancel; a
  // retry is then a duplicate, never a double.
  absl::StatusOr<v1::PutSamplesResponse> put = client_->PutSamples("p", samples);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(PoolSamples(), 2);
}

TEST_F(PutSamplesStreamTest, DeadlineOfTheContextApplies) {
  ClientOptions options;
  options.deadline = -absl::Seconds(1);  // already past when the call starts
  RollpackClient client(channel_, options);
  absl::StatusOr<v1::PutSamplesResponse> put = client.PutSamples("p", Samples(2));
  EXPECT_EQ(put.status().code(), absl::StatusCode::kDeadlineExceeded) << put.status();
}

}  // namespace
}  // namespace rollpack
