#include "client/cpp/client.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/cpp/put_samples_stream.h"
#include "grpc/grpc.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace rollpack {
namespace {

// The metadata that makes a stream one of a striped PutSamples call
// (server/ingest/commit_sequencer.h).
constexpr char kStripeMetadataKey[] = "rollpack-stripe";

std::shared_ptr<grpc::Channel> NewChannel(const std::string& address, const ClientOptions& options,
                                          grpc::ChannelArguments args) {
  if (!options.tls && options.tls_root_certs_pem.empty() && options.tls_client_cert_pem.empty()) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = options.tls_root_certs_pem;
  ssl.pem_cert_chain = options.tls_client_cert_pem;
  ssl.pem_private_key = options.tls_client_key_pem;
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

// A fresh id for each striped call: 128 bits from the OS, drawn per call, so
// that neither two producers nor a forked one ever send the same id.
std::string NewCallId() {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::random_device entropy;
  std::string id;
  for (int word = 0; word < 4; ++word) {
    uint32_t bits = entropy();
    for (int digit = 0; digit < 8; ++digit, bits >>= 4) id.push_back(kDigits[bits & 15]);
  }
  return id;
}

// Which failure of a striped call's streams says why it failed: a stream's
// own error before the ABORTED of the streams the server stopped because of
// it, and those before the CANCELLED of the streams this client stopped.
int CauseRank(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return 0;
    case absl::StatusCode::kCancelled: return 1;
    case absl::StatusCode::kAborted: return 2;
    default: return 3;
  }
}

// Where each request message starts in `samples` (and, last, the end):
// messages of about `batch_bytes` and at most `batch_samples` samples (0 =
// any number), at least one sample each.
std::vector<size_t> MessageStarts(absl::Span<const v1::Sample> samples, int64_t batch_bytes,
                                  int batch_samples) {
  std::vector<size_t> starts = {0};
  int64_t bytes = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const int64_t size = static_cast<int64_t>(samples[i].ByteSizeLong());
    const bool full = batch_samples > 0 && i - starts.back() >= static_cast<size_t>(batch_samples);
    if (i > starts.back() && (bytes + size > batch_bytes || full)) {
      starts.push_back(i);
      bytes = 0;
    }
    bytes += size;
  }
  if (!samples.empty()) starts.push_back(samples.size());
  return starts;
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

grpc::ChannelArguments BulkChannelArguments(const ClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  if (options.stream_window_bytes > 0) {
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, options.stream_window_bytes);
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  }
  if (options.keepalive_time > absl::ZeroDuration()) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
                static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
  }
  // gRPC's reconnection backoff (1 s growing to 120 s) spaces the
  // connection attempts a waiting call gets (a trainer stream waiting to
  // resume, trainer_stream.cc): capped, a client that waited out a long
  // restart finds the server within about a second of its return, not
  // minutes. A refused connection a second per channel costs a down server
  // nothing.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

int ResolvedPutStreams(const ClientOptions& options) {
  if (options.put_streams > 0) return std::min(options.put_streams, 64);
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores, 1, 4);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ClientOptions& options) {
  return NewChannel(address, options, BulkChannelArguments(options));
}

std::shared_ptr<grpc::Channel> MakeDistinctChannel(const std::string& address,
                                                   const ClientOptions& options) {
  static std::atomic<int> next_connection{0};
  grpc::ChannelArguments args = BulkChannelArguments(options);
  args.SetInt("rollpack.connection", next_connection++);
  return NewChannel(address, options, args);
}

RollpackClient::RollpackClient(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : channel_(std::move(channel)),
      options_(options),
      rollouts_(v1::Rollouts::NewStub(channel_)),
      scheduler_(v1::Scheduler::NewStub(channel_)),
      telemetry_(v1::Telemetry::NewStub(channel_)),
      put_channels_{channel_} {}

RollpackClient::RollpackClient(const std::string& address, ClientOptions options)
    : RollpackClient(MakeDistinctChannel(address, options), options) {
  const int streams = ResolvedPutStreams(options);
  for (int i = 1; i < streams; ++i) put_channels_.push_back(MakeDistinctChannel(address, options));
}

std::unique_ptr<grpc::ClientContext> RollpackClient::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
  if (!options_.auth_token.empty()) {
    context->AddMetadata("authorization", "Bearer " + options_.auth_token);
  }
  return context;
}

