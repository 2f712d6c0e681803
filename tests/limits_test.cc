// Server limits and options: per-pool memory, the stream limit, --grpc-arg.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "client/cpp/trainer_stream.h"
#include "grpc/compression.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "server/ops/auth.h"
#include "server/ops/metrics/scrape_registry.h"
#include "server/server.h"
#include "testing/exposition.h"
#include "testing/ops_fixtures.h"
#include "testing/synthetic_rollouts.h"

namespace rollpack {
namespace {

using ::testing::HasSubstr;

TEST(GrpcArgTest, ParsesNameEqualsInteger) {
  absl::StatusOr<std::pair<std::string, int>> arg =
      ParseGrpcIntArg("grpc.http2.lookahead_bytes=16777216");
  ASSERT_TRUE(arg.ok()) << arg.status();
  EXPECT_EQ(arg->first, "grpc.http2.lookahead_bytes");
  EXPECT_EQ(arg->second, 16777216);
  for (const char* bad : {"grpc.http2.bdp_probe", "=3", "a=x", "a=", "a=99999999999"}) {
    absl::StatusOr<std::pair<std::string, int>> refused = ParseGrpcIntArg(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr(bad));
  }
}

TEST(GrpcArgTest, ServerServesWithThem) {
  ServerOptions options;
  options.grpc_int_args = {{"grpc.http2.lookahead_bytes", 1 << 20}, {"grpc.http2.bdp_probe", 0}};
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  RollpackClient client(MakeChannel((*server)->address()));
  v1::ModelSpec model;
  model.set_name("m");
  model.set_num_layers(2);
  model.set_num_experts(8);
  model.set_topk(2);
  EXPECT_TRUE(client.RegisterModel("p", model).ok());
  (*server)->Shutdown(absl::Seconds(1));
}

TEST(ListenTest, APortInUseIsRefusedNamingWhy) {
  absl::StatusOr<std::unique_ptr<RollpackServer>> first = RollpackServer::Start({});
  ASSERT_TRUE(first.ok()) << first.status();
  ServerOptions second;
  second.listen = (*first)->address();
  absl::StatusOr<std::unique_ptr<RollpackServer>> refused = RollpackServer::Start(second);
  ASSERT_FALSE(refused.ok()) << "a second server on " << second.listen
                             << " would split clients between two stores";
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("cannot listen on " + second.listen + ": address in use"));
  (*first)->Shutdown(absl::Seconds(1));
}

TEST(ListenTest, MalformedOptionsAreRefusedNamingTheFlag) {
  struct Case {
    std::string listen;
    int64_t max_memory;
    std::string names;
  };
  for (const Case& c : std::vector<Case>{{"127.0.0.1", 0, "--listen \"127.0.0.1\""},
                                         {"127.0.0.1:70000", 0, "--listen"},
                                         {":50051", 0, "--listen"},
                                         {"127.0.0.1:0", -5, "--max-memory is -5"}}) {
    ServerOptions options;
    options.listen = c.listen;
    options.max_memory_bytes = c.max_memory;
    absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
    ASSERT_FALSE(server.ok()) << c.listen << " " << c.max_memory;
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(server.status().message()), HasSubstr(c.names));
  }
}

// --------------------------------------------------------- per-pool memory

