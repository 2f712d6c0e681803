#include "server/ingest/put_samples_reactor.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "proto/wire/byte_buffer.h"
#include "rollpack/v1/rollouts.pb.h"
#include "server/ingest/commit_sequencer.h"
#include "server/ingest/sample_validation.h"
#include "server/store/convert.h"

namespace rollpack {
namespace {

// One request message once parsed and, when it names its pool, validated.
struct PreparedMessage {
  absl::Status status;
  std::string pool;  // empty: the pool of the call's message before this one
  std::vector<StoredSample> samples;
  // A message without a pool is validated at commit, when the pool is known.
  std::optional<v1::PutSamplesRequest> unvalidated;
};

// Validates against the pool's model and declared token fields.
absl::Status ValidateAll(SampleStore* store, const std::string& pool,
                         v1::PutSamplesRequest* request, std::vector<StoredSample>* out) {
  ASSIGN_OR_RETURN(ModelSpec model, store->GetOrAdoptModel(pool));
  ASSIGN_OR_RETURN(PoolOptions options, store->GetOptions(pool));
  out->reserve(request->samples_size());
  // Conversions into declared dtypes, and ragged fields' widening (uint16
  // ids to int32, int32 offsets to int64; layout.md section 13), may at most
  // double what the message holds: its size is what --max-message-bytes and
  // the in-flight bound count.
  bool converts = !options.token_fields.empty();
  for (const v1::Sample& sample : request->samples()) {
    converts = converts || sample.ragged_token_fields_size() > 0;
  }
  int64_t growth_budget = converts ? static_cast<int64_t>(request->ByteSizeLong()) : 0;
  for (v1::Sample& sample : *request->mutable_samples()) {
    ASSIGN_OR_RETURN(StoredSample stored,
                     ValidateAndTakeSample(&sample, model, options.token_fields, &growth_budget));
    out->push_back(std::move(stored));
  }
  return absl::OkStatus();
}

// Who may touch the reactor when: gRPC keeps it alive during a reaction
// (OnReadDone, OnCancel); outside one, a thread holds it alive only while a
// message of its own counts in `in_flight_` (read, not yet done by the
// sequencer) or while it is about to start a read (`starting_read_`). Finish
// is called only when neither holds, by a thread that then returns at once.
// Commits run on the call's sequencer, one at a time for all its streams.
class PutSamplesReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  PutSamplesReactor(SampleStore* store, ServerMetrics* metrics, WorkerPool* workers,
                    const IngestOptions& ingest, std::shared_ptr<CommitSequencer> sequencer,
                    int stripe, grpc::ByteBuffer* response, IntakeCheck intake)
      : store_(store),
        metrics_(metrics),
        workers_(ingest.messages_in_flight > 1 ? workers : nullptr),
        messages_in_flight_(workers_ != nullptr ? ingest.messages_in_flight : 1),
        max_samples_per_message_(ingest.max_samples_per_message),
        sequencer_(std::move(sequencer)),
        stripe_(stripe),
        response_(response),
        intake_(std::move(intake)) {
    reading_ = true;
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    // grpc::ByteBuffer has no move: Swap hands the received slices over
    // without a second reference that would keep them alive.
    auto bytes = std::make_unique<grpc::ByteBuffer>();
    int64_t seq = -1;
    int64_t delivered = -1;
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      if (!ok) {
        reads_done_ = true;  // the client closed its side (or went away)
        delivered = next_read_seq_;
      } else if (!failed_ && !finished_) {
        seq = next_read_seq_++;
        bytes->Swap(&incoming_);
        ++in_flight_;
      } else {
        incoming_.Clear();  // read after a refusal: dropped
      }
    }
    if (delivered >= 0) sequencer_->EndStripe(stripe_, delivered);
    if (seq >= 0 && workers_ == nullptr) {
      Submit(seq, Prepare(bytes.get()));
    } else if (seq >= 0) {
      workers_->Schedule([this, seq, b = std::move(bytes)] {
        Submit(seq, Prepare(b.get()));  // the last use of `this` here
      });
    }
    Advance();
  }

  void OnCancel() override {
    // ABORTED, for the call's other streams: they did not fail, this one
    // (its own client sees CANCELLED whatever is said here).
    sequencer_->Abort(absl::AbortedError(absl::StrCat(
        "not committed: stream ", stripe_, " of this PutSamples call was cancelled")));
  }

  void OnDone() override { delete this; }

 private:
  // Parse and validate; no reactor state is touched.
  PreparedMessage Prepare(grpc::ByteBuffer* bytes) const {
    PreparedMessage message;
    v1::PutSamplesRequest request;
    message.status = wire::ParseFromByteBuffer(*bytes, "PutSamplesRequest message", &request);
    bytes->Clear();  // gRPC's received slices go back before validation
    if (!message.status.ok()) return message;
    if (max_samples_per_message_ > 0 && request.samples_size() > max_samples_per_message_) {
      message.status = absl::ResourceExhaustedError(absl::StrCat(
          "PutSamplesRequest has ", request.samples_size(), " samples; the server takes at most ",
          max_samples_per_message_, " per message (--max-samples-per-message): send smaller "
          "messages"));
      return message;
    }
    if (request.pool().empty()) {
      message.unvalidated = std::move(request);
      return message;
    }
    message.pool = request.pool();
    message.status = ValidateAll(store_, message.pool, &request, &message.samples);
    return message;
  }

