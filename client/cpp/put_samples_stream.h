// The producer's side of Rollouts.PutSamples without the request copy: each
// request message is encoded by hand into gRPC slices, the samples
// serialized straight into them (or, borrowing, their payload bytes sent
// from where they are), and written while the caller encodes the next.
//
// Building a v1::PutSamplesRequest copies every sample into it and gRPC then
// serializes that copy again; with payloads of gigabytes the single producer
// spent more CPU on those two copies (and the page faults of their fresh
// buffers) than the server spent storing the bytes (docs/performance.md).
#ifndef ROLLPACK_CLIENT_CPP_PUT_SAMPLES_STREAM_H_
#define ROLLPACK_CLIENT_CPP_PUT_SAMPLES_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "proto/wire/slice_gather_stream.h"
#include "grpc/slice.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "rollpack/v1/rollouts.pb.h"

namespace rollpack {

// Memory for encoded request messages, handed back when gRPC releases a
// sent message's slice and reused by the next: a fresh multi-megabyte buffer
// per message costs the producer a page fault and zeroing per 4 KiB, as much
// CPU as the encoding copy itself. Keeps at most `max_kept` buffers of at
// most `max_kept_bytes` each (larger messages get memory of their own).
// Thread-safe; shared by a client's calls (slices may outlive a call, and
// keep the pool alive until they go).
class EncodeBufferPool : public std::enable_shared_from_this<EncodeBufferPool> {
 public:
  static std::shared_ptr<EncodeBufferPool> Create(int max_kept = 3,
                                                  size_t max_kept_bytes = size_t{64} << 20);

  // A slice of exactly `size` bytes backed by the smallest kept buffer that
  // is big enough; its memory returns here when the slice's last reference
  // goes.
  grpc_slice Allocate(size_t size);

 private:
  struct Buffer {
    std::unique_ptr<uint8_t[]> data;
    size_t capacity = 0;
  };
  struct Lease;
  static void Release(void* lease);

  EncodeBufferPool(int max_kept, size_t max_kept_bytes)
      : max_kept_(max_kept), max_kept_bytes_(max_kept_bytes) {}

  const int max_kept_;
  const size_t max_kept_bytes_;
  absl::Mutex mu_;
  std::vector<Buffer> kept_ ABSL_GUARDED_BY(mu_);
};

// The bytes of a v1::PutSamplesRequest{pool, samples}, as
// SerializeAsString() would write them, in one slice (from `buffers` when
// given). The samples' cached sizes are computed here (ByteSizeLong), so they
// must not change meanwhile: INTERNAL if the bytes written differ from the
// size computed, INVALID_ARGUMENT past protobuf's 2 GiB message limit.
absl::StatusOr<grpc::ByteBuffer> EncodePutSamplesRequest(absl::string_view pool,
                                                         absl::Span<const v1::Sample> samples,
                                                         EncodeBufferPool* buffers = nullptr);

// The same bytes without copying the samples' payload: the message's slices
// point into `samples` for every bytes field that does not fit the 64 KiB
// block being written (proto/wire/slice_gather_stream.h), lent through
// `borrowed`; the samples must not change or go away until `borrowed` has
// them all back (BorrowedSlices::AwaitReturned, or its destructor).
absl::StatusOr<grpc::ByteBuffer> EncodePutSamplesRequestBorrowing(
    absl::string_view pool, absl::Span<const v1::Sample> samples, BorrowedSlices* borrowed);

// One PutSamples call fed with encoded request messages. Not thread-safe: one
// producer thread calls Write ... Finish. At most one message is in flight;
// Write returns once the previous message has been handed to the transport,
// so the caller encodes message i + 1 while message i is sent.
class PutSamplesStream {
 public:
  // Starts the call; `context` carries the caller's deadline and metadata.
  PutSamplesStream(const std::shared_ptr<grpc::Channel>& channel,
                   std::unique_ptr<grpc::ClientContext> context);
  // Cancels a call not finished (the server rolls back nothing: each message
  // it received was committed on its own) and waits for it to end.
  ~PutSamplesStream();

  PutSamplesStream(const PutSamplesStream&) = delete;
  PutSamplesStream& operator=(const PutSamplesStream&) = delete;

  // Queues `message` after the one in flight. False once the call has
  // failed; Finish then says why.
  bool Write(grpc::ByteBuffer message);
  // Half-closes, waits for the server's answer.
  grpc::Status Finish(v1::PutSamplesResponse* response);
  // From any thread, at any time: ends the call with CANCELLED unless it has
  // ended already (the server commits none of its messages not yet
  // committed). Write and Finish on the owning thread then fail.
  void Cancel() { context_->TryCancel(); }

 private:
  class Reactor;

  std::unique_ptr<grpc::ClientContext> context_;
  grpc::TemplatedGenericStub<grpc::ByteBuffer, v1::PutSamplesResponse> stub_;
  std::unique_ptr<Reactor> reactor_;
  bool finished_ = false;
};

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_CPP_PUT_SAMPLES_STREAM_H_
