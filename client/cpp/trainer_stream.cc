#include "client/cpp/trainer_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/keep_freed_memory.h"
#include "base/status_macros.h"
#include "client/cpp/client.h"
#include "client/cpp/connect_failure.h"
#include "client/cpp/microbatch_assembly.h"
#include "client/cpp/piece_reader.h"
#include "grpcpp/channel.h"
#include "grpcpp/impl/client_unary_call.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"

namespace rollpack {
namespace {

constexpr char kFetchMethod[] = "/rollpack.v1.Trainer/FetchMicrobatches";
constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";
// Attempts after the first that an INTERNAL or UNKNOWN error gets when it
// recurs with no micro-batch in between (UNAVAILABLE gets the time budget).
constexpr int kMaxRepeatedErrors = 4;

// A status the server sent (any but the ones gRPC makes up locally when no
// server answered): the process has reached it.
bool ServerAnswered(const absl::Status& status) {
  return status.code() != absl::StatusCode::kUnavailable &&
         status.code() != absl::StatusCode::kDeadlineExceeded &&
         status.code() != absl::StatusCode::kCancelled;
}

}  // namespace

TrainerStream::TrainerStream(std::shared_ptr<grpc::Channel> channel, std::string step_id,
                             v1::RankCoords rank, TrainerStreamOptions options)
    : step_id_(std::move(step_id)),
      rank_(rank),
      options_(options),
      channel_(std::move(channel)) {
  // Before the first micro-batch arrives: a run's first step is received
  // into fresh memory (base/keep_freed_memory.h).
  KeepReceivedMemory();
  reader_ = std::thread([this] { ReadLoop(); });
}

TrainerStream::~TrainerStream() {
  Cancel();
  reader_.join();
}

void TrainerStream::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
  for (PieceReader* r : piece_readers_) r->Cancel();
}

int TrainerStream::resumes() const {
  absl::MutexLock lock(&mu_);
  return resumes_;
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

bool TrainerStream::WaitToResume(absl::Duration delay,
                                 const std::shared_ptr<grpc::Channel>& channel) {
  const absl::Time until = absl::Now() + delay;
  // A channel that is not ready is waited on with a wait-for-ready probe
  // (grpc.health.v1.Health/Check, open without a token) that ends when the
  // channel connects or at `until`. gRPC 1.51 makes no connection attempt
  // for a channel in TRANSIENT_FAILURE whose calls fail fast (measured: a
  // restarted server was seen again only ~10 s later, whatever the
  // reconnect backoff arguments or ChannelResetConnectionBackoff), while a
  // queued wait-for-ready call gets one at once. A channel that is ready
  // (the server answered UNAVAILABLE itself, e.g. a cluster member naming
  // another) is just waited out.
  if (channel->GetState(true) != GRPC_CHANNEL_READY) {
    grpc::ClientContext probe;
    probe.set_wait_for_ready(true);
    probe.set_deadline(absl::ToChronoTime(until));
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return false;
      context_ = &probe;
    }
    const grpc::internal::RpcMethod method(kHealthCheckMethod,
                                           grpc::internal::RpcMethod::NORMAL_RPC, channel);
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), response;
    const grpc::Status status =
        grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
            channel.get(), method, &probe, request, &response);
    absl::MutexLock lock(&mu_);
    context_ = nullptr;
    if (cancelled_) return false;
    // Any answer from the server (even UNIMPLEMENTED) means it is back.
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
        status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return true;
    }
  }
  absl::MutexLock lock(&mu_);
  const absl::Duration left = until - absl::Now();
  if (left > absl::ZeroDuration() && mu_.AwaitWithTimeout(absl::Condition(&cancelled_), left)) {
    return false;
  }
  return !cancelled_;
}

bool TrainerStream::Enqueue(ReceivedMicrobatch message) {
  absl::MutexLock lock(&mu_);
  // Back-pressure: wait for room before taking the next message.
  mu_.Await(absl::Condition(
      +[](TrainerStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
        return s->cancelled_ || static_cast<int>(s->queue_.size()) < s->options_.prefetch;
      },
      this));
  if (cancelled_) return false;
  queue_.push_back(std::move(message));
  return true;
}

TrainerStream::Attempt TrainerStream::ProxyAttempt(int* next_index, int* failures) {
  grpc::ClientContext context;
  if (!options_.auth_token.empty()) {
    context.AddMetadata("authorization", "Bearer " + options_.auth_token);
  }
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return {absl::CancelledError("trainer stream cancelled"), channel_};
    context_ = &context;
  }
  v1::FetchRequest request;
  request.set_step_id(step_id_);
  *request.mutable_rank() = rank_;
  request.set_start_index(*next_index);
  request.set_all_fields(options_.all_fields);
  // The generated stub's call, with each response left as received.
  const grpc::internal::RpcMethod method(kFetchMethod, grpc::internal::RpcMethod::SERVER_STREAMING,
                                         channel_);
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
      // parse: end the call; it resumes like any INTERNAL error.
      parse_error = message.status();
      context.TryCancel();
      break;
    }
    *failures = 0;
    const int index = message->meta().index();
    if (!Enqueue(*std::move(message))) break;
    // Only once queued: a message dropped by Cancel() is not skipped.
    *next_index = index + 1;
  }
  grpc::Status status = reader->Finish();
  if (!parse_error.ok()) {
    status = grpc::Status(grpc::StatusCode::INTERNAL, parse_error.ToString());
  }
  absl::MutexLock lock(&mu_);
  context_ = nullptr;
  return {FromGrpcStatus(status), channel_};
}