  // Hands the stream's message `seq` to the call's sequencer. Its done is
  // the last touch of this reactor on behalf of that message.
  void Submit(int64_t seq, PreparedMessage message) {
    sequencer_->Submit(
        seq * sequencer_->stripes() + stripe_,
        [this, m = std::move(message)](CommitSequencer::CallState& call) mutable {
          return Commit(m, call.pool);
        },
        [this](absl::Status status) { Advance(std::move(status)); });
  }

  // Counts `committed` (a message's end: OK, refused or dropped) when given,
  // then starts the next read or finishes, in the same critical section.
  void Advance(std::optional<absl::Status> committed = std::nullopt) {
    bool read_started = false;
    while (true) {
      enum class Next { kNothing, kRead, kFinish } next = Next::kNothing;
      grpc::Status status;
      {
        absl::MutexLock lock(&mu_);
        if (committed.has_value()) {
          --in_flight_;
          if (!committed->ok() && !failed_) {
            failed_ = true;
            failure_ = *std::move(committed);
          }
          committed.reset();
        }
        if (read_started) starting_read_ = false;
        read_started = false;
        if (finished_) return;
        if (in_flight_ == 0 && !starting_read_ && (failed_ || (reads_done_ && !reading_))) {
          // A refusal finishes at once, a read still pending: a client that
          // waits for the status without closing its side must get it.
          finished_ = true;
          next = Next::kFinish;
          status = failed_ ? ToGrpcStatus(failure_) : SerializeResponse();
        } else if (!reading_ && !starting_read_ && !reads_done_ && !failed_ &&
                   in_flight_ < messages_in_flight_) {
          reading_ = true;
          starting_read_ = true;
          next = Next::kRead;
        }
      }
      if (next == Next::kRead) {
        StartRead(&incoming_);
        read_started = true;
        continue;  // a refusal may have come meanwhile: finish if so
      }
      if (next == Next::kFinish) Finish(status);
      return;
    }
  }

  // On the sequencer, one message of the call at a time: the samples stored
  // (identical re-sends included), or why the message was refused.
  // `pool` is the call's: the pool its previous message named.
  absl::StatusOr<int64_t> Commit(PreparedMessage& message, std::string& pool) {
    if (!message.pool.empty()) pool = message.pool;
    absl::StatusOr<int64_t> accepted = CommitMessage(message, pool);
    if (!accepted.ok() && metrics_ != nullptr) {
      metrics_->OnPutRefused(pool, accepted.status().code());
    }
    return accepted;
  }

  absl::StatusOr<int64_t> CommitMessage(PreparedMessage& message, const std::string& pool) {
    if (!message.status.ok()) return message.status;
    if (intake_) RETURN_IF_ERROR(intake_());
    if (message.unvalidated.has_value()) {
      if (pool.empty()) return absl::InvalidArgumentError("PutSamplesRequest.pool is empty");
      RETURN_IF_ERROR(ValidateAll(store_, pool, &*message.unvalidated, &message.samples));
    }
    ASSIGN_OR_RETURN(PutResult result, store_->Put(pool, std::move(message.samples)));
    if (metrics_ != nullptr) {
      metrics_->OnPut(pool, result.accepted, result.duplicates, result.stored_bytes);
    }
    accepted_ += result.accepted;
    duplicates_ += result.duplicates;
    stored_bytes_ += result.stored_bytes;
    return result.accepted;
  }

  // When finishing: no commit of this stream runs, and mu_ ordered the last
  // one's writes.
  grpc::Status SerializeResponse() {
    v1::PutSamplesResponse response;
    response.set_accepted(accepted_);
    response.set_duplicates(duplicates_);
    response.set_stored_bytes(stored_bytes_);
    *response_ = wire::SerializeToByteBuffer(response);
    return grpc::Status::OK;
  }

  SampleStore* const store_;
  ServerMetrics* const metrics_;
  WorkerPool* const workers_;
  const int messages_in_flight_;
  const int max_samples_per_message_;  // 0 = no limit
  const std::shared_ptr<CommitSequencer> sequencer_;
  const int stripe_;
  grpc::ByteBuffer* const response_;
  const IntakeCheck intake_;
  // Filled by gRPC's read; swapped out in OnReadDone before the next read.
  grpc::ByteBuffer incoming_;

  absl::Mutex mu_;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool starting_read_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  // Messages read and not yet done by the sequencer.
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_read_seq_ ABSL_GUARDED_BY(mu_) = 0;

  // The committing thread's (the sequencer runs one commit at a time).
  int64_t accepted_ = 0;
  int64_t duplicates_ = 0;
  int64_t stored_bytes_ = 0;
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* NewPutSamplesReactor(SampleStore* store,
                                                                ServerMetrics* metrics,
                                                                WorkerPool* workers,
                                                                const IngestOptions& ingest,
                                                                std::shared_ptr<CommitSequencer> sequencer,
                                                                int stripe,
                                                                grpc::ByteBuffer* response,
                                                                IntakeCheck intake) {
  return new PutSamplesReactor(store, metrics, workers, ingest, std::move(sequencer), stripe,
                               response, std::move(intake));
}

}  // namespace rollpack