TEST(PoolMemoryTest, OnePoolCannotTakeTheWholeStore) {
  const std::vector<v1::Sample> samples = Samples(8, 512, 5);
  // The bytes of the first four samples, measured on an unlimited server.
  int64_t four = 0;
  {
    absl::StatusOr<std::unique_ptr<RollpackServer>> probe = RollpackServer::Start({});
    ASSERT_TRUE(probe.ok());
    RollpackClient client(MakeChannel((*probe)->address()));
    ASSERT_TRUE(client.RegisterModel("p", Model()).ok());
    absl::StatusOr<v1::PutSamplesResponse> put =
        client.PutSamples("p", absl::MakeSpan(samples).subspan(0, 4));
    ASSERT_TRUE(put.ok());
    four = put->stored_bytes();
  }
  ServerOptions options;
  options.max_pool_memory_bytes = four;
  options.metrics_listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  RollpackClient client(MakeChannel((*server)->address()));
  ASSERT_TRUE(client.RegisterModel("a", Model()).ok());
  ASSERT_TRUE(client.RegisterModel("b", Model()).ok());
  ASSERT_TRUE(client.PutSamples("a", absl::MakeSpan(samples).subspan(0, 4)).ok());
  absl::StatusOr<v1::PutSamplesResponse> over =
      client.PutSamples("a", absl::MakeSpan(samples).subspan(4, 1));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("pool \"a\""));
  EXPECT_THAT(over.status().message(), HasSubstr("--max-pool-memory"));
  // Another pool still has its own room.
  EXPECT_TRUE(client.PutSamples("b", absl::MakeSpan(samples).subspan(0, 4)).ok());
  const std::string text = (*server)->metrics_registry().SerializeText();
  EXPECT_THAT(text, HasSubstr("rollpack_pool_max_bytes " + std::to_string(four) + "\n"));
  EXPECT_THAT(text, HasSubstr(
      "rollpack_put_refusals_total{pool=\"a\",reason=\"resource_exhausted\"} 1\n"));
  (*server)->Shutdown(absl::Seconds(1));
}

// ------------------------------------------- samples per message and step

TEST(SampleCountTest, MessagesAndStepsOverTheirSampleLimitsAreRefusedWhole) {
  ServerOptions options;
  options.ingest.max_samples_per_message = 3;
  options.max_samples_per_step = 4;
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::vector<v1::Sample> samples = Samples(5, 64, 9);
  ClientOptions unsplit;
  unsplit.batch_samples = 0;  // one message of five
  RollpackClient whole(MakeChannel((*server)->address()), unsplit);
  ASSERT_TRUE(whole.RegisterModel("p", Model()).ok());
  absl::StatusOr<v1::PutSamplesResponse> refused = whole.PutSamples("p", samples);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("PutSamplesRequest has 5 samples; the server takes at most 3 per message "
                        "(--max-samples-per-message)"));
  absl::StatusOr<v1::PoolInfo> pool = whole.GetPool("p");
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->num_samples(), 0);

  // A producer that splits at the server's count stores them all.
  ClientOptions split;
  split.batch_samples = 3;
  RollpackClient client(MakeChannel((*server)->address()), split);
  absl::StatusOr<v1::PutSamplesResponse> put = client.PutSamples("p", samples);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->accepted(), 5);

  // A step over the limit is refused, whatever selects it, and takes nothing.
  v1::CreateStepRequest by_count = StepRequest("s1", "p", 5, 1, 1 << 16);
  v1::CreateStepRequest by_ids = StepRequest("s1", "p", 0, 1, 1 << 16);
  for (const v1::Sample& s : samples) by_ids.add_sample_ids(s.sample_id());
  v1::CreateStepRequest by_tokens = StepRequest("s1", "p", 0, 1, 1 << 16);
  int64_t tokens = 0;
  for (const v1::Sample& s : samples) tokens += s.tokens().shape(0);
  by_tokens.set_num_tokens(tokens);
  for (const v1::CreateStepRequest& request : {by_count, by_ids, by_tokens}) {
    absl::StatusOr<v1::StepInfo> step = client.CreateStep(request);
    EXPECT_EQ(step.status().code(), absl::StatusCode::kResourceExhausted) << request.DebugString();
    EXPECT_THAT(step.status().message(), HasSubstr("step \"s1\""));
    EXPECT_THAT(step.status().message(),
                HasSubstr("would take 5 samples; the server plans at most 4 per step "
                          "(--max-samples-per-step)"));
  }
  absl::StatusOr<v1::StepInfo> step = client.CreateStep(StepRequest("s1", "p", 4, 1, 1 << 16));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->num_samples(), 4);

  options = ServerOptions();
  options.max_samples_per_step = -1;
  EXPECT_THAT(RollpackServer::Start(options).status().message(),
              HasSubstr("--max-samples-per-step is -1"));
  options = ServerOptions();
  options.ingest.max_samples_per_message = -2;
  EXPECT_THAT(RollpackServer::Start(options).status().message(),
              HasSubstr("--max-samples-per-message is -2"));
  (*server)->Shutdown(absl::Seconds(1));
}

