#include "client/cpp/put_samples_stream.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "grpc/slice.h"
#include "grpcpp/support/client_callback.h"
#include "grpcpp/support/slice.h"
#include "proto/wire/wire_format.h"
// The generated stubs bring gRPC's protobuf serialization for the response.
#include "rollpack/v1/rollouts.grpc.pb.h"

namespace rollpack {
namespace {

constexpr char kPutSamplesMethod[] = "/rollpack.v1.Rollouts/PutSamples";
constexpr int kPoolField = 1;     // PutSamplesRequest.pool
constexpr int kSamplesField = 2;  // PutSamplesRequest.samples

}  // namespace

struct EncodeBufferPool::Lease {
  std::shared_ptr<EncodeBufferPool> pool;
  Buffer buffer;
};

std::shared_ptr<EncodeBufferPool> EncodeBufferPool::Create(int max_kept, size_t max_kept_bytes) {
  return std::shared_ptr<EncodeBufferPool>(new EncodeBufferPool(max_kept, max_kept_bytes));
}

grpc_slice EncodeBufferPool::Allocate(size_t size) {
  Buffer buffer;
  {
    absl::MutexLock lock(&mu_);
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->capacity >= size && (best == kept_.end() || it->capacity < best->capacity)) best = it;
    }
    if (best != kept_.end()) {
      buffer = std::move(*best);
      kept_.erase(best);
    }
  }
  if (buffer.data == nullptr) {
    // Whole MiB, so that messages a little longer than the last still fit.
    constexpr size_t kGranule = size_t{1} << 20;
    buffer.capacity = std::max<size_t>((size + kGranule - 1) / kGranule * kGranule, 1);
    buffer.data.reset(new uint8_t[buffer.capacity]);  // not zeroed: every byte is written
  }
  uint8_t* const data = buffer.data.get();
  auto* lease = new Lease{shared_from_this(), std::move(buffer)};
  return grpc_slice_new_with_user_data(data, size, &EncodeBufferPool::Release, lease);
}

void EncodeBufferPool::Release(void* opaque) {
  std::unique_ptr<Lease> lease(static_cast<Lease*>(opaque));
  EncodeBufferPool& pool = *lease->pool;
  absl::MutexLock lock(&pool.mu_);
  if (lease->buffer.capacity > pool.max_kept_bytes_ || pool.max_kept_ <= 0) return;
  if (static_cast<int>(pool.kept_.size()) < pool.max_kept_) {
    pool.kept_.push_back(std::move(lease->buffer));
    return;
  }
  // Full: keep the larger of the returned buffer and the smallest kept one.
  auto smallest = std::min_element(
      pool.kept_.begin(), pool.kept_.end(),
      [](const Buffer& a, const Buffer& b) { return a.capacity < b.capacity; });
  if (smallest->capacity < lease->buffer.capacity) *smallest = std::move(lease->buffer);
}

namespace {

// Bytes of the request message; INVALID_ARGUMENT past protobuf's limit.
// Computes the samples' cached sizes.
absl::StatusOr<size_t> RequestBytes(absl::string_view pool, absl::Span<const v1::Sample> samples) {
  // proto3 leaves an empty string out.
  size_t total = pool.empty() ? 0 : wire::LengthDelimitedSize(kPoolField, pool.size());
  for (const v1::Sample& sample : samples) {
    total += wire::LengthDelimitedSize(kSamplesField, sample.ByteSizeLong());
  }
  if (total > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("PutSamples message of ", samples.size(), " samples would be ", total,
                     " bytes, past protobuf's 2 GiB limit; lower ClientOptions::batch_bytes"));
  }
  return total;
}

