#include "server/delivery/trainer_service.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpc/slice.h"
#include "grpcpp/alarm.h"
#include "grpcpp/support/slice.h"

#include "absl/strings/str_cat.h"
#include "proto/wire/byte_buffer.h"
#include "server/delivery/client_stream_quota.h"
#include "server/delivery/microbatch_encoder.h"
#include "server/delivery/rank_stream_loop.h"
#include "server/ops/call_log.h"
#include "server/ops/guarded_peers.h"
#include "server/store/convert.h"

namespace rollpack {
namespace {

// Longest a prefetch write waits for other streams' first writes
// (server/delivery/first_delivery_gate.h): a few first micro-batches' wire time.
constexpr absl::Duration kMaxPrefetchHold = absl::Milliseconds(100);

// The Hold whose mutex the write timer of this thread holds (see ArmWriteTimer).
thread_local const void* held_by_this_thread = nullptr;

// A micro-batch encoded straight into the slice gRPC sends.
class SliceBuffer final : public MicrobatchWriter::Buffer {
 public:
  // Fresh memory, but not fresh pages: rollpackd keeps freed memory in the
  // heap (KeepFreedMemory), so this does not fault and zero-fill; a pool of
  // send buffers measured no better (docs/performance.md).
  explicit SliceBuffer(size_t size) : slice_(grpc_slice_malloc(size), grpc::Slice::STEAL_REF) {}
  absl::Span<char> bytes() override {
    return absl::MakeSpan(reinterpret_cast<char*>(const_cast<uint8_t*>(slice_.begin())),
                          slice_.size());
  }
  // The slice is gRPC's from here on: it is freed when the transport is
  // done with it, which may be after OnWriteDone.
  grpc::ByteBuffer Release() { return grpc::ByteBuffer(&slice_, 1); }

 private:
  grpc::Slice slice_;
};

// One stream (FetchMicrobatches, or FetchPieces with a PieceSelection): the
// gRPC writer of its RankStreamLoop, with the send budget, the
// first-delivery gate and the write timer. Without a send budget the loop
// encodes the next micro-batch while the previous one is on the wire and no
// further, so a slow trainer holds at most two messages, not a step.
class FetchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                           private MicrobatchWriter {
 public:
  // `active` was already incremented for this stream; OnDone decrements it.
  // `active` was counted and `quota` acquired for `client`: OnDone gives
  // both back.
  FetchReactor(const v1::FetchRequest& request, grpc::CallbackServerContext* context,
               ServerMetrics* metrics, std::atomic<int>* active, ClientStreamQuota* quota,
               std::string client, absl::Duration write_timeout,
               FirstDeliveryGate* gate /* null: no priority */, SendBudget* budget,
               int64_t id, StepActivity* activity /* null: not recorded */)
      : request_(request),
        context_(context),
        quota_(quota),
        client_(std::move(client)),
        write_timeout_(write_timeout),
        activity_(activity),
        // Counted before the step is looked up: a step being fetched is
        // never idle (--step-ttl).
        activity_token_(activity != nullptr ? activity->StreamStarted(request.step_id(), absl::Now())
                                            : 0),
        gate_(gate),
        budget_(budget),
        id_(id),
        metrics_(metrics),
        active_(active),
        hold_(std::make_shared<Hold>()) {
    coords_ = {request.rank().dp(), request.rank().cp(), request.rank().tp(), request.rank().pp()};
  }

  // Starts the stream on the step found for it (on the handler's thread,
  // or later on another: gRPC queues what a reactor starts before it is
  // bound to its call).
  void Begin(absl::StatusOr<RankStep> step) {
    if (!step.ok()) {
      End(ToGrpcStatus(step.status()));
      return;
    }
    RankStreamSource source;
    source.step = std::move(step->step);
    source.samples = std::move(step->samples);
    source.recompute_routing = std::move(step->recompute_routing);
    source.rank = coords_;
    source.start_index = request_.start_index();
    source.all_fields = request_.all_fields();
    source.piece = piece_ ? &*piece_ : nullptr;
    // With a send budget, bytes are taken per write, when the write is due.
    source.encode_ahead = budget_->capacity() <= 0;
    if (absl::Status s = loop_.Start(std::move(source)); !s.ok()) {
      End(ToGrpcStatus(s));
      return;
    }
    started_ = true;
    if (metrics_ != nullptr) metrics_->OnStreamStart(request_.start_index() > 0);
    {
      absl::MutexLock lock(&hold_->mu);
      hold_->reactor = this;
    }
    if (gate_ != nullptr) {
      gate_->FirstWriteStarted();
      first_write_pending_ = true;
    }
    loop_.WriteNext();
  }

