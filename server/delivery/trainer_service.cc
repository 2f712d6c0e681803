#include "server/delivery/trainer_service.h"

#include <memory>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpc/slice.h"
#include "grpcpp/alarm.h"
#include "grpcpp/support/slice.h"

#include "absl/strings/str_cat.h"
#include "proto/wire/byte_buffer.h"
#include "server/delivery/microbatch_encoder.h"
#include "server/store/convert.h"

namespace rollpack {
namespace {

// Longest a prefetch write waits for other streams' first writes
// (server/delivery/first_delivery_gate.h): a few first micro-batches' wire time.
constexpr absl::Duration kMaxPrefetchHold = absl::Milliseconds(100);

// Builds one micro-batch at a time, the next only once the previous was
// handed to the transport, so a slow trainer holds one message, not a step.
class FetchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `active` was already incremented for this stream; OnDone decrements it.
  FetchReactor(std::shared_ptr<const Step> step, const v1::FetchRequest& request,
               ServerMetrics* metrics, std::atomic<int>* active,
               FirstDeliveryGate* gate /* null: no priority */, int64_t id)
      : step_(std::move(step)),
        gate_(gate),
        id_(id),
        next_(request.start_index()),
        all_fields_(request.all_fields()),
        metrics_(metrics),
        active_(active),
        hold_(std::make_shared<Hold>()) {
    if (metrics_ != nullptr) metrics_->OnStreamStart(request.start_index() > 0);
    coords_ = {request.rank().dp(), request.rank().cp(), request.rank().tp(), request.rank().pp()};
    hold_->reactor = this;
    if (gate_ != nullptr) {
      gate_->FirstWriteStarted();
      first_write_pending_ = true;
    }
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    EndFirstWrite();
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream closed by the client"));
      return;
    }
    if (metrics_ != nullptr) metrics_->OnMicrobatchSent(static_cast<int64_t>(written_bytes_));
    if (next_ < step_->layout.num_microbatches() && !MayPrefetch()) return;
    WriteNext();
  }

  // Only reached while waiting at the gate (otherwise a write is in flight
  // and fails instead): end the stream unless a resume got there first.
  void OnCancel() override {
    if (gate_ != nullptr && gate_->Withdraw(id_)) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream closed by the client"));
    }
  }

  void OnDone() override {
    EndFirstWrite();  // a stream that ended before its first write
    {
      absl::MutexLock lock(&hold_->mu);
      hold_->reactor = nullptr;  // a timer still set finds nobody
    }
    active_->fetch_sub(1);
    if (metrics_ != nullptr) metrics_->OnStreamEnd();
    delete this;
  }

 private:
  // What the hold timer reaches the stream through, since it may fire
  // after the stream is gone.
  struct Hold {
    absl::Mutex mu;
    FetchReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
  };

  void EndFirstWrite() {
    if (!first_write_pending_) return;
    first_write_pending_ = false;
    gate_->FirstWriteDone();
  }

  // False: the stream waits for other streams' first micro-batches and
  // resumes from the gate or from the timer, whichever withdraws it first.
  bool MayPrefetch() {
    if (gate_ == nullptr ||
        gate_->WaitForFirstWrites(id_, &waited_generation_, [this] { WriteNext(); })) {
      return true;
    }
    std::shared_ptr<Hold> hold = hold_;
    FirstDeliveryGate* gate = gate_;
    const int64_t id = id_;
    // A new timer per wait (an alarm is set once); replacing the previous
    // one cancels it if still set, and a cancelled timer does nothing.
    hold_timer_ = std::make_unique<grpc::Alarm>();
    hold_timer_->Set(absl::ToChronoTime(absl::Now() + kMaxPrefetchHold),
                     [hold, gate, id](bool expired) {
                       if (!expired) return;
                       FetchReactor* reactor = nullptr;
                       {
                         absl::MutexLock lock(&hold->mu);
                         if (hold->reactor != nullptr && gate->Withdraw(id)) reactor = hold->reactor;
                       }
                       // Withdrawn while waiting: nothing else can end the
                       // stream now, so it is alive until this write.
                       if (reactor != nullptr) reactor->WriteNext();
                     });
    return false;
  }

  void WriteNext() {
    if (next_ >= step_->layout.num_microbatches()) {
      Finish(grpc::Status::OK);
      return;
    }
    absl::Status s = encoder_.Prepare(*step_, {coords_, next_, all_fields_});
    if (!s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    // The slice is gRPC's from here on: it is freed when the transport is
    // done with it, which may be after OnWriteDone.
    written_bytes_ = encoder_.encoded_size();
    // Fresh memory, but not fresh pages: rollpackd keeps freed memory in
    // the heap (KeepFreedMemory), so this does not fault and zero-fill; a
    // pool of send buffers measured no better (docs/performance.md).
    grpc::Slice slice(grpc_slice_malloc(written_bytes_), grpc::Slice::STEAL_REF);
    s = encoder_.Encode(absl::MakeSpan(
        reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin())), written_bytes_));
    if (!s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    ++next_;
    buffer_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&buffer_);
  }

  const std::shared_ptr<const Step> step_;
  FirstDeliveryGate* const gate_;
  const int64_t id_;
  bool first_write_pending_ = false;
  uint64_t waited_generation_ = 0;
  RankCoords coords_;
  int next_;
  const bool all_fields_;
  ServerMetrics* const metrics_;
  std::atomic<int>* const active_;
  const std::shared_ptr<Hold> hold_;
  std::unique_ptr<grpc::Alarm> hold_timer_;
  size_t written_bytes_ = 0;
  MicrobatchEncoder encoder_;
  grpc::ByteBuffer buffer_;
};

class FailedFetch final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit FailedFetch(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
  explicit FailedFetch(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* TrainerService::FetchMicrobatches(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request) {
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Trainer/FetchMicrobatches");
        !s.ok()) {
      return new FailedFetch(s);
    }
  }
  v1::FetchRequest parsed;
  if (absl::Status s = wire::ParseFromByteBuffer(*raw_request, "FetchRequest", &parsed);
      !s.ok()) {
    return new FailedFetch(ToGrpcStatus(s));
  }
  const v1::FetchRequest* request = &parsed;
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
  if (options_.max_concurrent_streams > 0 && active > options_.max_concurrent_streams) {
    active_streams_.fetch_sub(1);
    if (metrics_ != nullptr) metrics_->OnStreamRefused();
    return new FailedFetch(absl::ResourceExhaustedError(absl::StrCat(
        options_.max_concurrent_streams, " FetchMicrobatches streams are in flight "
        "(--max-concurrent-streams); retry later")));
  }
  return new FetchReactor(*std::move(step), *request, metrics_, &active_streams_,
                          options_.first_microbatch_priority ? &first_delivery_ : nullptr,
                          next_stream_id_.fetch_add(1));
}

}  // namespace rollpack
