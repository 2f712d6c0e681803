#include "server/put_samples_reactor.h"

#include <cstdint>
#include <map>
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
    grpc::ByteBuffer bytes;
    int64_t seq = -1;
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      if (!ok) {
        reads_done_ = true;  // the client closed its side (or went away)
      } else if (!failed_ && !finished_) {
        seq = next_read_seq_++;
        bytes.Swap(&incoming_);
        ++in_flight_;
      }
    }
    if (seq >= 0 && workers_ == nullptr) {
      Prepare(seq, std::move(bytes));  // ends in Advance()
      return;
    }
    if (seq >= 0) {
      workers_->Schedule(
          [this, seq, b = std::move(bytes)]() mutable { Prepare(seq, std::move(b)); });
    }
    // Still inside a reaction, so OnDone cannot run before this returns even
    // if a worker has finished the call meanwhile.
    Advance();
  }

  void OnDone() override { delete this; }

 private:
  // On a worker (or inline): parse, validate, queue for the in-order commit.
  void Prepare(int64_t seq, grpc::ByteBuffer bytes) {
    PreparedMessage message;
    v1::PutSamplesRequest request;
    {
      grpc::ProtoBufferReader reader(&bytes);
      if (!request.ParseFromZeroCopyStream(&reader)) {
        message.status = absl::InvalidArgumentError("PutSamplesRequest message does not parse");
      }
    }
    bytes.Clear();  // gRPC's received slices go back before validation
    if (message.status.ok()) {
      if (request.pool().empty()) {
        message.unvalidated = std::move(request);
      } else {
        message.pool = request.pool();
        absl::StatusOr<ModelSpec> model = store_->GetModel(message.pool);
        message.status = model.ok() ? ValidateAll(&request, *model, &message.samples)
                                    : model.status();
      }
    }
    {
      absl::MutexLock lock(&mu_);
      prepared_.emplace(seq, std::move(message));
    }
    Advance();  // the last use of `this` on a worker: it may finish the call
  }

  // Commits what is ready in order, then starts the next read or finishes.
  void Advance() {
    enum class Next { kNothing, kRead, kFinish } next = Next::kNothing;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      CommitReadyLocked();
      if (finished_) return;
      // A refusal finishes at once, a read still pending: a client that
      // waits for the status without closing its side must get it.
      if (in_flight_ == 0 && (failed_ || (reads_done_ && !reading_))) {
        finished_ = true;
        next = Next::kFinish;
        status = failed_ ? ToGrpcStatus(failure_) : SerializeResponseLocked();
      } else if (!reading_ && !reads_done_ && !failed_ && in_flight_ < messages_in_flight_) {
        reading_ = true;
        next = Next::kRead;
      }
    }
    if (next == Next::kRead) StartRead(&incoming_);
    if (next == Next::kFinish) Finish(status);
  }

  void CommitReadyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = prepared_.begin(); it != prepared_.end() && it->first == next_commit_seq_;
         it = prepared_.erase(it)) {
      ++next_commit_seq_;
      --in_flight_;
      if (failed_) continue;  // after a refusal nothing more is committed
      if (absl::Status s = CommitLocked(it->second); !s.ok()) {
        if (metrics_ != nullptr) metrics_->OnPutRefused(pool_, s.code());
        failed_ = true;
        failure_ = absl::Status(
            s.code(), absl::StrCat(s.message(), " [", accepted_,
                                   " samples of earlier messages of this stream were committed; "
                                   "this message's were not]"));
      }
    }
  }

  absl::Status CommitLocked(PreparedMessage& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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

  grpc::Status SerializeResponseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  // Messages read and not yet committed (or dropped).
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_read_seq_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_commit_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, PreparedMessage> prepared_ ABSL_GUARDED_BY(mu_);
  std::string pool_ ABSL_GUARDED_BY(mu_);
  int64_t accepted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t duplicates_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t stored_bytes_ ABSL_GUARDED_BY(mu_) = 0;
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
