#include "proto/wire/slice_gather_stream.h"

#include <utility>

namespace rollpack {
namespace {

constexpr size_t kBlockBytes = size_t{64} << 10;
// Below this much room left a block is closed: the serializer copies a bytes
// field that fits the room left and lends one that does not, so small rooms
// would lend many small fields. (At a block's end a small field may still be
// lent, at most about one per block.)
constexpr ptrdiff_t kMinRoom = 4 << 10;

}  // namespace

grpc_slice BorrowedSlices::Lend(const void* data, size_t size) {
  {
    absl::MutexLock lock(&mu_);
    ++outstanding_;
  }
  // gRPC never writes through a slice it sends.
  return grpc_slice_new_with_user_data(const_cast<void*>(data), size, &BorrowedSlices::Return,
                                       this);
}

void BorrowedSlices::Return(void* self) {
  auto* borrowed = static_cast<BorrowedSlices*>(self);
  absl::MutexLock lock(&borrowed->mu_);
  --borrowed->outstanding_;
}

void BorrowedSlices::AwaitReturned() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int64_t* outstanding) { return *outstanding == 0; }, &outstanding_));
}

int64_t BorrowedSlices::outstanding() const {
  absl::MutexLock lock(&mu_);
  return outstanding_;
}

bool SliceGatherStream::Next(void** data, int* size) {
  if (block_end_ - cursor_ < kMinRoom) {
    CloseWrittenRun();
    block_ = grpc::Slice(kBlockBytes);  // not zeroed: only written bytes are sent
    cursor_ = run_begin_ = const_cast<uint8_t*>(block_.begin());
    block_end_ = cursor_ + kBlockBytes;
  }
  *data = cursor_;
  *size = static_cast<int>(block_end_ - cursor_);
  byte_count_ += *size;
  cursor_ = block_end_;
  return true;
}

void SliceGatherStream::BackUp(int count) {
  cursor_ -= count;
  byte_count_ -= count;
}

bool SliceGatherStream::WriteAliasedRaw(const void* data, int size) {
  CloseWrittenRun();
  slices_.emplace_back(borrowed_->Lend(data, static_cast<size_t>(size)), grpc::Slice::STEAL_REF);
  byte_count_ += size;
  return true;
}

void SliceGatherStream::CloseWrittenRun() {
  if (cursor_ == run_begin_) return;
  const uint8_t* const begin = block_.begin();
  slices_.push_back(block_.sub(run_begin_ - begin, cursor_ - begin));
  run_begin_ = cursor_;
}

std::vector<grpc::Slice> SliceGatherStream::TakeSlices() {
  CloseWrittenRun();
  std::vector<grpc::Slice> slices = std::move(slices_);
  slices_.clear();
  return slices;
}

}  // namespace rollpack
