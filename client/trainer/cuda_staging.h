// Delivery to a CUDA device: micro-batches staged ahead of the consumer on a
// thread of their own, through pinned host memory, copied and unpacked on a
// CUDA stream of the library's, so that Next() only makes the consumer's
// stream wait on an event (docs/trainer.md). CUDA builds only.
#ifndef ROLLPACK_CLIENT_TRAINER_CUDA_STAGING_H_
#define ROLLPACK_CLIENT_TRAINER_CUDA_STAGING_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/microbatch_source.h"
#include "client/cpp/received_microbatch.h"
#include "client/trainer/batch_layout.h"
#include "client/trainer/batch_source.h"
#include "client/trainer/batch_state.h"
#include "client/trainer/device_stream_options.h"
#include "client/trainer/pinned_cache.h"
#include "grpcpp/channel.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack::trainer_internal {

// Shared with every batch's release function, so that memory freed after
// the stream is gone still finds its device and copy stream.
struct CudaState {
  int device = 0;
  cudaStream_t copy = nullptr;
  ~CudaState();
};


// Staged batches of one CUDA device; subclasses run the staging thread that
// fills the ready queue (one rank's own stream, or a TP group's).
class CudaSource : public BatchSource {
 public:
  explicit CudaSource(const DeviceStreamOptions& o) : options_(o) {}
  // Subclasses stop and join their staging thread first.
  ~CudaSource() override;

  absl::StatusOr<std::shared_ptr<DeviceBatch>> Next(void* consumer_stream) override;

 protected:
  struct Item {
    std::unique_ptr<BatchState> batch;  // nullptr: end (status OK) or error
    absl::Status status;
    cudaEvent_t ready = nullptr;
  };

  absl::Status InitCuda();

  // Blocks while the ready queue is full; false when stopping.
  bool Push(Item item);
  void PushEnd(absl::Status status);
  void Stop();
  bool stopping();

  // A pinned buffer of at least `size` bytes whose previous copy finished
  // (from the process's PinnedCache when one fits).
  absl::StatusOr<PinnedSlot*> AcquirePinned(size_t size);

  // Device memory for a batch, released stream-ordered after the consumer.
  absl::StatusOr<char*> AllocBatch(BatchState* b, int64_t bytes);

  // Copies `m`'s arrays (all slots) through pinned memory into `base`. Does
  // not record the ready event.
  absl::Status StageFromHost(const v1::Microbatch& m, const Layout& l, char* base);
  absl::Status StageFromHost(const ReceivedMicrobatch& m, const Layout& l, char* base);

  // The last stage of every path (own stream, TP leader, TP follower): ids
  // unpacked on the copy stream, the event the consumer waits on recorded,
  // the wire metadata dropped, the batch handed to `item`.
  absl::Status UnpackAndPublish(std::unique_ptr<BatchState> b, const Layout& l, Item* item);

  const DeviceStreamOptions options_;
  std::shared_ptr<CudaState> state_;

 private:
  template <typename Message>
  absl::Status StageArrays(const Message& m, const Layout& l, char* base);
  absl::Status Unpack(BatchState* b, const Layout& l);
  absl::StatusOr<cudaEvent_t> RecordReady();

  std::vector<PinnedSlot> pinned_;
  size_t next_pinned_ = 0;
  absl::Mutex mu_;
  std::deque<Item> ready_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// One rank reading its own micro-batches (sources(rank)) onto options.device.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenCudaSource(MicrobatchSourceOpener sources,
                                                            const v1::RankCoords& rank,
                                                            const DeviceStreamOptions& options);

}  // namespace rollpack::trainer_internal

#endif  // ROLLPACK_CLIENT_TRAINER_CUDA_STAGING_H_