// ------------------------------------------------------------- stream limit

TEST(StreamLimitTest, RefusesStreamsPastTheLimitAndRecovers) {
  ServerOptions options;
  options.fetch.max_concurrent_streams = 1;
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = MakeChannel((*server)->address());
  RollpackClient client(channel);
  ASSERT_TRUE(client.RegisterModel("p", Model()).ok());
  // Enough bytes per rank that an unread stream stalls on flow control.
  ASSERT_TRUE(client.PutSamples("p", Samples(64, 8192, 3)).ok());
  ASSERT_TRUE(client.CreateStep(StepRequest("big", "p", 64, 1, 8192)).ok());
  auto stub = v1::Trainer::NewStub(channel);
  v1::FetchRequest req;
  req.set_step_id("big");

  auto held_ctx = std::make_unique<grpc::ClientContext>();
  auto held = stub->FetchMicrobatches(held_ctx.get(), req);
  v1::Microbatch mb;
  ASSERT_TRUE(held->Read(&mb));  // in flight, not finished

  auto Fetch = [&] {
    grpc::ClientContext ctx;
    auto reader = stub->FetchMicrobatches(&ctx, req);
    v1::Microbatch m;
    int n = 0;
    while (reader->Read(&m)) ++n;
    return std::make_pair(reader->Finish(), n);
  };
  const auto refused = Fetch();
  EXPECT_EQ(refused.first.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.first.error_message();
  EXPECT_THAT(refused.first.error_message(), HasSubstr("--max-concurrent-streams"));

  held_ctx->TryCancel();
  held->Finish();
  // The slot frees once the server sees the cancellation.
  grpc::Status s;
  for (int i = 0; i < 200; ++i) {
    const auto again = Fetch();
    s = again.first;
    if (s.ok()) {
      EXPECT_GT(again.second, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT((*server)->metrics_registry().SerializeText(),
              HasSubstr("rollpack_streams_refused_total "));
  (*server)->Shutdown(absl::Seconds(1));
}


// A server with one step whose ranks' bytes far exceed the transport's
// windows, so an unread stream stalls on flow control.
struct BigStep {
  explicit BigStep(ServerOptions options) {
    absl::StatusOr<std::unique_ptr<RollpackServer>> started = RollpackServer::Start(options);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return;
    server = *std::move(started);
    channel = MakeChannel(server->address());
    RollpackClient client(channel);
    EXPECT_TRUE(client.RegisterModel("p", Model()).ok());
    EXPECT_TRUE(client.PutSamples("p", Samples(64, 8192, 3)).ok());
    EXPECT_TRUE(client.CreateStep(StepRequest("big", "p", 64, 1, 8192)).ok());
    stub = v1::Trainer::NewStub(channel);
    request.set_step_id("big");
  }
  double Metric(const std::string& name) {
    return ParseExposition(server->metrics_registry().SerializeText())[name];
  }
  std::unique_ptr<RollpackServer> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Trainer::Stub> stub;
  v1::FetchRequest request;
};

// A trainer stub on a connection with small receive windows, as most
// clients have: it cannot swallow a rank's micro-batches while it does not
// read.
std::unique_ptr<v1::Trainer::Stub> SmallWindowStub(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  args.SetMaxReceiveMessageSize(-1);
  return v1::Trainer::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

TEST(StreamLimitTest, OneClientCannotTakeMoreThanItsStreams) {
  ServerOptions options;
  options.fetch.max_streams_per_client = 1;
  BigStep big(options);
  ASSERT_NE(big.server, nullptr);
  auto held_ctx = std::make_unique<grpc::ClientContext>();
  auto held = big.stub->FetchMicrobatches(held_ctx.get(), big.request);
  v1::Microbatch mb;
  ASSERT_TRUE(held->Read(&mb));  // in flight, not finished

  grpc::ClientContext ctx;
  auto refused = big.stub->FetchMicrobatches(&ctx, big.request);
  while (refused->Read(&mb)) {
  }
  const grpc::Status status = refused->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(),
              HasSubstr("client ipv4:127.0.0.1 has 1 FetchMicrobatches streams in flight "
                        "(--max-streams-per-client)"));
  EXPECT_EQ(big.Metric("rollpack_client_streams_refused_total"), 1);

  held_ctx->TryCancel();
  held->Finish();
  grpc::Status again;
  for (int i = 0; i < 200; ++i) {  // the slot frees once the server sees the cancel
    grpc::ClientContext next_ctx;
    auto reader = big.stub->FetchMicrobatches(&next_ctx, big.request);
    int n = 0;
    while (reader->Read(&mb)) ++n;
    again = reader->Finish();
    if (again.ok()) {
      EXPECT_GT(n, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(again.ok()) << again.error_message();
  big.server->Shutdown(absl::Seconds(1));
}

TEST(StreamLimitTest, AStreamWhoseClientStopsReadingEndsAfterTheWriteTimeout) {
  ServerOptions options;
  options.fetch.write_timeout = absl::Seconds(1);
  BigStep big(options);
  ASSERT_NE(big.server, nullptr);
  // A reader that keeps up is never cut, however long the stream lasts.
  {
    grpc::ClientContext ctx;
    auto reader = big.stub->FetchMicrobatches(&ctx, big.request);
    v1::Microbatch mb;
    int n = 0;
    while (reader->Read(&mb)) {
      ++n;
      if (n == 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_GT(n, 1);
  }
  EXPECT_EQ(big.Metric("rollpack_streams_stalled_total"), 0);

  auto small_window = SmallWindowStub(big.server->address());
  grpc::ClientContext ctx;
  auto stalled = small_window->FetchMicrobatches(&ctx, big.request);
  v1::Microbatch mb;
  ASSERT_TRUE(stalled->Read(&mb));
  // Reads nothing more: the server's write waits on the full window.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (big.Metric("rollpack_streams_stalled_total") < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(big.Metric("rollpack_streams_stalled_total"), 1);
  int more = 0;
  while (stalled->Read(&mb)) ++more;  // what was buffered, then the end
  const grpc::Status status = stalled->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  while (big.Metric("rollpack_active_streams") > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(big.Metric("rollpack_active_streams"), 0) << "the stream's slot is back";
  big.server->Shutdown(absl::Seconds(1));
}

// With --stream-buffer-memory spent by streams whose clients do not read,
// other streams wait holding nothing, and go on once the write timeout has
// ended the stalled ones: the bytes held never pass the budget (here 1 byte:
// one micro-batch at a time, the one let through when nothing else is held).
TEST(StreamLimitTest, StreamsThatDoNotReadHoldNoMoreThanTheStreamBuffer) {
  ServerOptions options;
  options.fetch.write_timeout = absl::Seconds(1);
  options.fetch.stream_buffer_bytes = 1;
  BigStep big(options);
  ASSERT_NE(big.server, nullptr);
  auto small_window = SmallWindowStub(big.server->address());
  constexpr int kStalled = 3;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::Microbatch>>> stalled;
  for (int i = 0; i < kStalled; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    stalled.push_back(small_window->FetchMicrobatches(contexts.back().get(), big.request));
  }
  // They never read. The most the streams hold while they wait:
  double most_held = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (big.Metric("rollpack_stream_buffer_waits_total") < kStalled - 1 &&
         absl::Now() < deadline) {
    most_held = std::max(most_held, big.Metric("rollpack_stream_buffer_bytes"));
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(big.Metric("rollpack_stream_buffer_waits_total"), kStalled - 1);

  // A trainer that reads gets its whole rank once the stalled streams ended.
  grpc::ClientContext ctx;
  auto reader = big.stub->FetchMicrobatches(&ctx, big.request);
  v1::Microbatch mb;
  size_t largest = 0;
  int n = 0;
  while (reader->Read(&mb)) {
    largest = std::max(largest, mb.ByteSizeLong());
    ++n;
    most_held = std::max(most_held, big.Metric("rollpack_stream_buffer_bytes"));
  }
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_GT(n, 1);
  EXPECT_GT(most_held, 0);
  EXPECT_LE(most_held, static_cast<double>(largest)) << "one micro-batch at a time";
  EXPECT_EQ(big.Metric("rollpack_streams_stalled_total"), kStalled);
  for (int i = 0; i < kStalled; ++i) {
    while (stalled[i]->Read(&mb)) {
    }
    EXPECT_EQ(stalled[i]->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_EQ(big.Metric("rollpack_stream_buffer_bytes"), 0);
  // A counter: scraping again does not add to it.
  const double waits = big.Metric("rollpack_stream_buffer_waits_total");
  EXPECT_GE(waits, kStalled);
  EXPECT_EQ(big.Metric("rollpack_stream_buffer_waits_total"), waits);
  big.server->Shutdown(absl::Seconds(1));
}

// A stream waiting for the stream buffer ends at once when its client
// cancels (it holds no write that could fail instead).
TEST(StreamLimitTest, AStreamWaitingForTheStreamBufferEndsWhenCancelled) {
  ServerOptions options;
  options.fetch.stream_buffer_bytes = 1;
  BigStep big(options);
  ASSERT_NE(big.server, nullptr);
  auto small_window = SmallWindowStub(big.server->address());
  grpc::ClientContext first_ctx, second_ctx;
  auto first = small_window->FetchMicrobatches(&first_ctx, big.request);
  auto second = small_window->FetchMicrobatches(&second_ctx, big.request);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (big.Metric("rollpack_stream_buffer_waiting_streams") < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(big.Metric("rollpack_stream_buffer_waiting_streams"), 1);
  // One holds the buffer with a write its client does not take (the write
  // timeout is 10 minutes), the other waits: both end when cancelled.
  first_ctx.TryCancel();
  second_ctx.TryCancel();
  EXPECT_EQ(first->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(second->Finish().error_code(), grpc::StatusCode::CANCELLED);
  while (big.Metric("rollpack_active_streams") > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(big.Metric("rollpack_active_streams"), 0) << "the waiting stream ended too";
  EXPECT_EQ(big.Metric("rollpack_stream_buffer_waiting_streams"), 0);
  EXPECT_EQ(big.Metric("rollpack_stream_buffer_bytes"), 0);
  big.server->Shutdown(absl::Seconds(1));
}

TEST(ConnectionTest, IdleConnectionsAreClosedAndClientsReconnect) {
  ServerOptions options;
  options.max_connection_idle = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = MakeChannel((*server)->address());
  RollpackClient client(channel);
  ASSERT_TRUE(client.RegisterModel("p", Model()).ok());
  EXPECT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (channel->GetState(false) == GRPC_CHANNEL_READY && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_NE(channel->GetState(false), GRPC_CHANNEL_READY) << "the server closed it (GOAWAY)";
  EXPECT_TRUE(client.GetPool("p").ok()) << "the next call reconnects";
  (*server)->Shutdown(absl::Seconds(1));
}

TEST(ConnectionTest, NegativeLimitsAreRefusedByFlag) {
  ServerOptions options;
  options.fetch.max_streams_per_client = -1;
  EXPECT_THAT(RollpackServer::Start(options).status().message(),
              HasSubstr("--max-streams-per-client is -1"));
  options = ServerOptions();
  options.fetch.write_timeout = absl::Seconds(-1);
  EXPECT_THAT(RollpackServer::Start(options).status().message(),
              HasSubstr("--stream-write-timeout is -1s"));
  options = ServerOptions();
  options.max_connection_idle = absl::Seconds(-1);
  EXPECT_THAT(RollpackServer::Start(options).status().message(),
              HasSubstr("--max-connection-idle is -1s"));
}

// ------------------------------------------------- what a request may hold

// A GetPool call on its own channel with `body` as the request bytes.
grpc::Status RawGetPool(const std::string& address, const std::string& body,
                        grpc_compression_algorithm compression = GRPC_COMPRESS_NONE) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  args.SetInt("grpc.use_local_subchannel_pool", 1);  // a connection of its own
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  ctx.set_compression_algorithm(compression);
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, "/rollpack.v1.Rollouts/GetPool", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  return status;
}

// A serialized GetPoolRequest of about `bytes` (its pool name is too long:
// the handler refuses it INVALID_ARGUMENT once gRPC hands it over).
std::string LargeGetPool(size_t bytes) {
  v1::GetPoolRequest request;
  request.set_pool(std::string(bytes, 'p'));
  return request.SerializeAsString();
}

TEST(TransportMemoryTest, CompressedRequestsAreRefusedFromTheirHeaders) {
  ServerOptions options;
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  v1::GetPoolRequest small;
  small.set_pool("none");
  grpc::Status gzip = RawGetPool((*server)->address(), small.SerializeAsString(),
                                 GRPC_COMPRESS_GZIP);
  EXPECT_EQ(gzip.error_code(), grpc::StatusCode::UNIMPLEMENTED) << gzip.error_message();
  EXPECT_THAT(gzip.error_message(), HasSubstr("'gzip' is disabled"));
  EXPECT_EQ(RawGetPool((*server)->address(), small.SerializeAsString()).error_code(),
            grpc::StatusCode::NOT_FOUND);
  (*server)->Shutdown(absl::Seconds(1));

  options.accept_compressed_requests = true;
  server = RollpackServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(RawGetPool((*server)->address(), small.SerializeAsString(), GRPC_COMPRESS_GZIP)
                .error_code(),
            grpc::StatusCode::NOT_FOUND);
  (*server)->Shutdown(absl::Seconds(1));
}

// Requests in flight beyond --transport-memory are cancelled by gRPC rather
// than buffered whole; without the quota the same requests all reach the
// handler. The server keeps serving either way.
TEST(TransportMemoryTest, RequestsBeyondTheQuotaAreCancelledNotBuffered) {
  constexpr int kCalls = 12;
  constexpr size_t kRequestBytes = 30 << 20;
  const std::string body = LargeGetPool(kRequestBytes);
  for (const int64_t quota : {int64_t{0}, int64_t{40} << 20}) {
    SCOPED_TRACE(quota);
    ServerOptions options;
    options.max_message_bytes = 32 << 20;
    options.transport_memory_bytes = quota;
    absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    std::vector<grpc::Status> statuses(kCalls);
    std::vector<std::thread> callers;
    for (int i = 0; i < kCalls; ++i) {
      callers.emplace_back([&, i] { statuses[i] = RawGetPool((*server)->address(), body); });
    }
    for (std::thread& t : callers) t.join();
    int handled = 0, cancelled = 0;
    for (const grpc::Status& s : statuses) {
      if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
        ++handled;
      } else if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                 s.error_code() == grpc::StatusCode::UNAVAILABLE) {
        // gRPC resets the stream (ENHANCE_YOUR_CALM) or closes the whole
        // connection (GOAWAY), whichever its reclaimer reaches first.
        ++cancelled;
      } else {
        ADD_FAILURE() << s.error_code() << " " << s.error_message();
      }
    }
    if (quota == 0) {
      EXPECT_EQ(handled, kCalls);
    } else {
      EXPECT_GT(cancelled, 0) << "12 x 30 MB in flight cannot fit in 40 MB";
    }
    v1::GetPoolRequest small;
    small.set_pool("none");
    EXPECT_EQ(RawGetPool((*server)->address(), small.SerializeAsString()).error_code(),
              grpc::StatusCode::NOT_FOUND);
    (*server)->Shutdown(absl::Seconds(1));
  }
}

TEST(TransportMemoryTest, AQuotaBelowTheMessageLimitIsRefused) {
  ServerOptions options;
  options.max_message_bytes = 64 << 20;
  options.transport_memory_bytes = 32 << 20;
  EXPECT_THAT(RollpackServer::Start(options).status().message(),
              HasSubstr("--transport-memory is 33554432: 0 (no quota) or at least "
                        "--max-message-bytes (67108864)"));
  options.transport_memory_bytes = -1;
  EXPECT_EQ(RollpackServer::Start(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rollpack