  // FetchPieces: this member's pieces of the rank's micro-batches.
  void BeginPieces(absl::StatusOr<RankPieces> pieces, bool header) {
    if (!pieces.ok()) {
      Begin(pieces.status());
      return;
    }
    owner_ = std::move(pieces->owner);
    members_ = std::move(pieces->members);
    piece_.emplace();
    if (owner_ != nullptr) piece_->owner = *owner_;
    piece_->members = members_;
    piece_->self = pieces->self;
    piece_->header = header;
    Begin(std::move(pieces->rank));
  }

  void OnWriteDone(bool ok) override { loop_.OnWriteDone(ok); }

 private:
  // MicrobatchWriter: the loop's transport is this call.
  std::unique_ptr<Buffer> NewBuffer(size_t size) override {
    return std::make_unique<SliceBuffer>(size);
  }

  // Once queued, the resume may end the stream on another thread at any
  // moment. A stream cancelled before it could queue (OnCancel found
  // nothing to withdraw) is refused instead of left waiting.
  Admission Admit(int64_t size, absl::AnyInvocable<void()> resume) override {
    auto granted = std::make_shared<absl::AnyInvocable<void()>>(std::move(resume));
    switch (budget_->Acquire(id_, size, &cancelled_, [this, size, granted] {
      budget_held_ = size;
      (*granted)();
    })) {
      case SendBudget::Acquired::kNow:
        budget_held_ = size;
        return Admission::kNow;
      case SendBudget::Acquired::kLater:
        return Admission::kLater;
      case SendBudget::Acquired::kNever:
        return Admission::kNever;
    }
    return Admission::kNever;
  }

  void Send(std::unique_ptr<Buffer> buffer) override {
    auto* slice = static_cast<SliceBuffer*>(buffer.get());
    written_bytes_ = slice->bytes().size();
    buffer_ = slice->Release();
    ArmWriteTimer();
    StartWrite(&buffer_);
  }

  void EndStream(const absl::Status& status) override {
    // Bytes admitted for a micro-batch that failed to encode.
    budget_->Release(std::exchange(budget_held_, 0));
    End(status.ok() ? grpc::Status::OK : ToGrpcStatus(status));
  }

  // The bookkeeping of a completed write. True: the caller starts the next
  // write now. False: the stream ended (and may be gone) or waits for the
  // first-delivery gate, which resumes it.
  bool AfterWrite(bool ok) override {
    {
      // The write timer stands down (a timer that fired already finds a
      // newer sequence number and does nothing).
      HoldLock lock(hold_.get());
      ++hold_->writes_done;
    }
    write_timer_.reset();
    EndFirstWrite();
    // May resume other streams' writes on this thread (the budget's waiters).
    budget_->Release(std::exchange(budget_held_, 0));
    if (!ok) {
      End(grpc::Status(grpc::StatusCode::CANCELLED,
                       stalled_.load() ? "stream ended by rollpackd: the client stopped reading"
                                       : "stream closed by the client"));
      return false;
    }
    sent_bytes_ += written_bytes_;
    ++delivered_;
    if (metrics_ != nullptr) metrics_->OnMicrobatchSent(static_cast<int64_t>(written_bytes_));
    // A micro-batch encoded ahead is still a prefetch (the gate holds it).
    if (!loop_.more_to_write()) return true;
    return MayPrefetch();
  }

 public:
  // Only reached while waiting at the gate or for the send budget
  // (otherwise a write is in flight and fails instead): end the stream
  // unless a resume got there first.
  void OnCancel() override {
    // Set before the withdraw: a write that had not queued yet sees it in
    // SendBudget::Acquire and ends the stream itself (WriteNext).
    cancelled_.store(true);
    if ((gate_ != nullptr && gate_->Withdraw(id_)) || budget_->Withdraw(id_)) {
      End(grpc::Status(grpc::StatusCode::CANCELLED, "stream closed by the client"));
    }
  }

  void OnDone() override {
    EndFirstWrite();  // a stream that ended before its first write
    {
      HoldLock lock(hold_.get());
      hold_->reactor = nullptr;  // a timer still set finds nobody
    }
    active_->fetch_sub(1);
    quota_->Release(client_);
    if (started_ && metrics_ != nullptr) metrics_->OnStreamEnd();
    if (activity_ != nullptr) activity_->StreamEnded(request_.step_id(), activity_token_, absl::Now());
    delete this;
  }

 private:
  // What the hold timer reaches the stream through, since it may fire
  // after the stream is gone.
  struct Hold {
    // Serialises MayPrefetch's timer arming (taken before mu).
    absl::Mutex arming;
    absl::Mutex mu;
    FetchReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
    // Writes completed: a write timer acts only on the write it was set for.
    int64_t writes_done ABSL_GUARDED_BY(mu) = 0;
  };