absl::StatusOr<bool> RollpackClient::RegisterModel(const std::string& pool,
                                                   const v1::ModelSpec& model) {
  v1::RegisterModelRequest request;
  request.set_pool(pool);
  *request.mutable_model() = model;
  v1::RegisterModelResponse response;
  auto context = NewContext();
  grpc::Status status = rollouts_->RegisterModel(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.created();
}

absl::StatusOr<v1::RegisterModelResponse> RollpackClient::RegisterModel(
    const v1::RegisterModelRequest& request) {
  v1::RegisterModelResponse response;
  auto context = NewContext();
  grpc::Status status = rollouts_->RegisterModel(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::PutSamplesResponse> RollpackClient::PutSamples(
    const std::string& pool, absl::Span<const v1::Sample> samples) {
  const std::vector<size_t> starts = MessageStarts(samples, options_.batch_bytes, options_.batch_samples);
  const int messages = static_cast<int>(starts.size()) - 1;
  const int streams = std::min<int>(static_cast<int>(put_channels_.size()), messages);
  if (streams > 1) return PutSamplesStriped(pool, samples, starts, streams);
  // The messages point into `samples` (no copy of the payload): declared
  // first, so that it waits for gRPC to let go of them before the call
  // returns to a caller who may free the samples.
  BorrowedSlices borrowed;
  PutSamplesStream stream(channel_, NewContext());
  // The next message is encoded while this one is sent. A refused message
  // ends the call: Finish says why.
  absl::Status encoded;
  for (int m = 0; m < messages; ++m) {
    absl::StatusOr<grpc::ByteBuffer> message = EncodePutSamplesRequestBorrowing(
        pool, samples.subspan(starts[m], starts[m + 1] - starts[m]), &borrowed);
    if (!message.ok()) {
      encoded = message.status();
      break;
    }
    if (!stream.Write(*std::move(message))) break;
  }
  // Half-closed even when a message did not encode: the messages before it
  // are committed, and only those.
  v1::PutSamplesResponse response;
  grpc::Status status = stream.Finish(&response);
  if (!status.ok()) return FromGrpcStatus(status);
  if (!encoded.ok()) return encoded;
  return response;
}

// Message m goes on stream m % streams, each stream fed by a thread of its
// own: Write blocks until the stream's previous message is handed to the
// transport, and no stream should wait on another's.
// The server commits the messages in order across the streams.
// - A message that does not encode: no stream sends it or any later one, and
//   every stream half-closes, so exactly the messages before it are
//   committed, as on one stream.
// - A stream the server refused or aborted: the server stops the others.
// - Any other failure of a stream (it could not connect, it timed out): the
//   others are cancelled, since the server would wait for its messages.
absl::StatusOr<v1::PutSamplesResponse> RollpackClient::PutSamplesStriped(
    const std::string& pool, absl::Span<const v1::Sample> samples,
    const std::vector<size_t>& message_starts, int streams) {
  const int messages = static_cast<int>(message_starts.size()) - 1;
  const std::string call_id = NewCallId();
  // Messages from here on are not sent: the first that did not encode, or 0
  // once a stream has failed on its own.
  std::atomic<int64_t> send_below{messages};
  std::atomic<bool> cancelling{false};
  BorrowedSlices borrowed;  // outlives the streams: see PutSamples
  std::vector<std::unique_ptr<PutSamplesStream>> calls;
  for (int s = 0; s < streams; ++s) {
    std::unique_ptr<grpc::ClientContext> context = NewContext();
    context->AddMetadata(kStripeMetadataKey, absl::StrCat(call_id, "/", s, "/", streams));
    calls.push_back(std::make_unique<PutSamplesStream>(put_channels_[s], std::move(context)));
  }
  std::vector<absl::Status> statuses(streams);
  std::vector<v1::PutSamplesResponse> responses(streams);
  const auto run = [&](int s) {
    PutSamplesStream& stream = *calls[s];
    for (int m = s; m < send_below.load(std::memory_order_relaxed); m += streams) {
      absl::StatusOr<grpc::ByteBuffer> message = EncodePutSamplesRequestBorrowing(
          pool,
          samples.subspan(message_starts[m], message_starts[m + 1] - message_starts[m]),
          &borrowed);
      if (!message.ok()) {
        int64_t below = send_below.load();
        while (m < below && !send_below.compare_exchange_weak(below, m)) {
        }
        statuses[s] = message.status();
        break;
      }
      if (!stream.Write(*std::move(message))) break;
    }
    const grpc::Status status = stream.Finish(&responses[s]);
    if (status.ok()) return;
    const absl::Status failure = FromGrpcStatus(status);
    if (statuses[s].ok()) statuses[s] = failure;
    // ABORTED is the server stopping this stream for the call's sake: it
    // stops the others itself. (After a message that did not encode, it
    // aborts a stream that sent a later one, and the others must still send
    // theirs before it.) CANCELLED after we cancelled is our own doing.
    if (failure.code() != absl::StatusCode::kAborted && !cancelling.exchange(true)) {
      send_below = 0;
      for (auto& other : calls) other->Cancel();
    }
  };
  std::vector<std::thread> threads;
  for (int s = 1; s < streams; ++s) threads.emplace_back(run, s);
  run(0);
  for (std::thread& t : threads) t.join();
  const absl::Status* cause = &statuses[0];
  for (const absl::Status& status : statuses) {
    if (CauseRank(status) > CauseRank(*cause)) cause = &status;
  }
  if (!cause->ok()) return *cause;
  v1::PutSamplesResponse total;
  for (const v1::PutSamplesResponse& r : responses) {
    total.set_accepted(total.accepted() + r.accepted());
    total.set_duplicates(total.duplicates() + r.duplicates());
    total.set_stored_bytes(total.stored_bytes() + r.stored_bytes());
  }
  return total;
}

absl::StatusOr<v1::PoolInfo> RollpackClient::GetPool(const std::string& pool) {
  v1::GetPoolRequest request;
  request.set_pool(pool);
  v1::PoolInfo response;
  auto context = NewContext();
  grpc::Status status = rollouts_->GetPool(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<int32_t> RollpackClient::AnnotateSamples(
    const std::string& pool, absl::Span<const v1::SampleAnnotation> annotations) {
  v1::AnnotateSamplesRequest request;
  request.set_pool(pool);
  request.mutable_annotations()->Reserve(static_cast<int>(annotations.size()));
  for (const v1::SampleAnnotation& a : annotations) *request.add_annotations() = a;
  v1::AnnotateSamplesResponse response;
  auto context = NewContext();
  grpc::Status status = rollouts_->AnnotateSamples(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.annotated();
}

absl::StatusOr<v1::StepInfo> RollpackClient::CreateStep(const v1::CreateStepRequest& request) {
  v1::StepInfo response;
  auto context = NewContext();
  grpc::Status status = scheduler_->CreateStep(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::Plan> RollpackClient::GetPlan(const std::string& step_id) {
  v1::GetPlanRequest request;
  request.set_step_id(step_id);
  v1::Plan response;
  auto context = NewContext();
  grpc::Status status = scheduler_->GetPlan(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::ReleaseStepResponse> RollpackClient::ReleaseStep(const std::string& step_id) {
  v1::ReleaseStepRequest request;
  request.set_step_id(step_id);
  v1::ReleaseStepResponse response;
  auto context = NewContext();
  grpc::Status status = scheduler_->ReleaseStep(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::ListStepsResponse> RollpackClient::ListSteps(const std::string& pool) {
  v1::ListStepsRequest request;
  request.set_pool(pool);
  v1::ListStepsResponse response;
  auto context = NewContext();
  grpc::Status status = scheduler_->ListSteps(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::ListPoolsResponse> RollpackClient::ListPools() {
  v1::ListPoolsResponse response;
  auto context = NewContext();
  grpc::Status status = rollouts_->ListPools(context.get(), v1::ListPoolsRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::PoolInfo> RollpackClient::SetPolicyVersion(const std::string& pool,
                                                             int64_t policy_version) {
  v1::SetPolicyVersionRequest request;
  request.set_pool(pool);
  request.set_policy_version(policy_version);
  v1::PoolInfo response;
  auto context = NewContext();
  grpc::Status status = scheduler_->SetPolicyVersion(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::RoutingAgreementAck> RollpackClient::ReportRoutingAgreement(
    const v1::RoutingAgreementReport& report) {
  v1::RoutingAgreementAck response;
  auto context = NewContext();
  grpc::Status status = telemetry_->ReportRoutingAgreement(context.get(), report, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

}  // namespace rollpack
