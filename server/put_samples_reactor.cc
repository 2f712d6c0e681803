#include "server/put_samples_reactor.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "rollpack/v1/rollouts.pb.h"
#include "server/convert.h"
#include "server/sample_validation.h"

namespace rollpack {
namespace {

// One request message once parsed and, when it names its pool, validated.
struct PreparedMessage {
  absl::Status status;
  std::string pool;  // empty: the pool of an earlier message of the stream
  std::vector<StoredSample> samples;
  // A message without a pool is validated at commit, when the pool is known.
  std::optional<v1::PutSamplesRequest> unvalidated;
};

absl::Status ValidateAll(v1::PutSamplesRequest* request, const ModelSpec& model,
                         std::vector<StoredSample>* out) {
  out->reserve(request->samples_size());
  for (v1::Sample& sample : *request->mutable_samples()) {
    absl::StatusOr<StoredSample> stored = ValidateAndTakeSample(&sample, model);
    if (!stored.ok()) return stored.status();
    out->push_back(*std::move(stored));
  }
  return absl::OkStatus();
}

// Who may touch the reactor when: gRPC keeps it alive during a reaction
// (OnReadDone); outside one, a thread holds it alive only while a message of
// its own counts in `in_flight_`, while it is the committer (`committing_`)
// or while it is about to start a read (`starting_read_`). Finish is called
// only when none of these holds, by a thread that then returns at once.
class PutSamplesReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  PutSamplesReactor(SampleStore* store, ServerMetrics* metrics, WorkerPool* workers,
                    int messages_in_flight, grpc::ByteBuffer* response)
      : store_(store),
        metrics_(metrics),
        workers_(messages_in_flight > 1 ? workers : nullptr),
        messages_in_flight_(workers_ != nullptr ? messages_in_flight : 1),
        response_(response) {
    reading_ = true;
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    // grpc::ByteBuffer has no move: Swap hands the received slices over
    // without a second reference that would keep them alive.
    auto bytes = std::make_unique<grpc::ByteBuffer>();
    int64_t seq = -1;
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      if (!ok) {
        reads_done_ = true;  // the client closed its side (or went away)
      } else if (!failed_ && !finished_) {
        seq = next_read_seq_++;
        bytes->Swap(&incoming_);
        ++in_flight_;
      } else {
        incoming_.Clear();  // read after a refusal: dropped
      }
    }
    if (seq >= 0 && workers_ == nullptr) {
      Advance(std::make_pair(seq, Prepare(bytes.get())));
      return;
    }
    if (seq >= 0) {
      workers_->Schedule([this, seq, b = std::move(bytes)] {
        PreparedMessage message = Prepare(b.get());
        Advance(std::make_pair(seq, std::move(message)));  // the last use of `this` here
      });
    }
    Advance();
  }

  void OnDone() override { delete this; }

 private:
  // Parse and validate; no reactor state is touched.
  PreparedMessage Prepare(grpc::ByteBuffer* bytes) const {
    PreparedMessage message;
    v1::PutSamplesRequest request;
    {
      grpc::ProtoBufferReader reader(bytes);
      if (!request.ParseFromZeroCopyStream(&reader)) {
        message.status = absl::InvalidArgumentError("PutSamplesRequest message does not parse");
      }
    }
    bytes->Clear();  // gRPC's received slices go back before validation
    if (!message.status.ok()) return message;
    if (request.pool().empty()) {
      message.unvalidated = std::move(request);
      return message;
    }
    message.pool = request.pool();
    absl::StatusOr<ModelSpec> model = store_->GetModel(message.pool);
    message.status =
        model.ok() ? ValidateAll(&request, *model, &message.samples) : model.status();
    return message;
  }