  // Hold::mu, unless this thread holds it already: the write timer cancels
  // with it held, and should gRPC run the reactions to that inline, they
  // must not wait for it.
  class ABSL_SCOPED_LOCKABLE HoldLock {
   public:
    explicit HoldLock(Hold* hold) ABSL_EXCLUSIVE_LOCK_FUNCTION(hold->mu)
        : mu_(held_by_this_thread == hold ? nullptr : &hold->mu) {
      if (mu_ != nullptr) mu_->Lock();
    }
    ~HoldLock() ABSL_UNLOCK_FUNCTION() {
      if (mu_ != nullptr) mu_->Unlock();
    }

   private:
    absl::Mutex* const mu_;
  };

  // A client that stopped reading holds the micro-batch in flight (and its
  // memory) for as long as it likes: after write_timeout_ the stream ends.
  void ArmWriteTimer() {
    if (write_timeout_ <= absl::ZeroDuration() || write_timeout_ == absl::InfiniteDuration()) {
      return;
    }
    std::shared_ptr<Hold> hold = hold_;
    int64_t write;
    {
      HoldLock lock(hold.get());
      write = hold->writes_done;
    }
    write_timer_ = std::make_unique<grpc::Alarm>();
    write_timer_->Set(absl::ToChronoTime(absl::Now() + write_timeout_), [hold, write](bool expired) {
      if (!expired) return;
      absl::MutexLock lock(&hold->mu);
      if (hold->reactor == nullptr || hold->writes_done != write) return;
      hold->reactor->stalled_.store(true);
      // The pending write fails and the stream ends (OnWriteDone, OnDone).
      // Cancelled with the lock held, so the reactor cannot go meanwhile;
      // should gRPC run the reactions inline, OnDone finds the lock is this
      // thread's (held_by_this_thread) instead of waiting for it.
      held_by_this_thread = hold.get();
      hold->reactor->context_->TryCancel();
      held_by_this_thread = nullptr;
    });
  }

  void EndFirstWrite() {
    if (!first_write_pending_) return;
    first_write_pending_ = false;
    gate_->FirstWriteDone();
  }