std::shared_ptr<grpc::Channel> TrainerStream::MemberChannel(const std::string& address) {
  std::shared_ptr<grpc::Channel>& channel = member_channels_[address];
  if (channel == nullptr) {
    channel = options_.member_channel ? options_.member_channel(address) : MakeChannel(address);
  }
  return channel;
}

std::unique_ptr<PieceReader> TrainerStream::OpenPieces(
    const std::shared_ptr<grpc::Channel>& channel, bool header, int start_index) {
  v1::PieceRequest request;
  request.set_step_id(step_id_);
  *request.mutable_rank() = rank_;
  request.set_start_index(start_index);
  request.set_all_fields(options_.all_fields);
  request.set_header(header);
  auto reader = std::make_unique<PieceReader>(channel, request, options_.auth_token,
                                              std::max(1, options_.prefetch));
  absl::MutexLock lock(&mu_);
  if (cancelled_) return nullptr;  // ~PieceReader cancels it
  piece_readers_.push_back(reader.get());
  return reader;
}

TrainerStream::Attempt TrainerStream::DirectAttempt(int* next_index, int* failures) {
  std::vector<std::unique_ptr<PieceReader>> readers;
  // Every stream of the attempt ends with it: out of Cancel()'s reach
  // first, then cancelled and joined.
  struct Release {
    TrainerStream* self;
    std::vector<std::unique_ptr<PieceReader>>* readers;
    ~Release() {
      {
        absl::MutexLock lock(&self->mu_);
        self->piece_readers_.clear();
      }
      readers->clear();
    }
  } release{this, &readers};
  const Attempt cancelled{absl::CancelledError("trainer stream cancelled"), channel_};
  // Pieces that do not fit together: the senders' fault, not the
  // transport's; ReadLoop retries them a few times at the same micro-batch.
  auto protocol = [](absl::Status status, std::shared_ptr<grpc::Channel> channel) {
    Attempt a{std::move(status), std::move(channel)};
    a.protocol_error = true;
    return a;
  };

  std::unique_ptr<PieceReader> header_stream = OpenPieces(channel_, true, *next_index);
  if (header_stream == nullptr) return cancelled;
  PieceReader* header = readers.emplace_back(std::move(header_stream)).get();
  // Each member's stream, opened at the first micro-batch that lists it.
  std::map<std::string, std::pair<PieceReader*, std::shared_ptr<grpc::Channel>>> members;
  while (true) {
    absl::StatusOr<std::optional<ReceivedMicrobatch>> head = header->Next();
    if (!head.ok()) {
      Attempt a{head.status(), channel_};
      a.no_direct = head.status().code() == absl::StatusCode::kUnimplemented;
      return a;
    }
    if (!head->has_value()) return {absl::OkStatus(), channel_};
    const int index = (*head)->meta().index();
    if (index != *next_index) {
      return protocol(absl::DataLossError(absl::StrCat(
                          "the member dialled sent a piece of micro-batch ", index,
                          " where the header piece of micro-batch ", *next_index,
                          " belongs (direct pull)")),
                      channel_);
    }
    std::vector<ReceivedMicrobatch> pieces;
    for (const std::string& address : (*head)->meta().piece().members()) {
      auto& [reader, channel] = members[address];
      if (reader == nullptr) {
        channel = MemberChannel(address);
        std::unique_ptr<PieceReader> opened = OpenPieces(channel, false, index);
        if (opened == nullptr) return cancelled;
        reader = readers.emplace_back(std::move(opened)).get();
      }
      absl::StatusOr<std::optional<ReceivedMicrobatch>> piece = reader->Next();
      const std::string member = absl::StrCat("member ", address);
      if (!piece.ok()) {
        Attempt a{absl::Status(piece.status().code(),
                               absl::StrCat(member, ": ",
                                            absl::StatusCodeToString(piece.status().code()),
                                            ": ", piece.status().message())),
                  channel};
        // A member older than direct pulls in a cluster of mixed versions.
        a.no_direct = piece.status().code() == absl::StatusCode::kUnimplemented;
        a.member_unreachable = piece.status().code() == absl::StatusCode::kUnavailable;
        return a;
      }
      if (!piece->has_value()) {
        return protocol(absl::DataLossError(absl::StrCat(
                            member, ": its stream ended before its piece of micro-batch ", index,
                            ", which the header piece lists it for (direct pull)")),
                        channel);
      }
      if ((*piece)->meta().index() != index) {
        return protocol(absl::DataLossError(absl::StrCat(
                            member, ": sent a piece of micro-batch ", (*piece)->meta().index(),
                            " where its piece of micro-batch ", index,
                            " belongs (direct pull)")),
                        channel);
      }
      pieces.push_back(**std::move(piece));
    }
    absl::StatusOr<ReceivedMicrobatch> assembled =
        AssembleMicrobatch(**std::move(head), std::move(pieces));
    if (!assembled.ok()) return protocol(assembled.status(), channel_);
    *failures = 0;
    if (!Enqueue(*std::move(assembled))) return cancelled;
    // Only once queued: a micro-batch dropped by Cancel() is not skipped.
    *next_index = index + 1;
  }
}

