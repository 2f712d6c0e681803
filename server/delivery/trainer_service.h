// gRPC adapter of delivery: stream one rank's micro-batches of a step.
#ifndef ROLLPACK_SERVER_DELIVERY_TRAINER_SERVICE_H_
#define ROLLPACK_SERVER_DELIVERY_TRAINER_SERVICE_H_

#include <atomic>
#include <memory>
#include <optional>

#include "base/worker_pool.h"
#include "grpcpp/support/byte_buffer.h"
#include "rollpack/v1/trainer.grpc.pb.h"
#include "server/delivery/client_stream_quota.h"
#include "server/delivery/fetch_options.h"
#include "server/delivery/first_delivery_gate.h"
#include "server/delivery/send_budget.h"
#include "server/ops/auth.h"
#include "server/ops/server_metrics.h"
#include "server/store/step_activity.h"
#include "server/store/step_directory.h"

namespace rollpack {

// FetchMicrobatches is served raw: each micro-batch is encoded straight into
// the grpc::ByteBuffer that goes on the wire (server/delivery/microbatch_encoder.h)
// instead of being built as a message and serialized again.
class TrainerService final
    : public v1::Trainer::WithRawCallbackMethod_FetchMicrobatches<
          v1::Trainer::WithRawCallbackMethod_FetchPieces<v1::Trainer::CallbackService>> {
 public:
  // `metrics`, `auth` and `activity` may be null (no metrics, no auth, no
  // stream counts per step).
  explicit TrainerService(StepDirectory* steps, ServerMetrics* metrics = nullptr,
                          const Authorizer* auth = nullptr, FetchOptions options = {},
                          StepActivity* activity = nullptr)
      : steps_(steps),
        metrics_(metrics),
        auth_(auth),
        activity_(activity),
        options_(options),
        pulls_(steps->MayBlock() ? std::make_unique<WorkerPool>(kPullThreads) : nullptr),
        routing_calls_(steps->MayBlock() ? std::make_unique<WorkerPool>(kRoutingCallThreads)
                                         : nullptr) {}

  int active_streams() const { return active_streams_.load(); }
  // Micro-batch bytes the streams hold (FetchOptions::stream_buffer_bytes).
  const SendBudget& send_budget() const { return send_budget_; }

  // `request` is a serialized v1::FetchRequest; each write a v1::Microbatch.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchMicrobatches(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  // `request` is a serialized v1::PieceRequest; each write a v1::Microbatch
  // piece (trainer.proto, PieceRows). Same limits and metrics as
  // FetchMicrobatches; never pulls from other members.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* FetchPieces(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  // R2 (docs/layout.md section 11), in routing_upload.cc.
  grpc::ServerUnaryReactor* UploadRouting(grpc::CallbackServerContext* context,
                                          const v1::RecordedRouting* request,
                                          v1::UploadRoutingResponse* response) override;
  grpc::ServerUnaryReactor* CommitRouting(grpc::CallbackServerContext* context,
                                          const v1::CommitRoutingRequest* request,
                                          v1::CommitRoutingResponse* response) override;

 private:
  // Admits the stream and starts it; `piece_header` set: a FetchPieces
  // stream (with headers or not).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* StartStream(grpc::CallbackServerContext* context,
                                                         const v1::FetchRequest& request,
                                                         std::optional<bool> piece_header);

  StepDirectory* const steps_;
  ServerMetrics* const metrics_;
  const Authorizer* const auth_;
  StepActivity* const activity_;
  const FetchOptions options_;
  // Streams whose step lookup may wait on other members (cluster mode):
  // at most this many such lookups run at once, the rest queue.
  static constexpr int kPullThreads = 16;
  // Streams queued for a lookup past which new ones are refused
  // (RESOURCE_EXHAUSTED, retryable): each queued one is an admitted stream.
  static constexpr int kMaxQueuedLookups = 1024;
  std::unique_ptr<WorkerPool> pulls_;
  // R2 calls of a directory that may block (a cluster member) run on a pool
  // of their own, at most kMaxQueuedRoutingCalls waiting.
  static constexpr int kRoutingCallThreads = 8;
  static constexpr int kMaxQueuedRoutingCalls = 256;
  std::unique_ptr<WorkerPool> routing_calls_;
  // Runs an R2 call's work here, or on routing_calls_ (RESOURCE_EXHAUSTED
  // when too many wait; CANCELLED when the caller left while queued).
  void RunRoutingCall(grpc::CallbackServerContext* context, grpc::ServerUnaryReactor* reactor,
                      absl::AnyInvocable<void() &&> call);
  FirstDeliveryGate first_delivery_;
  std::atomic<int64_t> next_stream_id_{1};
  std::atomic<int> active_streams_{0};
  ClientStreamQuota client_quota_{options_.max_streams_per_client};
  SendBudget send_budget_{options_.stream_buffer_bytes};
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_DELIVERY_TRAINER_SERVICE_H_
