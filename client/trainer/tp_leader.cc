#include "client/trainer/tp_leader.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/microbatch_source.h"
#include "client/trainer/batch_layout.h"
#include "client/trainer/cuda_check.h"
#include "client/trainer/cuda_staging.h"
#include "client/trainer/nccl_loader.h"
#include "client/trainer/tp_communicator.h"

namespace rollpack::trainer_internal {
namespace {

class TpLeaderSource final : public CudaSource {
 public:
  TpLeaderSource(MicrobatchSourceOpener sources, std::shared_ptr<grpc::Channel> channel,
                 std::string step_id, v1::RankCoords rank, const DeviceStreamOptions& o)
      : CudaSource(o),
        sources_(std::move(sources)),
        channel_(std::move(channel)),
        step_id_(std::move(step_id)),
        rank_(rank) {}

  absl::Status Start() {
    absl::StatusOr<const Nccl*> nccl = LoadNccl();
    if (!nccl.ok()) return nccl.status();
    nccl_ = *nccl;
    const int size = options_.tp_leader_size;
    if (rank_.tp() < 0 || rank_.tp() >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat("tp rank ", rank_.tp(), " outside the TP group of size ", size));
    }
    if (absl::Status s = InitCuda(); !s.ok()) return s;
    leader_ = rank_.tp() == 0;
    if (leader_) {
      for (int t = 0; t < size; ++t) {
        v1::RankCoords c = rank_;
        c.set_tp(t);
        absl::StatusOr<std::unique_ptr<MicrobatchSource>> stream = sources_(c);
        if (!stream.ok()) return stream.status();
        streams_.push_back(*std::move(stream));
      }
    }
    {
      DeviceGuard g(state_->device);
      RP_CUDA(cudaMalloc(&scratch_dev_, 8));
      RP_CUDA(cudaHostAlloc(&scratch_host_, 8, cudaHostAllocDefault));
    }
    absl::StatusOr<TpGroupComm> comm = ConnectTpGroup(*nccl_, channel_, step_id_, rank_, options_);
    if (!comm.ok()) return comm.status();
    comm_ = *std::move(comm);
    thread_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  ~TpLeaderSource() override {
    Stop();
    for (auto& s : streams_) s->Cancel();
    bool aborted = false;
    if (thread_.joinable()) {
      // A rank blocked in NCCL (its peer died) is released by an abort.
      absl::MutexLock lock(&thread_mu_);
      if (!thread_mu_.AwaitWithTimeout(absl::Condition(&thread_done_), absl::Seconds(10)) &&
          comm_.comm != nullptr) {
        nccl_->CommAbort(comm_.comm);
        comm_.comm = nullptr;
        aborted = true;
      }
    }
    if (thread_.joinable()) thread_.join();
    DeviceGuard g(state_ != nullptr ? state_->device : 0);
    const bool synced = state_ != nullptr && cudaStreamSynchronize(state_->copy) == cudaSuccess;
    if (comm_.comm != nullptr) {
      bool clean = false;
      {
        absl::MutexLock lock(&thread_mu_);
        clean = clean_end_;
      }
      FinishTpGroup(*nccl_, rank_, options_, std::move(comm_), clean && synced && !aborted);
    }
    if (scratch_dev_ != nullptr) cudaFree(scratch_dev_);
    if (scratch_host_ != nullptr) cudaFreeHost(scratch_host_);
    if (header_dev_ != nullptr) cudaFree(header_dev_);
    if (header_host_ != nullptr) cudaFreeHost(header_host_);
  }

 private:
  void Loop() {
    bool clean = false;
    {
      DeviceGuard g(state_->device);
      while (!stopping()) {
        Item item;
        bool end = false;
        absl::Status s = leader_ ? LeaderStep(&item, &end) : FollowerStep(&item, &end);
        if (!s.ok() || end) {
          clean = s.ok() && end;
          PushEnd(s);
          break;
        }
        if (!Push(std::move(item))) break;
      }
    }
    absl::MutexLock lock(&thread_mu_);
    thread_done_ = true;
    clean_end_ = clean;
  }

