#include "server/trainer_service.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "server/microbatch_builder.h"

namespace rollpack {
namespace {

// Builds one micro-batch at a time, the next only once the previous was
// handed to the transport, so a slow trainer holds one message, not a step.
class FetchReactor final : public grpc::ServerWriteReactor<v1::Microbatch> {
 public:
  // `active` was already incremented for this stream; OnDone decrements it.
  FetchReactor(std::shared_ptr<const Step> step, const v1::FetchRequest& request,
               ServerMetrics* metrics, std::atomic<int>* active)
      : step_(std::move(step)),
        next_(request.start_index()),
        all_fields_(request.all_fields()),
        metrics_(metrics),
        active_(active) {
    if (metrics_ != nullptr) metrics_->OnStreamStart(request.start_index() > 0);
    coords_ = {request.rank().dp(), request.rank().cp(), request.rank().tp(), request.rank().pp()};
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream closed by the client"));
      return;
    }
    if (metrics_ != nullptr) metrics_->OnMicrobatchSent(static_cast<int64_t>(written_bytes_));
    WriteNext();
  }

  void OnDone() override {
    active_->fetch_sub(1);
    if (metrics_ != nullptr) metrics_->OnStreamEnd();
    delete this;
  }

 private:
  void WriteNext() {
    if (next_ >= step_->layout.num_microbatches()) {
      Finish(grpc::Status::OK);
      return;
    }
    absl::Status s = BuildMicrobatch(*step_, {coords_, next_, all_fields_}, &scratch_, &message_);
    if (!s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    ++next_;
    written_bytes_ = message_.ByteSizeLong();
    StartWrite(&message_);
  }

  const std::shared_ptr<const Step> step_;
  RankCoords coords_;
  int next_;
  const bool all_fields_;
  ServerMetrics* const metrics_;
  std::atomic<int>* const active_;
  size_t written_bytes_ = 0;
  RankMicrobatchLayout scratch_;
  v1::Microbatch message_;
};

class FailedFetch final : public grpc::ServerWriteReactor<v1::Microbatch> {
 public:
  explicit FailedFetch(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  explicit FailedFetch(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<v1::Microbatch>* TrainerService::FetchMicrobatches(
    grpc::CallbackServerContext* context, const v1::FetchRequest* request) {
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Trainer/FetchMicrobatches");
        !s.ok()) {
      return new FailedFetch(s);
    }
  }
  absl::StatusOr<std::shared_ptr<const Step>> step = store_->GetStep(request->step_id());
  if (!step.ok()) return new FailedFetch(step.status());
  const RankCoords coords{request->rank().dp(), request->rank().cp(), request->rank().tp(),
                          request->rank().pp()};
  if (absl::Status s = (*step)->layout.ValidateCoords(coords); !s.ok()) {
    return new FailedFetch(s);
  }
  const int num = (*step)->layout.num_microbatches();
  if (request->start_index() < 0 || request->start_index() > num) {
    return new FailedFetch(absl::OutOfRangeError(absl::StrCat(
        "start_index ", request->start_index(), " is outside [0, ", num, "] for step \"",
        request->step_id(), "\"")));
  }
  const int active = active_streams_.fetch_add(1) + 1;
  if (max_concurrent_streams_ > 0 && active > max_concurrent_streams_) {
    active_streams_.fetch_sub(1);
    if (metrics_ != nullptr) metrics_->OnStreamRefused();
    return new FailedFetch(absl::ResourceExhaustedError(absl::StrCat(
        max_concurrent_streams_, " FetchMicrobatches streams are in flight "
        "(--max-concurrent-streams); retry later")));
  }
  return new FetchReactor(*std::move(step), *request, metrics_, &active_streams_);
}

}  // namespace rollpack
