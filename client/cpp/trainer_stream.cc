#include "client/cpp/trainer_stream.h"

#include <utility>

#include "client/cpp/client.h"

namespace rollpack {

TrainerStream::TrainerStream(std::shared_ptr<grpc::Channel> channel, std::string step_id,
                             v1::RankCoords rank, TrainerStreamOptions options)
    : step_id_(std::move(step_id)),
      rank_(rank),
      options_(options),
      stub_(v1::Trainer::NewStub(channel)) {
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
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](TrainerStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
        return !s->queue_.empty() || s->finished_;
      },
      this));
  if (!queue_.empty()) {
    v1::Microbatch next = std::move(queue_.front());
    queue_.pop_front();
    return std::optional<v1::Microbatch>(std::move(next));
  }
  if (!error_.ok()) return error_;
  return std::optional<v1::Microbatch>();
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
    std::unique_ptr<grpc::ClientReader<v1::Microbatch>> reader =
        stub_->FetchMicrobatches(&context, request);
    v1::Microbatch message;
    while (reader->Read(&message)) {
      next_index = message.index() + 1;
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
      queue_.push_back(std::move(message));
    }
    grpc::Status status = reader->Finish();
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