  absl::Status EnsureHeader(int64_t bytes) {
    if (bytes <= header_cap_) return absl::OkStatus();
    if (header_dev_ != nullptr) RP_CUDA(cudaFree(header_dev_));
    if (header_host_ != nullptr) RP_CUDA(cudaFreeHost(header_host_));
    header_dev_ = nullptr;
    header_host_ = nullptr;
    header_cap_ = std::max<int64_t>(bytes * 2, 4096);
    RP_CUDA(cudaMalloc(&header_dev_, header_cap_));
    RP_CUDA(cudaHostAlloc(&header_host_, header_cap_, cudaHostAllocDefault));
    return absl::OkStatus();
  }

  // Header: int64 length (> 0 batch, 0 end, -1 the leader failed), then per
  // TP rank a uint64 length + the Microbatch with its big arrays cleared.
  absl::Status BroadcastLength(int64_t* length) {
    cudaStream_t st = state_->copy;
    if (leader_) {
      RP_CUDA(cudaStreamSynchronize(st));  // the scratch may still be in use
      std::memcpy(scratch_host_, length, 8);
      RP_CUDA(cudaMemcpyAsync(scratch_dev_, scratch_host_, 8, cudaMemcpyHostToDevice, st));
    }
    RP_NCCL(nccl_->Broadcast(scratch_dev_, scratch_dev_, 8, kNcclUint8, 0, comm_.comm, st));
    if (!leader_) {
      RP_CUDA(cudaMemcpyAsync(scratch_host_, scratch_dev_, 8, cudaMemcpyDeviceToHost, st));
      RP_CUDA(cudaStreamSynchronize(st));
      std::memcpy(length, scratch_host_, 8);
    }
    return absl::OkStatus();
  }

  absl::Status BroadcastHeader(std::string* header) {
    cudaStream_t st = state_->copy;
    const int64_t n = static_cast<int64_t>(header->size());
    if (absl::Status s = EnsureHeader(n); !s.ok()) return s;
    if (leader_) {
      RP_CUDA(cudaStreamSynchronize(st));
      std::memcpy(header_host_, header->data(), n);
      RP_CUDA(cudaMemcpyAsync(header_dev_, header_host_, n, cudaMemcpyHostToDevice, st));
    }
    RP_NCCL(nccl_->Broadcast(header_dev_, header_dev_, n, kNcclUint8, 0, comm_.comm, st));
    if (!leader_) {
      RP_CUDA(cudaMemcpyAsync(header_host_, header_dev_, n, cudaMemcpyDeviceToHost, st));
      RP_CUDA(cudaStreamSynchronize(st));
      std::memcpy(header->data(), header_host_, n);
    }
    return absl::OkStatus();
  }

  static v1::Microbatch MetaOnly(const v1::Microbatch& m) {
    v1::Microbatch meta = m;
    ClearData(&meta);  // cu_seqlens stay: small, and every rank copies its own
    return meta;
  }

  // Tokens, token fields and ragged token fields (identical on every TP
  // rank) are broadcast.
  absl::Status BroadcastShared(const Layout& l, char* base) {
    for (const Slot& s : l.slots) {
      if (s.bytes == 0) continue;
      if (SameOnEveryTpRank(s.name)) {
        RP_NCCL(nccl_->Broadcast(base + s.offset, base + s.offset, s.bytes, kNcclUint8, 0,
                                 comm_.comm, state_->copy));
      }
    }
    return absl::OkStatus();
  }