// Writes the request through `coded` with the samples' cached sizes; INTERNAL
// when it wrote another number of bytes than `expected` (a sample changed
// between sizing and writing: a reused buffer would send stale bytes of an
// earlier message in the gap).
absl::Status WriteRequest(absl::string_view pool, absl::Span<const v1::Sample> samples,
                          size_t expected, google::protobuf::io::CodedOutputStream* coded) {
  using google::protobuf::internal::WireFormatLite;
  // Map fields (token_fields) in key order: the same samples give the same bytes.
  coded->SetSerializationDeterministic(true);
  if (!pool.empty()) {
    coded->WriteTag(WireFormatLite::MakeTag(kPoolField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    coded->WriteVarint64(pool.size());
    coded->WriteRaw(pool.data(), static_cast<int>(pool.size()));
  }
  for (const v1::Sample& sample : samples) {
    coded->WriteTag(
        WireFormatLite::MakeTag(kSamplesField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    coded->WriteVarint64(sample.GetCachedSize());
    sample.SerializeWithCachedSizes(coded);
  }
  coded->Trim();
  const int64_t written = coded->ByteCount();
  if (coded->HadError() || written != static_cast<int64_t>(expected)) {
    return absl::InternalError(absl::StrCat("PutSamples message: wrote ", written,
                                            " bytes, sized ", expected,
                                            " (a sample changed while being encoded)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<grpc::ByteBuffer> EncodePutSamplesRequest(absl::string_view pool,
                                                         absl::Span<const v1::Sample> samples,
                                                         EncodeBufferPool* buffers) {
  ASSIGN_OR_RETURN(size_t total, RequestBytes(pool, samples));
  grpc_slice raw = buffers != nullptr ? buffers->Allocate(total) : grpc_slice_malloc(total);
  grpc::Slice slice(raw, grpc::Slice::STEAL_REF);  // released on every return
  {
    // Through `slice`: a message of a few bytes is held inside the slice
    // struct itself, and `raw` is only a copy of that struct.
    google::protobuf::io::ArrayOutputStream array(const_cast<uint8_t*>(slice.begin()),
                                                  static_cast<int>(total));
    google::protobuf::io::CodedOutputStream coded(&array);
    RETURN_IF_ERROR(WriteRequest(pool, samples, total, &coded));
  }
  return grpc::ByteBuffer(&slice, 1);
}

absl::StatusOr<grpc::ByteBuffer> EncodePutSamplesRequestBorrowing(
    absl::string_view pool, absl::Span<const v1::Sample> samples, BorrowedSlices* borrowed) {
  ASSIGN_OR_RETURN(size_t total, RequestBytes(pool, samples));
  SliceGatherStream gather(borrowed);
  {
    google::protobuf::io::CodedOutputStream coded(&gather);
    coded.EnableAliasing(true);
    RETURN_IF_ERROR(WriteRequest(pool, samples, total, &coded));
  }
  const std::vector<grpc::Slice> slices = gather.TakeSlices();
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// Write ... WritesDone on a generic bidi call (the server's method is client
// streaming; on the wire the two are the same), one message in flight.
class PutSamplesStream::Reactor final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, v1::PutSamplesResponse> {
 public:
  // Blocks until the message in flight has been taken by the transport.
  bool WaitForWrite() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&write_idle_));
    return write_ok_;
  }

  void Write(grpc::ByteBuffer message) {
    {
      absl::MutexLock lock(&mu_);
      in_flight_ = std::move(message);
      write_idle_ = false;
    }
    StartWrite(&in_flight_);
  }

  grpc::Status AwaitDone(v1::PutSamplesResponse* response) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    if (status_.ok()) {
      if (!response_read_) {
        return grpc::Status(grpc::StatusCode::INTERNAL, "PutSamples ended OK without a response");
      }
      *response = std::move(response_);
    }
    return status_;
  }

  v1::PutSamplesResponse* response_buffer() { return &response_; }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    write_ok_ = write_ok_ && ok;
    write_idle_ = true;
    in_flight_.Clear();  // the slice goes back as soon as it is sent
  }
  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    response_read_ = ok;
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }

 private:
  absl::Mutex mu_;
  grpc::ByteBuffer in_flight_;
  bool write_idle_ ABSL_GUARDED_BY(mu_) = true;
  bool write_ok_ ABSL_GUARDED_BY(mu_) = true;
  bool response_read_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  // Written by gRPC's read before OnReadDone, read after OnDone.
  v1::PutSamplesResponse response_;
};

PutSamplesStream::PutSamplesStream(const std::shared_ptr<grpc::Channel>& channel,
                                   std::unique_ptr<grpc::ClientContext> context)
    : context_(std::move(context)), stub_(channel), reactor_(std::make_unique<Reactor>()) {
  stub_.PrepareBidiStreamingCall(context_.get(), kPutSamplesMethod, grpc::StubOptions(),
                                 reactor_.get());
  // Without the hold, a call the server has already ended (a refused
  // message) could reach OnDone between two writes, and a write started after
  // OnDone never completes.
  reactor_->AddHold();
  reactor_->StartRead(reactor_->response_buffer());
  reactor_->StartCall();
}

PutSamplesStream::~PutSamplesStream() {
  if (finished_) return;
  context_->TryCancel();
  reactor_->WaitForWrite();
  reactor_->RemoveHold();
  v1::PutSamplesResponse ignored;
  reactor_->AwaitDone(&ignored);
}

bool PutSamplesStream::Write(grpc::ByteBuffer message) {
  if (!reactor_->WaitForWrite()) return false;
  reactor_->Write(std::move(message));
  return true;
}

grpc::Status PutSamplesStream::Finish(v1::PutSamplesResponse* response) {
  finished_ = true;
  if (reactor_->WaitForWrite()) reactor_->StartWritesDone();
  reactor_->RemoveHold();
  return reactor_->AwaitDone(response);
}

}  // namespace rollpack
