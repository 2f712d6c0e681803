// C++ client of rollpackd for producers, controllers and trainers: register
// models, push samples, create and release steps, read plans, report routing
// agreement.
#ifndef ROLLPACK_CLIENT_CPP_CLIENT_H_
#define ROLLPACK_CLIENT_CPP_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "rollpack/v1/rollouts.grpc.pb.h"
#include "rollpack/v1/scheduler.grpc.pb.h"
#include "rollpack/v1/telemetry.grpc.pb.h"
#include "rollpack/v1/trainer.grpc.pb.h"

namespace rollpack {


struct ClientOptions {
  int max_message_bytes = 512 << 20;
  // HTTP/2 stream window this client grants the server, fixed (gRPC's
  // bandwidth-delay probing off): micro-batches of megabytes then arrive
  // without waiting for the window to grow from 64 KiB on each new
  // connection. 0 = gRPC's default auto-tuning. docs/performance.md.
  int stream_window_bytes = 8 << 20;
  // While a call is open, the connection is pinged after this long without
  // a frame from the server, and closed (its calls fail UNAVAILABLE) when a
  // ping is not answered within keepalive_timeout: a frozen or unreachable
  // server is noticed in bounded time, and PutSamples, which waits until
  // gRPC lets go of the samples' bytes, returns. 0 = no pings. rollpackd
  // accepts a ping every 10 s.
  absl::Duration keepalive_time = absl::Seconds(20);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  // Samples are streamed in request messages of about this many bytes.
  int64_t batch_bytes = 8 << 20;
  // ... and at most this many samples (0 = any number): keep it at or under
  // rollpackd's --max-samples-per-message (65536 by default).
  int batch_samples = 65536;
  // PutSamples spreads a call's request messages over up to this many
  // streams, each on a connection of its own (1 to 64; 0 = one per core of
  // this host, at most 4: more streams than cores cost more than they carry);
  // the server commits them in the order sent, as on one stream. One HTTP/2
  // connection carries well under half of what loopback TCP does
  // (docs/performance.md). Only a client made from an address opens the
  // extra connections; one made from a channel uses that channel's one
  // stream.
  int put_streams = 0;
  absl::Duration deadline = absl::Minutes(5);
  // Sent as `authorization: Bearer <auth_token>` when set (rollpackd
  // --auth-tokens; docs/operations.md).
  std::string auth_token;
  // TLS (rollpackd --tls-cert): PEM of the CA to trust; with client_cert_pem
  // and client_key_pem too, mutual TLS. All empty (and tls false) =
  // plaintext.
  std::string tls_root_certs_pem;
  std::string tls_client_cert_pem;
  std::string tls_client_key_pem;
  // Overrides the name checked against the server certificate.
  std::string tls_server_name;
  // TLS even without tls_root_certs_pem: the server certificate is checked
  // against gRPC's default roots (a publicly signed certificate).
  bool tls = false;
};

// options.put_streams with 0 resolved (one per core, at most 4), in [1, 64].
int ResolvedPutStreams(const ClientOptions& options);

// The channel arguments MakeChannel uses (message limits, stream window);
// for callers that add arguments of their own.
grpc::ChannelArguments BulkChannelArguments(const ClientOptions& options = {});

// A channel to rollpackd with the limits raised for large payloads; TLS when
// options.tls, tls_root_certs_pem or tls_client_cert_pem is set.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const ClientOptions& options = {});
// The same, on a TCP connection of its own: gRPC shares one connection
// between channels of equal arguments, and this one's arguments are unique
// in the process.
std::shared_ptr<grpc::Channel> MakeDistinctChannel(const std::string& address,
                                                   const ClientOptions& options = {});

class RollpackClient {
 public:
  // A client on the caller's channel: PutSamples sends one stream.
  explicit RollpackClient(std::shared_ptr<grpc::Channel> channel, ClientOptions options = {});
  // A client on connections of its own to `address` (MakeDistinctChannel):
  // PutSamples may stripe over options.put_streams of them.
  explicit RollpackClient(const std::string& address, ClientOptions options = {});

  // OK(true) when created, OK(false) when the pool already had this model.
  absl::StatusOr<bool> RegisterModel(const std::string& pool, const v1::ModelSpec& model);
  // With the pool's lifecycle options (docs/lifecycle.md).
  absl::StatusOr<v1::RegisterModelResponse> RegisterModel(const v1::RegisterModelRequest& request);
  // Streams the samples in messages of about batch_bytes, over up to
  // put_streams connections; the server commits each message all or
  // nothing, in the order of `samples`. On a refusal, the messages before
  // the refused one stay committed and no later one is; re-sending the whole
  // call is safe (identical samples are no-ops).
  absl::StatusOr<v1::PutSamplesResponse> PutSamples(const std::string& pool,
                                                    absl::Span<const v1::Sample> samples);
  absl::StatusOr<v1::PoolInfo> GetPool(const std::string& pool);
  // Adds scalars (a reward, ...) to stored samples that are in no live step
  // (Rollouts.AnnotateSamples, lifecycle.md section 6), all or nothing:
  // returns the number of entries accepted, no-op entries (a scalar set
  // again to its value) included. Not retried here; re-sending the same
  // request is safe (its entries are then no-ops).
  absl::StatusOr<int32_t> AnnotateSamples(const std::string& pool,
                                          absl::Span<const v1::SampleAnnotation> annotations);
  // The request as given: CreateStepRequest.advantage, advantage_scalar and
  // advantage_eps (lifecycle.md section 6) travel with the rest.
  absl::StatusOr<v1::StepInfo> CreateStep(const v1::CreateStepRequest& request);
  absl::StatusOr<v1::Plan> GetPlan(const std::string& step_id);
  absl::StatusOr<v1::ReleaseStepResponse> ReleaseStep(const std::string& step_id);
  // The live steps of `pool` ("" = every pool) and every pool: what a
  // controller finds after a restart (docs/operations.md, "Controller").
  absl::StatusOr<v1::ListStepsResponse> ListSteps(const std::string& pool = "");
  absl::StatusOr<v1::ListPoolsResponse> ListPools();
  // Records the trainer's policy version (docs/lifecycle.md).
  absl::StatusOr<v1::PoolInfo> SetPolicyVersion(const std::string& pool, int64_t policy_version);
  // Adds one rank's routing agreement counts to the server's metrics
  // (Telemetry.ReportRoutingAgreement); returns the step's totals so far.
  // Not retried: a re-sent report would count twice.
  absl::StatusOr<v1::RoutingAgreementAck> ReportRoutingAgreement(
      const v1::RoutingAgreementReport& report);

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  absl::StatusOr<v1::PutSamplesResponse> PutSamplesStriped(
      const std::string& pool, absl::Span<const v1::Sample> samples,
      const std::vector<size_t>& message_starts, int streams);

  std::shared_ptr<grpc::Channel> channel_;
  ClientOptions options_;
  std::unique_ptr<v1::Rollouts::Stub> rollouts_;
  std::unique_ptr<v1::Scheduler::Stub> scheduler_;
  std::unique_ptr<v1::Telemetry::Stub> telemetry_;
  // channel_ and, for a client made from an address, put_streams - 1 more
  // connections for PutSamples.
  std::vector<std::shared_ptr<grpc::Channel>> put_channels_;
};

// grpc::Status -> absl::Status (the codes are shared).
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_CPP_CLIENT_H_