  absl::Status LeaderStep(Item* item, bool* end) {
    const int size = options_.tp_leader_size;
    std::vector<v1::Microbatch> msgs(size);
    int ended = 0;
    absl::Status error;
    for (int t = 0; t < size; ++t) {
      absl::StatusOr<std::optional<v1::Microbatch>> next = streams_[t]->Next();
      if (!next.ok()) {
        error = next.status();
        break;
      }
      if (!next->has_value()) {
        ++ended;
        continue;
      }
      msgs[t] = std::move(**next);
    }
    if (error.ok() && ended != 0 && ended != size) {
      error = absl::InternalError("the TP ranks' streams ended at different micro-batches");
    }
    int64_t length = 0;
    if (!error.ok()) {
      length = -1;
      BroadcastLength(&length).IgnoreError();
      return error;
    }
    std::vector<Layout> layouts(size);
    std::string header;
    if (ended == 0) {
      for (int t = 0; t < size; ++t) {
        absl::StatusOr<Layout> l = ComputeLayout(msgs[t], options_.ids_int32, options_.replay_ids);
        if (!l.ok()) error = l.status();
        else if (absl::Status s = CheckBytes(msgs[t], *l); !s.ok()) error = s;
        if (!error.ok()) break;
        layouts[t] = *l;
        const std::string one = MetaOnly(msgs[t]).SerializeAsString();
        const uint64_t n = one.size();
        header.append(reinterpret_cast<const char*>(&n), 8);
        header.append(one);
      }
      if (!error.ok()) {
        length = -1;
        BroadcastLength(&length).IgnoreError();
        return error;
      }
      length = static_cast<int64_t>(header.size());
    }
    if (absl::Status s = BroadcastLength(&length); !s.ok()) return s;
    if (length == 0) {
      *end = true;
      return absl::OkStatus();
    }
    if (absl::Status s = BroadcastHeader(&header); !s.ok()) return s;

    // Own batch, staged from the host as in the local path.
    auto b = std::make_unique<BatchState>();
    b->meta = std::move(msgs[0]);
    const Layout& l0 = layouts[0];
    absl::StatusOr<char*> base = AllocBatch(b.get(), l0.total);
    if (!base.ok()) return base.status();
    AssignViews(l0, *base, *base + l0.ids_offset, options_.ids_int32, b.get());
    if (absl::Status s = StageFromHost(b->meta, l0, *base); !s.ok()) return s;
    if (absl::Status s = BroadcastShared(l0, *base); !s.ok()) return s;

    // The other ranks' replay rows + masks: one pinned buffer, one temporary
    // device buffer, grouped sends.
    std::vector<int64_t> off(size, 0);
    int64_t total = 0;
    for (int t = 1; t < size; ++t) {
      off[t] = total;
      total += AlignUp(FindSlot(layouts[t], "replay_experts")->bytes) +
               AlignUp(FindSlot(layouts[t], "replay_mask")->bytes);
    }
    if (total > 0) {
      absl::StatusOr<PinnedSlot*> slot = AcquirePinned(total);
      if (!slot.ok()) return slot.status();
      char* host = static_cast<char*>((*slot)->ptr);
      for (int t = 1; t < size; ++t) {
        const int64_t eb = FindSlot(layouts[t], "replay_experts")->bytes;
        const int64_t mb = FindSlot(layouts[t], "replay_mask")->bytes;
        if (eb > 0) std::memcpy(host + off[t], msgs[t].replay_experts().data().data(), eb);
        if (mb > 0) {
          std::memcpy(host + off[t] + AlignUp(eb), msgs[t].replay_mask().data().data(), mb);
        }
      }
      void* tmp = nullptr;
      RP_CUDA(cudaMallocAsync(&tmp, total, state_->copy));
      RP_CUDA(cudaMemcpyAsync(tmp, host, total, cudaMemcpyHostToDevice, state_->copy));
      RP_CUDA(cudaEventRecord((*slot)->done, state_->copy));
      RP_NCCL(nccl_->GroupStart());
      for (int t = 1; t < size; ++t) {
        const int64_t eb = FindSlot(layouts[t], "replay_experts")->bytes;
        const int64_t mb = FindSlot(layouts[t], "replay_mask")->bytes;
        char* p = static_cast<char*>(tmp) + off[t];
        if (eb > 0) RP_NCCL(nccl_->Send(p, eb, kNcclUint8, t, comm_.comm, state_->copy));
        if (mb > 0) {
          RP_NCCL(nccl_->Send(p + AlignUp(eb), mb, kNcclUint8, t, comm_.comm, state_->copy));
        }
      }
      RP_NCCL(nccl_->GroupEnd());
      RP_CUDA(cudaFreeAsync(tmp, state_->copy));
    }
    return UnpackAndPublish(std::move(b), l0, item);
  }