  // Queues `ready` (a prepared message), commits what is ready in order when
  // no other thread is committing, then starts the next read or finishes.
  void Advance(std::optional<std::pair<int64_t, PreparedMessage>> ready = std::nullopt) {
    bool read_started = false;
    while (true) {
      std::vector<PreparedMessage> batch;
      bool already_failed = false;
      enum class Next { kNothing, kRead, kFinish } next = Next::kNothing;
      grpc::Status status;
      {
        absl::MutexLock lock(&mu_);
        if (ready.has_value()) {
          prepared_.emplace(ready->first, std::move(ready->second));
          ready.reset();
        }
        if (read_started) starting_read_ = false;
        read_started = false;
        if (!committing_) {
          for (auto it = prepared_.begin();
               it != prepared_.end() && it->first == next_commit_seq_; it = prepared_.erase(it)) {
            batch.push_back(std::move(it->second));
            ++next_commit_seq_;
          }
          committing_ = !batch.empty();
          already_failed = failed_;
        }
        if (batch.empty()) {
          if (finished_) return;
          if (in_flight_ == 0 && !committing_ && !starting_read_ &&
              (failed_ || (reads_done_ && !reading_))) {
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
      }
      if (!batch.empty()) {
        // The store's Put (an fsync in durable mode) runs without the lock:
        // other messages of the stream keep arriving meanwhile.
        absl::Status failure = already_failed ? absl::OkStatus() : CommitInOrder(batch);
        absl::MutexLock lock(&mu_);
        in_flight_ -= static_cast<int>(batch.size());
        committing_ = false;
        if (!failure.ok()) {
          failed_ = true;
          failure_ = std::move(failure);
        }
        continue;  // more may be ready now; then read or finish
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

  // The committer only (committing_ set): commits `batch` in order up to the
  // first refusal, which it returns with what was committed before it.
  absl::Status CommitInOrder(std::vector<PreparedMessage>& batch) {
    for (PreparedMessage& message : batch) {
      absl::Status s = Commit(message);
      if (s.ok()) continue;
      if (metrics_ != nullptr) metrics_->OnPutRefused(pool_, s.code());
      return absl::Status(
          s.code(), absl::StrCat(s.message(), " [", accepted_,
                                 " samples of earlier messages of this stream were committed; "
                                 "this message's were not]"));
    }
    return absl::OkStatus();
  }

  absl::Status Commit(PreparedMessage& message) {
    if (!message.pool.empty()) pool_ = message.pool;
    if (!message.status.ok()) return message.status;
    if (message.unvalidated.has_value()) {
      if (pool_.empty()) return absl::InvalidArgumentError("PutSamplesRequest.pool is empty");
      absl::StatusOr<ModelSpec> model = store_->GetModel(pool_);
      if (!model.ok()) return model.status();
      if (absl::Status s = ValidateAll(&*message.unvalidated, *model, &message.samples); !s.ok()) {
        return s;
      }
    }
    absl::StatusOr<PutResult> result = store_->Put(pool_, std::move(message.samples));
    if (!result.ok()) return result.status();
    if (metrics_ != nullptr) {
      metrics_->OnPut(pool_, result->accepted, result->duplicates, result->stored_bytes);
    }
    accepted_ += result->accepted;
    duplicates_ += result->duplicates;
    stored_bytes_ += result->stored_bytes;
    return absl::OkStatus();
  }

  // When finishing: no committer runs, and mu_ ordered the last one's writes.
  grpc::Status SerializeResponse() {
    v1::PutSamplesResponse response;
    response.set_accepted(accepted_);
    response.set_duplicates(duplicates_);
    response.set_stored_bytes(stored_bytes_);
    bool own_buffer = false;
    return grpc::SerializationTraits<v1::PutSamplesResponse>::Serialize(response, response_,
                                                                        &own_buffer);
  }

  SampleStore* const store_;
  ServerMetrics* const metrics_;
  WorkerPool* const workers_;
  const int messages_in_flight_;
  grpc::ByteBuffer* const response_;
  // Filled by gRPC's read; swapped out in OnReadDone before the next read.
  grpc::ByteBuffer incoming_;

  absl::Mutex mu_;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool starting_read_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool committing_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  // Messages read and not yet committed (or dropped).
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_read_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_commit_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, PreparedMessage> prepared_ ABSL_GUARDED_BY(mu_);

  // The committer's (one thread at a time, handed over through mu_).
  std::string pool_;
  int64_t accepted_ = 0;
  int64_t duplicates_ = 0;
  int64_t stored_bytes_ = 0;
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* NewPutSamplesReactor(SampleStore* store,
                                                                ServerMetrics* metrics,
                                                                WorkerPool* workers,
                                                                int messages_in_flight,
                                                                grpc::ByteBuffer* response) {
  return new PutSamplesReactor(store, metrics, workers, messages_in_flight, response);
}

}  // namespace rollpack