void TrainerStream::ReadLoop() {
  int next_index = options_.start_index;
  // Failed attempts, and when the first of them failed, since the last
  // micro-batch received.
  int failures = 0;
  absl::Time outage_start;
  const uint64_t seed = ResumeSeed(step_id_, rank_);
  absl::Status final_status;
  bool direct = options_.delivery != Delivery::kProxy;
  bool tls_probed = false;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) break;
    }
    const int index_before = next_index;
    const Attempt attempt =
        direct ? DirectAttempt(&next_index, &failures) : ProxyAttempt(&next_index, &failures);
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) break;
    }
    if (next_index > index_before || ServerAnswered(attempt.status)) NoteReached(options_.target);
    if (attempt.status.ok()) break;
    if ((attempt.no_direct || attempt.member_unreachable) &&
        options_.delivery == Delivery::kAuto) {
      // An older rollpackd (the one dialled, or a member it lists), or a
      // member this rank cannot reach: the proxied stream from here on, at
      // once. A member that is down fails the proxied stream too, naming it,
      // and is resumed as any outage is.
      direct = false;
      continue;
    }
    const absl::Time now = absl::Now();
    if (failures == 0) outage_start = now;
    const absl::Duration down = now - outage_start;
    const std::string where = absl::StrCat("step \"", step_id_, "\" rank (dp=", rank_.dp(),
                                           ", cp=", rank_.cp(), ", tp=", rank_.tp(),
                                           ", pp=", rank_.pp(), ")");
    const FailureKind kind = ClassifyFailure(attempt.status);
    const bool never_reached = kind == FailureKind::kUnreachable && !WasReached(options_.target);
    // A plaintext stream whose connections are closed unanswered: asked
    // once whether the server speaks TLS, which no wait would change.
    const bool tls_expected = never_reached && !options_.tls && !tls_probed &&
                              !options_.target.empty() && ClosedBeforeHttp2(attempt.status) &&
                              ServerSpeaksTls(options_.target);
    tls_probed = tls_probed || (never_reached && !options_.tls);
    if (kind == FailureKind::kPermanent || tls_expected ||
        (never_reached && down >= options_.connect_grace)) {
      final_status = Annotate(
          ExplainFailure(attempt.status,
                         options_.target.empty() ? "the server" : options_.target,
                         options_.tls, down, tls_expected),
          where);
      break;
    }
    const absl::StatusCode code = attempt.status.code();
    const bool unavailable = code == absl::StatusCode::kUnavailable;
    const bool transient = unavailable || attempt.protocol_error ||
                           code == absl::StatusCode::kInternal ||
                           code == absl::StatusCode::kUnknown;
    if (!transient) {
      final_status = attempt.no_direct
                         ? Annotate(attempt.status,
                                    "Trainer.FetchPieces is not served (delivery direct; auto "
                                    "falls back to FetchMicrobatches)")
                         : attempt.status;
      break;
    }
    // A server that is down or restarting gets the time budget; an
    // INTERNAL/UNKNOWN error (or a micro-batch that does not parse, or
    // pieces that do not fit) that comes back at the same index is not
    // going away: a few tries only.
    const bool repeated = !unavailable && failures >= kMaxRepeatedErrors;
    const bool capped =
        repeated || (options_.max_resumes >= 0 && failures >= options_.max_resumes);
    if (capped || down >= options_.resume_timeout) {
      final_status = Annotate(
          attempt.status,
          absl::StrCat(
              where, ": gave up after ", failures + 1, " failed attempt",
              failures == 0 ? "" : "s", " in ",
              absl::FormatDuration(absl::Trunc(down, absl::Milliseconds(1))), " (",
              repeated ? absl::StrCat("the same error at micro-batch ", next_index, " each time")
              : capped ? absl::StrCat("max_resumes ", options_.max_resumes)
                       : absl::StrCat("resume_timeout ",
                                      absl::FormatDuration(options_.resume_timeout)),
              ")"));
      break;
    }
    absl::Duration delay =
        std::min(ResumeDelay(options_.backoff, failures, seed), options_.resume_timeout - down);
    if (never_reached) delay = std::min(delay, options_.connect_grace - down);
    ++failures;
    if (!WaitToResume(delay, attempt.channel)) break;
    absl::MutexLock lock(&mu_);
    ++resumes_;
  }
  absl::MutexLock lock(&mu_);
  error_ = final_status;
  if (cancelled_ && error_.ok()) error_ = absl::CancelledError("trainer stream cancelled");
  // Every micro-batch before next_index is queued or handed out, and the
  // consumer sees this error only after the queue: it resumes at next_index.
  error_ = WithResumeFrom(error_, next_index);
  finished_ = true;
}

}  // namespace rollpack
