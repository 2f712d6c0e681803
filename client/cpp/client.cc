#include "client/cpp/client.h"

#include "client/cpp/put_samples_stream.h"

#include "grpc/grpc.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace rollpack {

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
  grpc::ChannelArguments args = BulkChannelArguments(options);
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

RollpackClient::RollpackClient(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : channel_(std::move(channel)),
      options_(options),
      rollouts_(v1::Rollouts::NewStub(channel_)),
      scheduler_(v1::Scheduler::NewStub(channel_)),
      telemetry_(v1::Telemetry::NewStub(channel_)),
      encode_buffers_(EncodeBufferPool::Create()) {}

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
  PutSamplesStream stream(channel_, NewContext());
  // Each message holds samples[begin, end); the next one is encoded while
  // this one is sent. A refused message ends the call: Finish says why.
  size_t begin = 0;
  int64_t bytes = 0;
  bool open = true;
  for (size_t end = 0; open && end <= samples.size(); ++end) {
    const int64_t size =
        end < samples.size() ? static_cast<int64_t>(samples[end].ByteSizeLong()) : 0;
    const bool last = end == samples.size();
    if (end > begin && (last || bytes + size > options_.batch_bytes)) {
      absl::StatusOr<grpc::ByteBuffer> message = EncodePutSamplesRequest(
          pool, samples.subspan(begin, end - begin), encode_buffers_.get());
      // Messages sent so far stay committed, as with any refusal.
      if (!message.ok()) return message.status();
      open = stream.Write(*std::move(message));
      begin = end;
      bytes = 0;
    }
    bytes += size;
  }
  v1::PutSamplesResponse response;
  grpc::Status status = stream.Finish(&response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
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
