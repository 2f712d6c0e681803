// Serializing a protobuf message into gRPC slices without copying its large
// bytes fields: protobuf's own serializer writes tags, lengths and small
// fields into blocks of ours, and hands the bytes fields that do not fit the
// block it is writing (routing arrays, tokens, token fields of any size) to
// SliceGatherStream::WriteAliasedRaw, which sends them as slices pointing at
// the message's own memory. The bytes are exactly what the serializer
// writes without aliasing; the producer saves one copy of every payload byte
// (docs/performance.md).
#ifndef ROLLPACK_PROTO_WIRE_SLICE_GATHER_STREAM_H_
#define ROLLPACK_PROTO_WIRE_SLICE_GATHER_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "grpc/slice.h"
#include "grpcpp/support/slice.h"

namespace rollpack {

// Counts the slices lent out of a caller's memory that gRPC still holds: the
// memory must not change or go away until they are all back. gRPC releases a
// sent slice once the transport has written it, or when its call or
// connection ends. Thread-safe; the destructor waits for every slice.
class BorrowedSlices {
 public:
  BorrowedSlices() = default;
  ~BorrowedSlices() { AwaitReturned(); }

  BorrowedSlices(const BorrowedSlices&) = delete;
  BorrowedSlices& operator=(const BorrowedSlices&) = delete;

  // A slice of `size` bytes at `data`, not copied (one reference, the
  // caller's).
  grpc_slice Lend(const void* data, size_t size);
  // Blocks until every slice lent has been released.
  void AwaitReturned();
  // Slices not released yet.
  int64_t outstanding() const;

 private:
  static void Return(void* self);

  mutable absl::Mutex mu_;
  int64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;
};

// A ZeroCopyOutputStream that gathers what is written into gRPC slices:
// written bytes go into 64 KiB blocks of its own, aliased bytes (a
// CodedOutputStream with EnableAliasing) are lent from the caller's memory
// through `borrowed`. Not thread-safe.
class SliceGatherStream final : public google::protobuf::io::ZeroCopyOutputStream {
 public:
  explicit SliceGatherStream(BorrowedSlices* borrowed) : borrowed_(borrowed) {}

  bool Next(void** data, int* size) override;
  void BackUp(int count) override;
  int64_t ByteCount() const override { return byte_count_; }
  bool AllowsAliasing() const override { return true; }
  bool WriteAliasedRaw(const void* data, int size) override;

  // The slices, in order; the stream is empty afterwards.
  std::vector<grpc::Slice> TakeSlices();

 private:
  // Ends the run of written bytes since the last slice, as a slice.
  void CloseWrittenRun();

  BorrowedSlices* const borrowed_;
  std::vector<grpc::Slice> slices_;
  grpc::Slice block_;
  uint8_t* run_begin_ = nullptr;  // written bytes not yet in slices_
  uint8_t* cursor_ = nullptr;     // the end of what Next handed out
  uint8_t* block_end_ = nullptr;
  int64_t byte_count_ = 0;
};

}  // namespace rollpack

#endif  // ROLLPACK_PROTO_WIRE_SLICE_GATHER_STREAM_H_
