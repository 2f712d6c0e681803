#include "client/cpp/trainer_stream.h"

#include <utility>

#include "base/status_macros.h"
#include "client/cpp/client.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"

namespace rollpack {
namespace {

constexpr char kFetchMethod[] = "/rollpack.v1.Trainer/FetchMicrobatches";

}  // namespace

TrainerStream::TrainerStream(std::shared_ptr<grpc::Channel> channel, std::string step_id,
                             v1::RankCoords rank, TrainerStreamOptions options)
    : step_id_(std::move(step_id)),
      rank_(rank),
      options_(options),
      channel_(std::move(channel)) {
  reader_ = std::thread([this] { ReadLoop(); });
}

TrainerStream::~TrainerStream() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  reader_.join();
}

void TrainerStream::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

int TrainerStream::resumes() const {
  absl::MutexLock lock(&mu_);
  return resumes_;
}

absl::StatusOr<std::optional<v1::Microbatch>> TrainerStream::Next() {
  ASSIGN_OR_RETURN(std::optional<ReceivedMicrobatch> next, NextReceived());
  if (!next.has_value()) return std::optional<v1::Microbatch>();
  return std::optional<v1::Microbatch>(next->ToMessage());
}

absl::StatusOr<std::optional<ReceivedMicrobatch>> TrainerStream::NextReceived() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](TrainerStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
        return !s->queue_.empty() || s->finished_;
      },
      this));
  if (!queue_.empty()) {
    ReceivedMicrobatch next = std::move(queue_.front());
    queue_.pop_front();
    return std::optional<ReceivedMicrobatch>(std::move(next));
  }
  if (!error_.ok()) return error_;
  return std::optional<ReceivedMicrobatch>();
}

void TrainerStream::ReadLoop() {
  int next_index = options_.start_index;
  int attempts = 0;
  absl::Status final_status;
  while (true) {
    grpc::ClientContext context;
    if (!options_.auth_token.empty()) {
      context.AddMetadata("authorization", "Bearer " + options_.auth_token);
    }
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) break;
      context_ = &context;
    }
    v1::FetchRequest request;
    request.set_step_id(step_id_);
    *request.mutable_rank() = rank_;
    request.set_start_index(next_index);
    request.set_all_fields(options_.all_fields);
    // The generated stub's call, with each response left as received.
    const grpc::internal::RpcMethod method(kFetchMethod,
                                           grpc::internal::RpcMethod::SERVER_STREAMING, channel_);
    std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
        grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel_.get(), method,
                                                                      &context, request));
    grpc::ByteBuffer received;
    absl::Status parse_error;
    while (reader->Read(&received)) {
      absl::StatusOr<ReceivedMicrobatch> message = ReceivedMicrobatch::Parse(received);
      received.Clear();
      if (!message.ok()) {
        // What the generated reader does with a message that does not
        // parse: end the call; it resumes below like any INTERNAL error.
        parse_error = message.status();
        context.TryCancel();
        break;
      }
      next_index = message->meta().index() + 1;
      attempts = 0;
      absl::MutexLock lock(&mu_);
      // Back-pressure: wait for room before taking the next message.
      mu_.Await(absl::Condition(
          +[](TrainerStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return s->cancelled_ ||
                   static_cast<int>(s->queue_.size()) < s->options_.prefetch;
          },
          this));
      if (cancelled_) break;
      queue_.push_back(*std::move(message));
    }
    grpc::Status status = reader->Finish();
    if (!parse_error.ok()) {
      status = grpc::Status(grpc::StatusCode::INTERNAL, parse_error.ToString());
    }
    {
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
      if (cancelled_) break;
    }
    const bool transient = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::INTERNAL ||
                           status.error_code() == grpc::StatusCode::UNKNOWN;
    if (status.ok() || !transient || attempts >= options_.max_resumes) {
      final_status = FromGrpcStatus(status);
      break;
    }
    ++attempts;
    absl::MutexLock lock(&mu_);
    ++resumes_;
  }
  absl::MutexLock lock(&mu_);
  error_ = final_status;
  if (cancelled_ && error_.ok()) error_ = absl::CancelledError("trainer stream cancelled");
  finished_ = true;
}

}  // namespace rollpack