  // False: the stream waits for other streams' first micro-batches and
  // resumes from the gate or from the timer, whichever withdraws it first.
  bool MayPrefetch() {
    if (gate_ == nullptr) return true;
    // Held from joining the gate until the timer is set: the gate may resume
    // this stream on another thread at once, and the write that resumes
    // ends in OnWriteDone and here again, which must not set the same
    // timer concurrently (gRPC: "Duplicate timer being added", an abort).
    absl::MutexLock lock(&hold_->arming);
    if (gate_->WaitForFirstWrites(id_, &waited_generation_, [this] { WriteNext(); })) {
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

  // Every end of the stream: its log line says what it carried (written to
  // the transport; what the trainer received is its own to say).
  void End(const grpc::Status& status) {
    const int first = request_.start_index();
    const int written_end = first + delivered_;
    std::string note = absl::StrCat("step \"", request_.step_id(), "\" rank dp", coords_.dp, " cp",
                                    coords_.cp, " tp", coords_.tp, " pp", coords_.pp);
    if (started_) {
      absl::StrAppend(&note, ": micro-batches [", first, ", ", written_end, ") of ",
                      loop_.num_microbatches(), " written, ", sent_bytes_, " bytes");
    }
    // A write that completed just as the timer fired may still end the
    // stream well: only a stream the timer did end counts as stalled.
    if (stalled_.load() && !status.ok()) {
      absl::StrAppend(&note, "; ended: the client took no micro-batch for ",
                      absl::FormatDuration(write_timeout_), " (--stream-write-timeout)");
      if (metrics_ != nullptr) metrics_->OnStreamStalled();
    }
    AnnotateCall(context_, std::move(note));
    Finish(status);
  }

  // The gate and the hold timer resume a stream here.
  void WriteNext() { loop_.WriteNext(); }

  const v1::FetchRequest request_;
  grpc::CallbackServerContext* const context_;
  ClientStreamQuota* const quota_;
  const std::string client_;
  const absl::Duration write_timeout_;
  std::unique_ptr<grpc::Alarm> write_timer_;
  std::atomic<bool> stalled_{false};
  std::atomic<bool> cancelled_{false};
  StepActivity* const activity_;
  const uint64_t activity_token_;
  // Set by Begin, before the first write: the loop holds the step.
  bool started_ = false;  // counted in the stream metrics
  FirstDeliveryGate* const gate_;
  SendBudget* const budget_;
  // Of the write in flight; given back when it completes.
  int64_t budget_held_ = 0;
  const int64_t id_;
  bool first_write_pending_ = false;
  uint64_t waited_generation_ = 0;
  RankCoords coords_;
  ServerMetrics* const metrics_;
  std::atomic<int>* const active_;
  const std::shared_ptr<Hold> hold_;
  std::unique_ptr<grpc::Alarm> hold_timer_;
  size_t written_bytes_ = 0;
  // Of the writes that completed.
  int delivered_ = 0;
  int64_t sent_bytes_ = 0;
  // The micro-batch in flight.
  grpc::ByteBuffer buffer_;
  RankStreamLoop loop_{this};
  // FetchPieces only (piece_ set): who holds what, kept alive for piece_.
  std::shared_ptr<const std::vector<int32_t>> owner_;
  std::vector<std::string> members_;
  std::optional<PieceSelection> piece_;
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
  return StartStream(context, parsed, std::nullopt);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* TrainerService::FetchPieces(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw_request) {
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Trainer/FetchPieces"); !s.ok()) {
      return new FailedFetch(s);
    }
  }
  v1::PieceRequest parsed;
  if (absl::Status s = wire::ParseFromByteBuffer(*raw_request, "PieceRequest", &parsed);
      !s.ok()) {
    return new FailedFetch(ToGrpcStatus(s));
  }
  v1::FetchRequest fetch;
  fetch.set_step_id(parsed.step_id());
  *fetch.mutable_rank() = parsed.rank();
  fetch.set_start_index(parsed.start_index());
  fetch.set_all_fields(parsed.all_fields());
  return StartStream(context, fetch, parsed.header());
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* TrainerService::StartStream(
    grpc::CallbackServerContext* context, const v1::FetchRequest& parsed,
    std::optional<bool> piece_header) {
  // Admitted before any work for it (a cluster member's pull included).
  const int active = active_streams_.fetch_add(1) + 1;
  if (options_.max_concurrent_streams > 0 && active > options_.max_concurrent_streams) {
    active_streams_.fetch_sub(1);
    if (metrics_ != nullptr) metrics_->OnStreamRefused();
    return new FailedFetch(absl::ResourceExhaustedError(absl::StrCat(
        options_.max_concurrent_streams, " FetchMicrobatches streams are in flight "
        "(--max-concurrent-streams); retry later")));
  }
  std::string client = PeerHost(CallPeer(context->peer()));
  if (!client_quota_.Acquire(client)) {
    active_streams_.fetch_sub(1);
    if (metrics_ != nullptr) metrics_->OnClientStreamRefused();
    return new FailedFetch(absl::ResourceExhaustedError(absl::StrCat(
        "client ", client, " has ", client_quota_.max_per_client(),
        " FetchMicrobatches streams in flight (--max-streams-per-client); retry later")));
  }
  if (pulls_ != nullptr && pulls_->queued() >= kMaxQueuedLookups) {
    active_streams_.fetch_sub(1);
    client_quota_.Release(client);
    if (metrics_ != nullptr) metrics_->OnStreamRefused();
    return new FailedFetch(absl::ResourceExhaustedError(absl::StrCat(
        kMaxQueuedLookups, " FetchMicrobatches streams wait for their samples from other "
        "members; retry later")));
  }
  auto* reactor = new FetchReactor(parsed, context, metrics_, &active_streams_, &client_quota_,
                                   std::move(client), options_.write_timeout,
                                   options_.first_microbatch_priority ? &first_delivery_ : nullptr,
                                   &send_budget_, next_stream_id_.fetch_add(1), activity_);
  const RankCoords coords{parsed.rank().dp(), parsed.rank().cp(), parsed.rank().tp(),
                          parsed.rank().pp()};
  auto begin = [reactor, steps = steps_, step_id = parsed.step_id(), coords, piece_header] {
    if (piece_header.has_value()) {
      reactor->BeginPieces(steps->GetPiecesForRank(step_id, coords), *piece_header);
    } else {
      reactor->Begin(steps->GetStepForRank(step_id, coords));
    }
  };
  if (pulls_ == nullptr) {
    begin();
  } else {
    // A cluster member may pull the rank's samples from the members that
    // hold them (or read its own from the store): a wait that must not hold
    // one of gRPC's callback threads (those serve this member's own peers).
    pulls_->Schedule([reactor, context, begin] {
      // A trainer that gave up while queued costs no pull.
      if (context->IsCancelled()) {
        reactor->Begin(absl::CancelledError("stream closed by the client"));
        return;
      }
      begin();
    });
  }
  return reactor;
}

}  // namespace rollpack
