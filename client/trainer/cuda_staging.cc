#include "client/trainer/cuda_staging.h"

#include <algorithm>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/cpp/microbatch_source.h"
#include "client/trainer/cuda_check.h"
#include "kernels/replay_kernels_absl.h"
#include "kernels/replay_kernels_cuda.h"

namespace rollpack::trainer_internal {

CudaState::~CudaState() {
  if (copy != nullptr) {
    DeviceGuard g(device);
    cudaStreamSynchronize(copy);
    cudaStreamDestroy(copy);
  }
}

CudaSource::~CudaSource() {
  DeviceGuard g(state_ != nullptr ? state_->device : 0);
  {
    absl::MutexLock lock(&mu_);
    for (Item& item : ready_) {
      if (item.ready != nullptr) cudaEventDestroy(item.ready);
    }
    ready_.clear();  // batches not handed out: their memory is released
  }
  // Kept for the next stream (its copies may still run: the taker waits
  // on `done`), not unpinned here on the consumer's way out.
  for (PinnedSlot& s : pinned_) {
    PinnedCache::Get().Give(state_ != nullptr ? state_->device : 0, std::exchange(s, {}));
  }
}

absl::Status CudaSource::InitCuda() {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device: ", cudaGetErrorString(e)));
  }
  if (options_.device < 0 || options_.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", options_.device, " does not exist (", count, " devices)"));
  }
  state_ = std::make_shared<CudaState>();
  state_->device = options_.device;
  DeviceGuard g(options_.device);
  RP_CUDA(cudaStreamCreateWithFlags(&state_->copy, cudaStreamNonBlocking));
  // Batches are allocated stream-ordered from the device's default pool;
  // keep up to 1 GiB cached instead of returning it at every sync.
  cudaMemPool_t pool = nullptr;
  if (cudaDeviceGetDefaultMemPool(&pool, options_.device) == cudaSuccess) {
    uint64_t keep = uint64_t{1} << 30, current = 0;
    cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &current);
    if (current < keep) cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  pinned_.resize(static_cast<size_t>(std::max(1, options_.prefetch)) + 2);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<DeviceBatch>> CudaSource::Next(void* consumer_stream) {
  Item item;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](CudaSource* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return !s->ready_.empty(); },
        this));
    if (ready_.front().batch == nullptr) {  // end or error: stays for later calls
      if (ready_.front().status.ok()) return std::shared_ptr<DeviceBatch>();
      return ready_.front().status;
    }
    item = std::move(ready_.front());
    ready_.pop_front();
  }
  DeviceGuard g(state_->device);
  RP_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(consumer_stream), item.ready, 0));
  cudaEventDestroy(item.ready);
  item.batch->consumer_stream = consumer_stream;
  return std::make_shared<DeviceBatch>(std::move(item.batch));
}

bool CudaSource::Push(Item item) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](CudaSource* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
        return s->stop_ || static_cast<int>(s->ready_.size()) < std::max(1, s->options_.prefetch);
      },
      this));
  if (stop_) {
    if (item.ready != nullptr) cudaEventDestroy(item.ready);
    return false;
  }
  ready_.push_back(std::move(item));
  return true;
}

void CudaSource::PushEnd(absl::Status status) {
  absl::MutexLock lock(&mu_);
  Item item;
  item.status = std::move(status);
  ready_.push_back(std::move(item));
}

void CudaSource::Stop() {
  absl::MutexLock lock(&mu_);
  stop_ = true;
}

bool CudaSource::stopping() {
  absl::MutexLock lock(&mu_);
  return stop_;
}

absl::StatusOr<PinnedSlot*> CudaSource::AcquirePinned(size_t size) {
  PinnedSlot& s = pinned_[next_pinned_++ % pinned_.size()];
  if (s.size < size) {
    PinnedCache& cache = PinnedCache::Get();
    cache.Give(state_->device, std::exchange(s, {}));
    if (std::optional<PinnedSlot> kept = cache.Take(state_->device, size); kept.has_value()) {
      s = *kept;
    } else {
      const size_t want = std::max<size_t>(size, size_t{1} << 20) * 5 / 4;
      RP_CUDA(cudaHostAlloc(&s.ptr, want, cudaHostAllocDefault));
      s.size = want;
    }
  }
  if (s.done != nullptr) RP_CUDA(cudaEventSynchronize(s.done));
  if (s.done == nullptr) RP_CUDA(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  return &s;
}

absl::StatusOr<char*> CudaSource::AllocBatch(BatchState* b, int64_t bytes) {
  void* p = nullptr;
  RP_CUDA(cudaMallocAsync(&p, std::max<int64_t>(bytes, 1), state_->copy));
  std::shared_ptr<CudaState> state = state_;
  b->device = state_->device;
  b->release = [state, p](void* consumer) {
    DeviceGuard g(state->device);
    cudaEvent_t ev = nullptr;
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess) {
      cudaEventRecord(ev, static_cast<cudaStream_t>(consumer));
      cudaStreamWaitEvent(state->copy, ev, 0);
      cudaEventDestroy(ev);
    } else {
      cudaStreamSynchronize(static_cast<cudaStream_t>(consumer));
    }
    cudaFreeAsync(p, state->copy);
  };
  return static_cast<char*>(p);
}