  absl::Status FollowerStep(Item* item, bool* end) {
    int64_t length = 0;
    if (absl::Status s = BroadcastLength(&length); !s.ok()) return s;
    if (length == 0) {
      *end = true;
      return absl::OkStatus();
    }
    if (length < 0) return absl::AbortedError("the TP leader's stream failed (see its error)");
    std::string header(length, '\0');
    if (absl::Status s = BroadcastHeader(&header); !s.ok()) return s;
    // Find this rank's entry.
    size_t pos = 0;
    v1::Microbatch meta;
    for (int t = 0; t < options_.tp_leader_size; ++t) {
      uint64_t n = 0;
      if (pos + 8 > header.size()) return absl::DataLossError("short TP header");
      std::memcpy(&n, header.data() + pos, 8);
      pos += 8;
      if (pos + n > header.size()) return absl::DataLossError("short TP header");
      if (t == rank_.tp() && !meta.ParseFromArray(header.data() + pos, static_cast<int>(n))) {
        return absl::DataLossError("bad TP header entry");
      }
      pos += n;
    }
    auto b = std::make_unique<BatchState>();
    b->meta = std::move(meta);
    absl::StatusOr<Layout> l = ComputeLayout(b->meta, options_.ids_int32, options_.replay_ids);
    if (!l.ok()) return l.status();
    absl::StatusOr<char*> base = AllocBatch(b.get(), l->total);
    if (!base.ok()) return base.status();
    AssignViews(*l, *base, *base + l->ids_offset, options_.ids_int32, b.get());
    // cu_seqlens and the per-sequence arrays (advantages, scalars) came in
    // the header: each rank copies its own from there.
    if (absl::Status s = CheckMetaBytes(b->meta, *l); !s.ok()) {
      return absl::DataLossError(absl::StrCat("TP header: ", s.message()));
    }
    int64_t small = 0;
    for (const Slot& s : l->slots) {
      if (KeptInMeta(s.name)) small += AlignUp(s.bytes);
    }
    if (small > 0) {
      absl::StatusOr<PinnedSlot*> slot = AcquirePinned(small);
      if (!slot.ok()) return slot.status();
      char* host = static_cast<char*>((*slot)->ptr);
      int64_t at = 0;
      for (const Slot& s : l->slots) {
        if (!KeptInMeta(s.name) || s.bytes == 0) continue;
        CopyData(b->meta, s.name, host + at);
        RP_CUDA(cudaMemcpyAsync(*base + s.offset, host + at, s.bytes, cudaMemcpyHostToDevice,
                                state_->copy));
        at += AlignUp(s.bytes);
      }
      RP_CUDA(cudaEventRecord((*slot)->done, state_->copy));
    }
    if (absl::Status s = BroadcastShared(*l, *base); !s.ok()) return s;
    const Slot* ex = FindSlot(*l, "replay_experts");
    const Slot* mk = FindSlot(*l, "replay_mask");
    if (ex->bytes > 0 || mk->bytes > 0) {
      RP_NCCL(nccl_->GroupStart());
      if (ex->bytes > 0) {
        RP_NCCL(nccl_->Recv(*base + ex->offset, ex->bytes, kNcclUint8, 0, comm_.comm,
                            state_->copy));
      }
      if (mk->bytes > 0) {
        RP_NCCL(nccl_->Recv(*base + mk->offset, mk->bytes, kNcclUint8, 0, comm_.comm,
                            state_->copy));
      }
      RP_NCCL(nccl_->GroupEnd());
    }
    return UnpackAndPublish(std::move(b), *l, item);
  }

  const Nccl* nccl_ = nullptr;
  const MicrobatchSourceOpener sources_;
  std::shared_ptr<grpc::Channel> channel_;
  const std::string step_id_;
  const v1::RankCoords rank_;
  bool leader_ = false;
  std::vector<std::unique_ptr<MicrobatchSource>> streams_;
  TpGroupComm comm_;
  void* scratch_dev_ = nullptr;
  void* scratch_host_ = nullptr;
  void* header_dev_ = nullptr;
  void* header_host_ = nullptr;
  int64_t header_cap_ = 0;
  std::thread thread_;
  absl::Mutex thread_mu_;
  bool thread_done_ ABSL_GUARDED_BY(thread_mu_) = false;
  bool clean_end_ ABSL_GUARDED_BY(thread_mu_) = false;  // the end marker went through
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> OpenTpLeaderSource(
    MicrobatchSourceOpener sources, std::shared_ptr<grpc::Channel> channel,
    const std::string& step_id, const v1::RankCoords& rank, const DeviceStreamOptions& options) {
  auto source = std::make_unique<TpLeaderSource>(std::move(sources), std::move(channel), step_id,
                                                 rank, options);
  if (absl::Status s = source->Start(); !s.ok()) return s;
  return std::unique_ptr<BatchSource>(std::move(source));
}

}  // namespace rollpack::trainer_internal
