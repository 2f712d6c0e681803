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
// (server/commit_sequencer.h).
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

// A fresh id for each striped call: random, so two producers never collide.
std::string NewCallId() {
  static constexpr char kDigits[] = "0123456789abcdef";
  thread_local std::mt19937_64 random(std::random_device{}());
  std::string id(32, '0');
  for (char& c : id) c = kDigits[random() % 16];
  return id;
}

// Where each request message starts in `samples` (and, last, the end):
// messages of about `batch_bytes`, at least one sample each.
std::vector<size_t> MessageStarts(absl::Span<const v1::Sample> samples, int64_t batch_bytes) {
  std::vector<size_t> starts = {0};
  int64_t bytes = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const int64_t size = static_cast<int64_t>(samples[i].ByteSizeLong());
    if (i > starts.back() && bytes + size > batch_bytes) {
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
  return args;
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
      put_channels_{channel_},
      encode_buffers_(EncodeBufferPool::Create()) {}

RollpackClient::RollpackClient(const std::string& address, ClientOptions options)
    : RollpackClient(MakeDistinctChannel(address, options), options) {
  const int streams = std::clamp(options.put_streams, 1, 64);
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

absl::StatusOr<v1::PutSamplesResponse> RollpackClient::PutSamples(
    const std::string& pool, absl::Span<const v1::Sample> samples) {
  const std::vector<size_t> starts = MessageStarts(samples, options_.batch_bytes);
  const int messages = static_cast<int>(starts.size()) - 1;
  const int streams = std::min<int>(static_cast<int>(put_channels_.size()), messages);
  if (streams > 1) return PutSamplesStriped(pool, samples, starts, streams);
  PutSamplesStream stream(channel_, NewContext());
  // The next message is encoded while this one is sent. A refused message
  // ends the call: Finish says why.
  for (int m = 0; m < messages; ++m) {
    absl::StatusOr<grpc::ByteBuffer> message = EncodePutSamplesRequest(
        pool, samples.subspan(starts[m], starts[m + 1] - starts[m]), encode_buffers_.get());
    // Messages sent so far stay committed, as with any refusal.
    if (!message.ok()) return message.status();
    if (!stream.Write(*std::move(message))) break;
  }
  v1::PutSamplesResponse response;
  grpc::Status status = stream.Finish(&response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

// Message m goes on stream m % streams, each stream fed by a thread of its
// own (encoding is a copy of every byte: one thread would limit them all).
// The server commits the messages in order across the streams; a stream
// that stops early (a refusal, or a failure here) makes it commit nothing
// after its next missing message.
absl::StatusOr<v1::PutSamplesResponse> RollpackClient::PutSamplesStriped(
    const std::string& pool, absl::Span<const v1::Sample> samples,
    const std::vector<size_t>& message_starts, int streams) {
  const int messages = static_cast<int>(message_starts.size()) - 1;
  const std::string call_id = NewCallId();
  std::atomic<bool> failed{false};
  std::vector<absl::Status> statuses(streams);
  std::vector<v1::PutSamplesResponse> responses(streams);
  const auto run = [&](int s) {
    std::unique_ptr<grpc::ClientContext> context = NewContext();
    context->AddMetadata(kStripeMetadataKey, absl::StrCat(call_id, "/", s, "/", streams));
    PutSamplesStream stream(put_channels_[s], std::move(context));
    for (int m = s; m < messages && !failed.load(std::memory_order_relaxed); m += streams) {
      absl::StatusOr<grpc::ByteBuffer> message = EncodePutSamplesRequest(
          pool,
          samples.subspan(message_starts[m], message_starts[m + 1] - message_starts[m]),
          encode_buffers_.get());
      if (!message.ok()) {
        statuses[s] = message.status();
        failed = true;
        break;
      }
      if (!stream.Write(*std::move(message))) break;
    }
    grpc::Status status = stream.Finish(&responses[s]);
    if (!status.ok()) {
      failed = true;
      if (statuses[s].ok()) statuses[s] = FromGrpcStatus(status);
    }
  };
  std::vector<std::thread> threads;
  for (int s = 1; s < streams; ++s) threads.emplace_back(run, s);
  run(0);
  for (std::thread& t : threads) t.join();
  // The cause, not the ABORTED of the streams that stopped because of it.
  const absl::Status* cause = nullptr;
  for (const absl::Status& status : statuses) {
    if (status.ok()) continue;
    if (cause == nullptr || (cause->code() == absl::StatusCode::kAborted &&
                             status.code() != absl::StatusCode::kAborted)) {
      cause = &status;
    }
  }
  if (cause != nullptr) return *cause;
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

absl::StatusOr<v1::RoutingAgreementAck> RollpackClient::ReportRoutingAgreement(
    const v1::RoutingAgreementReport& report) {
  v1::RoutingAgreementAck response;
  auto context = NewContext();
  grpc::Status status = telemetry_->ReportRoutingAgreement(context.get(), report, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

}  // namespace rollpack