template <typename Message>
absl::Status CudaSource::StageArrays(const Message& m, const Layout& l, char* base) {
  if (l.arrays_bytes > 0) {
    absl::StatusOr<PinnedSlot*> slot = AcquirePinned(l.arrays_bytes);
    if (!slot.ok()) return slot.status();
    char* host = static_cast<char*>((*slot)->ptr);
    for (const Slot& s : l.slots) {
      if (s.bytes > 0) CopySlot(m, s, host + s.offset);
    }
    RP_CUDA(cudaMemcpyAsync(base, host, l.arrays_bytes, cudaMemcpyHostToDevice, state_->copy));
    RP_CUDA(cudaEventRecord((*slot)->done, state_->copy));
  }
  return absl::OkStatus();
}

absl::Status CudaSource::StageFromHost(const v1::Microbatch& m, const Layout& l, char* base) {
  return StageArrays(m, l, base);
}

absl::Status CudaSource::StageFromHost(const ReceivedMicrobatch& m, const Layout& l,
                                       char* base) {
  return StageArrays(m, l, base);
}

absl::Status CudaSource::Unpack(BatchState* b, const Layout& l) {
  if (l.ids_bytes == 0) return absl::OkStatus();
  kernels::UnpackArgs a = MakeUnpack(l, b->replay_experts, b->replay_mask, b->replay_ids.data,
                                     options_.ids_int32, options_.masked_fill_minus_one);
  return kernels::ToAbslStatus(kernels::cuda::Unpack(a, state_->copy));
}

absl::StatusOr<cudaEvent_t> CudaSource::RecordReady() {
  cudaEvent_t ev = nullptr;
  RP_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  RP_CUDA(cudaEventRecord(ev, state_->copy));
  return ev;
}

absl::Status CudaSource::UnpackAndPublish(std::unique_ptr<BatchState> b, const Layout& l,
                                          Item* item) {
  if (absl::Status s = Unpack(b.get(), l); !s.ok()) return s;
  absl::StatusOr<cudaEvent_t> ev = RecordReady();
  if (!ev.ok()) return ev.status();
  ClearData(&b->meta);
  item->batch = std::move(b);
  item->ready = *ev;
  return absl::OkStatus();
}

namespace {

class LocalCudaSource final : public CudaSource {
 public:
  LocalCudaSource(std::unique_ptr<MicrobatchSource> stream, const DeviceStreamOptions& o)
      : CudaSource(o), stream_(std::move(stream)) {}

  absl::Status Start() {
    if (absl::Status s = InitCuda(); !s.ok()) return s;
    thread_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  ~LocalCudaSource() override {
    Stop();
    stream_->Cancel();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop() {
    DeviceGuard g(state_->device);
    while (!stopping()) {
      absl::StatusOr<std::optional<ReceivedMicrobatch>> next = stream_->NextReceived();
      if (!next.ok() || !next->has_value()) {
        PushEnd(next.ok() ? absl::OkStatus() : next.status());
        return;
      }
      Item item;
      absl::Status s = Stage(std::move(**next), &item);
      if (!s.ok()) {
        PushEnd(s);
        return;
      }
      if (!Push(std::move(item))) return;
    }
  }

  // The arrays go from gRPC's received slices straight into pinned memory:
  // one copy on the host, not a parse into strings and a copy of those.
  absl::Status Stage(ReceivedMicrobatch m, Item* item) {
    auto b = std::make_unique<BatchState>();
    b->meta = m.meta();
    absl::StatusOr<Layout> l = ComputeLayout(b->meta, options_.ids_int32, options_.replay_ids);
    if (!l.ok()) return l.status();
    if (absl::Status s = CheckBytes(m, *l); !s.ok()) return s;
    absl::StatusOr<char*> base = AllocBatch(b.get(), l->total);
    if (!base.ok()) return base.status();
    AssignViews(*l, *base, *base + l->ids_offset, options_.ids_int32, b.get());
    if (absl::Status s = StageFromHost(m, *l, *base); !s.ok()) return s;
    return UnpackAndPublish(std::move(b), *l, item);
  }

  const std::unique_ptr<MicrobatchSource> stream_;
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> OpenCudaSource(MicrobatchSourceOpener sources,
                                                            const v1::RankCoords& rank,
                                                            const DeviceStreamOptions& options) {
  absl::StatusOr<std::unique_ptr<MicrobatchSource>> stream = sources(rank);
  if (!stream.ok()) return stream.status();
  auto source = std::make_unique<LocalCudaSource>(*std::move(stream), options);
  if (absl::Status s = source->Start(); !s.ok()) return s;
  return std::unique_ptr<BatchSource>(std::move(source));
}

}  // namespace rollpack::trainer_internal
