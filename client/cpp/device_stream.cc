#include "client/cpp/device_stream.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/cpp/client.h"
#include "client/cpp/received_microbatch.h"
#include "client/cpp/trainer_stream.h"
#include "grpcpp/client_context.h"
#include "kernels/replay_kernels.h"
#include "rollpack/v1/rendezvous.grpc.pb.h"

#ifdef ROLLPACK_WITH_CUDA
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include "kernels/replay_kernels_cuda.h"
#endif

namespace rollpack {

int ElementSize(v1::DType dtype) {
  switch (dtype) {
    case v1::UINT8: return 1;
    case v1::UINT16: case v1::INT16: case v1::FLOAT16: case v1::BFLOAT16: return 2;
    case v1::INT32: case v1::FLOAT32: return 4;
    case v1::INT64: return 8;
    default: return 0;
  }
}

int64_t ArrayRef::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t ArrayRef::nbytes() const { return numel() * ElementSize(dtype); }

DeviceBatch::~DeviceBatch() {
  if (release_) release_(consumer_stream_);
}

bool DeviceStreamHasCuda() {
#ifdef ROLLPACK_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// --- Rendezvous ------------------------------------------------------------

absl::Status RendezvousPost(const std::shared_ptr<grpc::Channel>& channel, const std::string& key,
                            const std::string& value, const std::string& auth_token) {
  auto stub = v1::Rendezvous::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!auth_token.empty()) context.AddMetadata("authorization", "Bearer " + auth_token);
  v1::ExchangeIdRequest request;
  request.set_key(key);
  request.set_post(true);
  request.set_value(value);
  v1::ExchangeIdResponse response;
  return FromGrpcStatus(stub->ExchangeId(&context, request, &response));
}

absl::StatusOr<std::string> RendezvousWait(const std::shared_ptr<grpc::Channel>& channel,
                                           const std::string& key, int timeout_s,
                                           const std::string& auth_token) {
  auto stub = v1::Rendezvous::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s + 5));
  if (!auth_token.empty()) context.AddMetadata("authorization", "Bearer " + auth_token);
  v1::ExchangeIdRequest request;
  request.set_key(key);
  request.set_wait_ms(int64_t{timeout_s} * 1000);
  v1::ExchangeIdResponse response;
  grpc::Status s = stub->ExchangeId(&context, request, &response);
  if (!s.ok()) return FromGrpcStatus(s);
  return response.value();
}

namespace {

constexpr int64_t kAlign = 256;
int64_t AlignUp(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

ArrayRef RefOf(const v1::NDArray& a, void* data) {
  ArrayRef r;
  r.dtype = a.dtype();
  r.shape.assign(a.shape().begin(), a.shape().end());
  r.data = data;
  return r;
}

// Where each array of a micro-batch lives in one contiguous buffer (device
// path), in a fixed order every rank computes the same way from shapes.
struct Slot {
  std::string name;  // "tokens", ..., or "field:<name>"
  ArrayRef ref;      // data = nullptr; shapes and dtype
  int64_t offset = 0;
  int64_t bytes = 0;
};

struct Layout {
  std::vector<Slot> slots;
  int64_t arrays_bytes = 0;  // copied from the host
  int64_t ids_offset = 0;
  int64_t ids_bytes = 0;
  int64_t total = 0;
  int64_t rows = 0, layers = 0, k = 0;
};

bool IsReplay3d(const v1::NDArray& a) { return a.shape_size() == 3; }

absl::StatusOr<Layout> ComputeLayout(const v1::Microbatch& m, bool ids_int32) {
  Layout l;
  auto add = [&](const std::string& name, const v1::NDArray& a) -> absl::Status {
    Slot s;
    s.name = name;
    s.ref = RefOf(a, nullptr);
    if (a.dtype() != v1::DTYPE_UNSPECIFIED && ElementSize(a.dtype()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": unknown dtype ", a.dtype()));
    }
    s.bytes = a.dtype() == v1::DTYPE_UNSPECIFIED ? 0 : s.ref.nbytes();
    if (s.bytes < 0) return absl::InvalidArgumentError(absl::StrCat(name, ": negative shape"));
    s.offset = l.arrays_bytes;
    l.arrays_bytes += AlignUp(s.bytes);
    l.slots.push_back(std::move(s));
    return absl::OkStatus();
  };
  absl::Status st;
  if (!(st = add("tokens", m.tokens())).ok()) return st;
  if (!(st = add("cu_seqlens", m.cu_seqlens())).ok()) return st;
  if (!(st = add("cu_seqlens_padded", m.cu_seqlens_padded())).ok()) return st;
  if (!(st = add("replay_mask", m.replay_mask())).ok()) return st;
  if (!(st = add("replay_experts", m.replay_experts())).ok()) return st;
  std::vector<std::string> names;
  for (const auto& [name, a] : m.token_fields()) names.push_back(name);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    if (!(st = add("field:" + n, m.token_fields().at(n))).ok()) return st;
  }
  if (IsReplay3d(m.replay_experts())) {
    l.rows = m.replay_experts().shape(0);
    l.layers = m.replay_experts().shape(1);
    l.k = m.replay_experts().shape(2);
    if (m.replay_experts().dtype() != v1::UINT8 && m.replay_experts().dtype() != v1::UINT16) {
      return absl::InvalidArgumentError("replay_experts must be uint8 or uint16");
    }
  }
  l.ids_offset = l.arrays_bytes;
  l.ids_bytes = l.rows * l.layers * l.k * (ids_int32 ? 4 : 8);
  l.total = l.ids_offset + AlignUp(l.ids_bytes);
  return l;
}

const v1::NDArray& ArrayOf(const v1::Microbatch& m, const std::string& name) {
  if (name == "tokens") return m.tokens();
  if (name == "cu_seqlens") return m.cu_seqlens();
  if (name == "cu_seqlens_padded") return m.cu_seqlens_padded();
  if (name == "replay_mask") return m.replay_mask();
  if (name == "replay_experts") return m.replay_experts();
  return m.token_fields().at(name.substr(6));
}

// An array's bytes, from a parsed message or from the received buffers
// (ReceivedMicrobatch: copied once, from gRPC's slices to the destination).
int64_t DataSize(const v1::Microbatch& m, const std::string& name) {
  return static_cast<int64_t>(ArrayOf(m, name).data().size());
}
[[maybe_unused]] void CopyData(const v1::Microbatch& m, const std::string& name, void* out) {
  const std::string& data = ArrayOf(m, name).data();
  std::memcpy(out, data.data(), data.size());
}
const v1::Microbatch& MetaOf(const v1::Microbatch& m) { return m; }
[[maybe_unused]] int64_t DataSize(const ReceivedMicrobatch& m, const std::string& name) {
  return std::max<int64_t>(0, m.data_size(name));
}
[[maybe_unused]] void CopyData(const ReceivedMicrobatch& m, const std::string& name,
                               void* out) {
  m.CopyData(name, out);
}
[[maybe_unused]] const v1::Microbatch& MetaOf(const ReceivedMicrobatch& m) { return m.meta(); }

template <typename Message>
absl::Status CheckBytes(const Message& m, const Layout& l) {
  for (const Slot& s : l.slots) {
    const int64_t have = DataSize(m, s.name);
    if (have != s.bytes) {
      return absl::DataLossError(absl::StrCat("micro-batch ", MetaOf(m).index(), ": ", s.name,
                                              " holds ", have, " bytes, its shape needs ", s.bytes));
    }
  }
  return absl::OkStatus();
}

// Assigns the batch's array views from `base` (+ slot offsets) and `ids`.
void AssignViews(DeviceBatch* b, const Layout& l, char* base, void* ids, bool ids_int32,
                 ArrayRef* tokens, ArrayRef* cu, ArrayRef* cup, ArrayRef* mask,
                 ArrayRef* experts, std::map<std::string, ArrayRef>* fields,
                 ArrayRef* ids_ref) {
  for (const Slot& s : l.slots) {
    ArrayRef r = s.ref;
    r.data = base == nullptr ? nullptr : base + s.offset;
    if (s.name == "tokens") *tokens = r;
    else if (s.name == "cu_seqlens") *cu = r;
    else if (s.name == "cu_seqlens_padded") *cup = r;
    else if (s.name == "replay_mask") *mask = r;
    else if (s.name == "replay_experts") *experts = r;
    else (*fields)[s.name.substr(6)] = r;
  }
  ids_ref->dtype = ids_int32 ? v1::INT32 : v1::INT64;
  ids_ref->shape = {l.layers, l.rows, l.k};
  ids_ref->data = ids;
}

kernels::UnpackArgs MakeUnpack(const Layout& l, const ArrayRef& experts, const ArrayRef& mask,
                               void* out, const DeviceStreamOptions& o) {
  kernels::UnpackArgs a;
  a.experts = experts.data;
  a.in_type = experts.dtype == v1::UINT16 ? kernels::IndexType::kU16 : kernels::IndexType::kU8;
  a.mask = mask.numel() == l.rows && mask.dtype == v1::UINT8
               ? static_cast<const uint8_t*>(mask.data) : nullptr;
  a.rows = l.rows;
  a.layers = l.layers;
  a.k = static_cast<int>(l.k);
  a.out = out;
  a.out_type = o.ids_int32 ? kernels::OutIndexType::kI32 : kernels::OutIndexType::kI64;
  a.masked_fill_minus_one = o.masked_fill_minus_one;
  return a;
}

absl::Status FromKernel(const kernels::KernelStatus& s) {
  if (s.ok()) return absl::OkStatus();
  if (s.code == kernels::StatusCode::kInvalidArgument) return absl::InvalidArgumentError(s.message);
  return absl::InternalError(s.message);
}

[[maybe_unused]] void ClearData(v1::Microbatch* m) {
  m->mutable_tokens()->clear_data();
  m->mutable_replay_experts()->clear_data();
  m->mutable_replay_mask()->clear_data();
  for (auto& [name, a] : *m->mutable_token_fields()) a.clear_data();
}

}  // namespace

// --- Implementation ----------------------------------------------------------

struct DeviceStream::Impl {
  virtual ~Impl() = default;
  virtual absl::StatusOr<std::shared_ptr<DeviceBatch>> Next(void* consumer_stream) = 0;
};

namespace {

// Host arrays pointing into the received message; CPU unpack.
class HostImpl final : public DeviceStream::Impl {
 public:
  HostImpl(std::shared_ptr<grpc::Channel> channel, const std::string& step_id,
           const v1::RankCoords& rank, const DeviceStreamOptions& o)
      : options_(o), stream_(std::move(channel), step_id, rank, StreamOptions(o)) {}

  static TrainerStreamOptions StreamOptions(const DeviceStreamOptions& o) {
    TrainerStreamOptions t;
    t.prefetch = std::max(1, o.prefetch);
    t.all_fields = o.all_fields;
    t.start_index = o.start_index;
    t.auth_token = o.auth_token;
    return t;
  }

  absl::StatusOr<std::shared_ptr<DeviceBatch>> Next(void*) override {
    absl::StatusOr<std::optional<v1::Microbatch>> next = stream_.Next();
    if (!next.ok()) return next.status();
    if (!next->has_value()) return std::shared_ptr<DeviceBatch>();
    std::shared_ptr<DeviceBatch> b(new DeviceBatch());
    b->meta_ = std::move(**next);
    absl::StatusOr<Layout> l = ComputeLayout(b->meta_, options_.ids_int32);
    if (!l.ok()) return l.status();
    if (absl::Status s = CheckBytes(b->meta_, *l); !s.ok()) return s;
    b->host_ids_.assign((l->ids_bytes + 7) / 8, 0);
    AssignViews(b.get(), *l, nullptr, b->host_ids_.data(), options_.ids_int32, &b->tokens_,
                &b->cu_seqlens_, &b->cu_seqlens_padded_, &b->replay_mask_, &b->replay_experts_,
                &b->token_fields_, &b->replay_ids_);
    // Views into the message's own bytes (no copy).
    auto point = [&](ArrayRef* r, v1::NDArray* a) { r->data = a->mutable_data()->data(); };
    point(&b->tokens_, b->meta_.mutable_tokens());
    point(&b->cu_seqlens_, b->meta_.mutable_cu_seqlens());
    point(&b->cu_seqlens_padded_, b->meta_.mutable_cu_seqlens_padded());
    point(&b->replay_mask_, b->meta_.mutable_replay_mask());
    point(&b->replay_experts_, b->meta_.mutable_replay_experts());
    for (auto& [name, ref] : b->token_fields_) point(&ref, &(*b->meta_.mutable_token_fields())[name]);
    if (l->ids_bytes > 0) {
      kernels::UnpackArgs a = MakeUnpack(*l, b->replay_experts_, b->replay_mask_,
                                         b->host_ids_.data(), options_);
      if (absl::Status s = FromKernel(kernels::cpu::Unpack(a)); !s.ok()) return s;
    }
    return b;
  }

 private:
  const DeviceStreamOptions options_;
  TrainerStream stream_;
};

#ifdef ROLLPACK_WITH_CUDA

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}
#define RP_CUDA(expr)                                       \
  do {                                                      \
    cudaError_t _e = (expr);                                \
    if (_e != cudaSuccess) return CudaError(_e, #expr);     \
  } while (0)

// Restores the calling thread's current device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&prev_);
    if (prev_ != device) cudaSetDevice(device);
    changed_ = prev_ != device;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  bool changed_ = false;
};

// --- NCCL, loaded at run time ---
typedef struct ncclComm* ncclComm_t;
struct ncclUniqueId {
  char internal[128];
};
constexpr int kNcclUint8 = 1;
struct Nccl {
  int (*GetUniqueId)(ncclUniqueId*) = nullptr;
  int (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  int (*CommDestroy)(ncclComm_t) = nullptr;
  int (*CommAbort)(ncclComm_t) = nullptr;
  int (*Broadcast)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  int (*Send)(const void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  int (*Recv)(void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  int (*GroupStart)() = nullptr;
  int (*GroupEnd)() = nullptr;
  const char* (*GetErrorString)(int) = nullptr;
};

absl::StatusOr<const Nccl*> LoadNccl() {
  static Nccl nccl;
  static std::string error;
  static bool loaded = [] {
    const char* env = std::getenv("ROLLPACK_NCCL_LIBRARY");
    const std::string path = env != nullptr && *env != 0 ? env : "libnccl.so.2";
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      error = absl::StrCat("cannot load NCCL (", path, "): ", dlerror(),
                           "; set ROLLPACK_NCCL_LIBRARY to libnccl.so.2's path");
      return false;
    }
    bool ok = true;
    auto sym = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(h, name));
      if (*fn == nullptr) {
        ok = false;
        error = absl::StrCat("NCCL library ", path, " lacks ", name);
      }
    };
    sym(&nccl.GetUniqueId, "ncclGetUniqueId");
    sym(&nccl.CommInitRank, "ncclCommInitRank");
    sym(&nccl.CommDestroy, "ncclCommDestroy");
    sym(&nccl.CommAbort, "ncclCommAbort");
    sym(&nccl.Broadcast, "ncclBroadcast");
    sym(&nccl.Send, "ncclSend");
    sym(&nccl.Recv, "ncclRecv");
    sym(&nccl.GroupStart, "ncclGroupStart");
    sym(&nccl.GroupEnd, "ncclGroupEnd");
    sym(&nccl.GetErrorString, "ncclGetErrorString");
    return ok;
  }();
  if (!loaded) return absl::FailedPreconditionError(error);
  return &nccl;
}

struct CudaState {
  int device = 0;
  cudaStream_t copy = nullptr;
  ~CudaState() {
    if (copy != nullptr) {
      DeviceGuard g(device);
      cudaStreamSynchronize(copy);
      cudaStreamDestroy(copy);
    }
  }
};

struct PinnedSlot {
  void* ptr = nullptr;
  size_t size = 0;
  cudaEvent_t done = nullptr;  // the H2D copy reading it has finished
  bool used = false;
};

// Staged batches of a CUDA device; subclasses fill the ready queue.
class CudaImpl : public DeviceStream::Impl {
 public:
  CudaImpl(const DeviceStreamOptions& o) : options_(o) {}

  ~CudaImpl() override {
    // Subclasses stop and join their staging thread first.
    DeviceGuard g(state_ != nullptr ? state_->device : 0);
    {
      absl::MutexLock lock(&mu_);
      for (Item& item : ready_) {
        if (item.ready != nullptr) cudaEventDestroy(item.ready);
      }
      ready_.clear();  // batches not handed out: their memory is released
    }
    for (PinnedSlot& s : pinned_) {
      if (s.done != nullptr) {
        cudaEventSynchronize(s.done);
        cudaEventDestroy(s.done);
      }
      if (s.ptr != nullptr) cudaFreeHost(s.ptr);
    }
  }

  absl::Status InitCuda() {
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

  absl::StatusOr<std::shared_ptr<DeviceBatch>> Next(void* consumer_stream) override {
    Item item;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CudaImpl* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return !s->ready_.empty(); },
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
    item.batch->consumer_stream_ = consumer_stream;
    return item.batch;
  }

 protected:
  struct Item {
    std::shared_ptr<DeviceBatch> batch;  // nullptr: end (status OK) or error
    absl::Status status;
    cudaEvent_t ready = nullptr;
  };

  // Blocks while the ready queue is full; false when stopping.
  bool Push(Item item) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](CudaImpl* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
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

  void PushEnd(absl::Status status) {
    absl::MutexLock lock(&mu_);
    Item item;
    item.status = std::move(status);
    ready_.push_back(std::move(item));
  }

  void Stop() {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }

  bool stopping() {
    absl::MutexLock lock(&mu_);
    return stop_;
  }

  // A pinned buffer of at least `size` bytes whose previous copy finished.
  absl::StatusOr<PinnedSlot*> AcquirePinned(size_t size) {
    PinnedSlot& s = pinned_[next_pinned_++ % pinned_.size()];
    if (s.done != nullptr) RP_CUDA(cudaEventSynchronize(s.done));
    if (s.size < size) {
      if (s.ptr != nullptr) RP_CUDA(cudaFreeHost(s.ptr));
      s.ptr = nullptr;
      s.size = 0;
      const size_t want = std::max<size_t>(size, size_t{1} << 20) * 5 / 4;
      RP_CUDA(cudaHostAlloc(&s.ptr, want, cudaHostAllocDefault));
      s.size = want;
    }
    if (s.done == nullptr) RP_CUDA(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    return &s;
  }

  // Device memory for a batch, released stream-ordered after the consumer.
  absl::StatusOr<char*> AllocBatch(DeviceBatch* b, int64_t bytes) {
    void* p = nullptr;
    RP_CUDA(cudaMallocAsync(&p, std::max<int64_t>(bytes, 1), state_->copy));
    std::shared_ptr<CudaState> state = state_;
    b->device_ = state_->device;
    b->release_ = [state, p](void* consumer) {
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

  // Copies `m`'s arrays (all slots) through pinned memory into `base` and
  // unpacks the ids; views assigned. Does not record the ready event.
  template <typename Message>
  absl::Status StageFromHost(const Message& m, const Layout& l, char* base) {
    if (l.arrays_bytes > 0) {
      absl::StatusOr<PinnedSlot*> slot = AcquirePinned(l.arrays_bytes);
      if (!slot.ok()) return slot.status();
      char* host = static_cast<char*>((*slot)->ptr);
      for (const Slot& s : l.slots) {
        if (s.bytes > 0) CopyData(m, s.name, host + s.offset);
      }
      RP_CUDA(cudaMemcpyAsync(base, host, l.arrays_bytes, cudaMemcpyHostToDevice, state_->copy));
      RP_CUDA(cudaEventRecord((*slot)->done, state_->copy));
    }
    return absl::OkStatus();
  }

  absl::Status Unpack(DeviceBatch* b, const Layout& l) {
    if (l.ids_bytes == 0) return absl::OkStatus();
    kernels::UnpackArgs a = MakeUnpack(l, b->replay_experts_, b->replay_mask_, b->replay_ids_.data,
                                       options_);
    return FromKernel(kernels::cuda::Unpack(a, state_->copy));
  }

  absl::StatusOr<cudaEvent_t> RecordReady() {
    cudaEvent_t ev = nullptr;
    RP_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    RP_CUDA(cudaEventRecord(ev, state_->copy));
    return ev;
  }

  // The last stage of every path (own stream, TP leader, TP follower): ids
  // unpacked on the copy stream, the event the consumer waits on recorded,
  // the wire metadata dropped, the batch handed to `item`.
  absl::Status UnpackAndPublish(std::shared_ptr<DeviceBatch> b, const Layout& l, Item* item) {
    if (absl::Status s = Unpack(b.get(), l); !s.ok()) return s;
    absl::StatusOr<cudaEvent_t> ev = RecordReady();
    if (!ev.ok()) return ev.status();
    ClearData(&b->meta_);
    item->batch = std::move(b);
    item->ready = *ev;
    return absl::OkStatus();
  }

  const DeviceStreamOptions options_;
  std::shared_ptr<CudaState> state_;
  std::vector<PinnedSlot> pinned_;
  size_t next_pinned_ = 0;
  absl::Mutex mu_;
  std::deque<Item> ready_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// One rank fetching its own stream.
class LocalCudaImpl final : public CudaImpl {
 public:
  LocalCudaImpl(std::shared_ptr<grpc::Channel> channel, const std::string& step_id,
                const v1::RankCoords& rank, const DeviceStreamOptions& o)
      : CudaImpl(o), stream_(std::move(channel), step_id, rank, HostImpl::StreamOptions(o)) {}

  absl::Status Start() {
    if (absl::Status s = InitCuda(); !s.ok()) return s;
    thread_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  ~LocalCudaImpl() override {
    Stop();
    stream_.Cancel();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop() {
    DeviceGuard g(state_->device);
    while (!stopping()) {
      absl::StatusOr<std::optional<ReceivedMicrobatch>> next = stream_.NextReceived();
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
    std::shared_ptr<DeviceBatch> b(new DeviceBatch());
    b->meta_ = m.meta();
    absl::StatusOr<Layout> l = ComputeLayout(b->meta_, options_.ids_int32);
    if (!l.ok()) return l.status();
    if (absl::Status s = CheckBytes(m, *l); !s.ok()) return s;
    absl::StatusOr<char*> base = AllocBatch(b.get(), l->total);
    if (!base.ok()) return base.status();
    AssignViews(b.get(), *l, *base, *base + l->ids_offset, options_.ids_int32, &b->tokens_,
                &b->cu_seqlens_, &b->cu_seqlens_padded_, &b->replay_mask_, &b->replay_experts_,
                &b->token_fields_, &b->replay_ids_);
    if (absl::Status s = StageFromHost(m, *l, *base); !s.ok()) return s;
    return UnpackAndPublish(std::move(b), *l, item);
  }

  TrainerStream stream_;
  std::thread thread_;
};

#define RP_NCCL(expr)                                                                  \
  do {                                                                                 \
    int _r = (expr);                                                                   \
    if (_r != 0) {                                                                     \
      return absl::InternalError(absl::StrCat(#expr, ": ", nccl_->GetErrorString(_r))); \
    }                                                                                  \
  } while (0)

// NCCL communicators of finished TP-leader streams, kept for the next step
// of the same group: creating one costs a rendezvous and a ncclCommInitRank
// (tens to hundreds of milliseconds) per step, reusing one costs two small
// Rendezvous calls. Keyed on what fixes the group from this rank's side;
// whether the peers still hold the same communicator is settled by the
// handshake in TpGroupImpl::Start, never assumed. Leaked on purpose: at exit
// NCCL and the CUDA runtime may already be torn down.
struct TpCommKey {
  int device, dp, cp, pp, size, rank;
  bool operator<(const TpCommKey& o) const {
    return std::tie(device, dp, cp, pp, size, rank) < std::tie(o.device, o.dp, o.cp, o.pp, o.size, o.rank);
  }
};

struct TpComm {
  ncclComm_t comm = nullptr;
  std::string generation;  // random, shared by the members of one communicator
};

class TpCommCache {
 public:
  static TpCommCache& Get() {
    static TpCommCache* cache = new TpCommCache();
    return *cache;
  }

  // The idle communicator of `key`, removed from the cache (comm = nullptr if none).
  TpComm Take(const TpCommKey& key) {
    absl::MutexLock lock(&mu_);
    auto it = idle_.find(key);
    if (it == idle_.end()) return {};
    TpComm c = std::move(it->second.comm);
    idle_.erase(it);
    return c;
  }

  // Keeps `c` idle under `key`; an older idle one of the key is aborted.
  void Put(const TpCommKey& key, TpComm c, const Nccl* nccl) {
    TpComm old;
    {
      absl::MutexLock lock(&mu_);
      Entry& e = idle_[key];
      old = std::exchange(e.comm, std::move(c));
      e.nccl = nccl;
    }
    if (old.comm != nullptr) nccl->CommAbort(old.comm);
  }

  // Aborts every idle communicator: abort, not destroy, because destroying
  // may wait for the peers, which need not be closing at the same time; an
  // idle communicator has no work left to lose.
  void CloseAll() {
    std::map<TpCommKey, Entry> all;
    {
      absl::MutexLock lock(&mu_);
      all.swap(idle_);
    }
    for (auto& [key, e] : all) {
      DeviceGuard g(key.device);
      e.nccl->CommAbort(e.comm.comm);
    }
  }

 private:
  struct Entry {
    TpComm comm;
    const Nccl* nccl = nullptr;
  };
  absl::Mutex mu_;
  std::map<TpCommKey, Entry> idle_ ABSL_GUARDED_BY(mu_);
};

std::string NewGeneration() {
  static std::mutex mu;
  static std::mt19937_64 rng = [] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(),
                      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()),
                      static_cast<unsigned>(getpid())};
    return std::mt19937_64(seq);
  }();
  std::lock_guard<std::mutex> lock(mu);
  return absl::StrCat(absl::Hex(rng(), absl::kZeroPad16), absl::Hex(rng(), absl::kZeroPad16));
}

bool EnvFlag(const char* name, bool dflt) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return dflt;
  return !(std::strcmp(v, "0") == 0 || std::strcmp(v, "false") == 0 || std::strcmp(v, "off") == 0);
}

// TP-leader mode: rank tp 0 fetches the group's streams and distributes.
class TpGroupImpl final : public CudaImpl {
 public:
  TpGroupImpl(std::shared_ptr<grpc::Channel> channel, std::string step_id, v1::RankCoords rank,
              const DeviceStreamOptions& o)
      : CudaImpl(o), channel_(std::move(channel)), step_id_(std::move(step_id)), rank_(rank) {}

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
        streams_.push_back(std::make_unique<TrainerStream>(channel_, step_id_, c,
                                                           HostImpl::StreamOptions(options_)));
      }
    }
    {
      DeviceGuard g(state_->device);
      RP_CUDA(cudaMalloc(&scratch_dev_, 8));
      RP_CUDA(cudaHostAlloc(&scratch_host_, 8, cudaHostAllocDefault));
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = Connect(); !s.ok()) return s;
    if (EnvFlag("ROLLPACK_TP_COMM_LOG", false)) {
      std::fprintf(stderr, "rollpack tp-leader %s dp%d cp%d pp%d tp%d: %s communicator %s in %.1f ms\n",
                   step_id_.c_str(), rank_.dp(), rank_.cp(), rank_.pp(), rank_.tp(),
                   reused_ ? "reused" : "created", generation_.c_str(),
                   std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    thread_ = std::thread([this] { Loop(); });
    return absl::OkStatus();
  }

  ~TpGroupImpl() override {
    Stop();
    for (auto& s : streams_) s->Cancel();
    bool aborted = false;
    if (thread_.joinable()) {
      // A rank blocked in NCCL (its peer died) is released by an abort.
      absl::MutexLock lock(&thread_mu_);
      if (!thread_mu_.AwaitWithTimeout(absl::Condition(&thread_done_), absl::Seconds(10)) &&
          comm_ != nullptr) {
        nccl_->CommAbort(comm_);
        comm_ = nullptr;
        aborted = true;
      }
    }
    if (thread_.joinable()) thread_.join();
    DeviceGuard g(state_ != nullptr ? state_->device : 0);
    const bool synced = state_ != nullptr && cudaStreamSynchronize(state_->copy) == cudaSuccess;
    if (comm_ != nullptr) {
      bool clean = false;
      {
        absl::MutexLock lock(&thread_mu_);
        clean = clean_end_;
      }
      if (clean && synced && !aborted && reuse_) {
        // Every rank ran the same NCCL calls up to the end marker and they
        // completed: the communicator is idle and consistent on all ranks.
        TpCommCache::Get().Put(CacheKey(), TpComm{comm_, generation_}, nccl_);
      } else if (clean && synced && !aborted) {
        nccl_->CommDestroy(comm_);  // every rank reached the end together
      } else {
        // Stopped mid-stream or failed: the peers may be elsewhere in the
        // protocol, so neither keep it nor wait for them.
        nccl_->CommAbort(comm_);
      }
      comm_ = nullptr;
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

  TpCommKey CacheKey() const {
    return TpCommKey{state_->device, rank_.dp(), rank_.cp(), rank_.pp(), options_.tp_leader_size,
                     rank_.tp()};
  }

  // Sets comm_: the group's communicator of an earlier step when every rank
  // still holds it idle, else a new one. Through rollpackd, under the step's
  // key K: each follower posts the generation of the communicator it holds
  // idle for this group ("" if none) under K/have<tp>; the leader, once it
  // has them all, posts "R<generation>" (reuse: all equal its own) or
  // "N<generation><ncclUniqueId>" (a new communicator, created by everyone)
  // under K. The decision is the leader's alone and every rank follows it,
  // so the ranks cannot disagree; a rank that holds a communicator that is
  // not chosen aborts it. Either way the step costs a few small Rendezvous
  // calls; creating a communicator adds ncclCommInitRank.
  absl::Status Connect() {
    const int size = options_.tp_leader_size;
    const std::string key = absl::StrCat(step_id_, "/tp-leader/dp", rank_.dp(), "/cp", rank_.cp(),
                                         "/pp", rank_.pp(), "/start", options_.start_index,
                                         "/tag", options_.rendezvous_tag);
    reuse_ = options_.reuse_tp_communicator && EnvFlag("ROLLPACK_TP_COMM_REUSE", true);
    TpComm mine = reuse_ ? TpCommCache::Get().Take(CacheKey()) : TpComm{};
    auto drop_mine = [&] {
      if (mine.comm != nullptr) {
        DeviceGuard g(state_->device);
        nccl_->CommAbort(mine.comm);
        mine.comm = nullptr;
      }
    };
    ncclUniqueId id;
    std::string decision;
    if (leader_) {
      bool all_same = mine.comm != nullptr;
      for (int t = 1; t < size; ++t) {
        absl::StatusOr<std::string> have =
            RendezvousWait(channel_, absl::StrCat(key, "/have", t), options_.rendezvous_timeout_s,
                           options_.auth_token);
        if (!have.ok()) {
          drop_mine();
          return have.status();
        }
        all_same = all_same && *have == mine.generation;
      }
      if (all_same) {
        decision = "R" + mine.generation;
      } else {
        drop_mine();
        RP_NCCL(nccl_->GetUniqueId(&id));
        decision = absl::StrCat("N", NewGeneration(), std::string(id.internal, sizeof(id)));
      }
      if (absl::Status s = RendezvousPost(channel_, key, decision, options_.auth_token); !s.ok()) {
        drop_mine();
        return s;
      }
    } else {
      if (absl::Status s = RendezvousPost(channel_, absl::StrCat(key, "/have", rank_.tp()),
                                          mine.comm != nullptr ? mine.generation : std::string(),
                                          options_.auth_token);
          !s.ok()) {
        drop_mine();
        return s;
      }
      absl::StatusOr<std::string> v =
          RendezvousWait(channel_, key, options_.rendezvous_timeout_s, options_.auth_token);
      if (!v.ok()) {
        drop_mine();
        return v.status();
      }
      decision = std::move(*v);
    }
    constexpr size_t kGen = 32;
    if (decision.size() == 1 + kGen && decision[0] == 'R') {
      if (mine.comm == nullptr || decision.compare(1, kGen, mine.generation) != 0) {
        drop_mine();
        return absl::DataLossError("TP leader reuses a communicator this rank does not hold");
      }
      comm_ = mine.comm;
      generation_ = mine.generation;
      reused_ = true;
      return absl::OkStatus();
    }
    if (decision.size() != 1 + kGen + sizeof(id) || decision[0] != 'N') {
      drop_mine();
      return absl::DataLossError("bad TP-leader rendezvous value (mixed rollpack versions?)");
    }
    drop_mine();
    generation_ = decision.substr(1, kGen);
    std::memcpy(id.internal, decision.data() + 1 + kGen, sizeof(id));
    DeviceGuard g(state_->device);
    RP_NCCL(nccl_->CommInitRank(&comm_, size, id, rank_.tp()));
    reused_ = false;
    return absl::OkStatus();
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
    RP_NCCL(nccl_->Broadcast(scratch_dev_, scratch_dev_, 8, kNcclUint8, 0, comm_, st));
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
    RP_NCCL(nccl_->Broadcast(header_dev_, header_dev_, n, kNcclUint8, 0, comm_, st));
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

  // Tokens and token fields (identical on every TP rank) are broadcast.
  absl::Status BroadcastShared(const Layout& l, char* base) {
    for (const Slot& s : l.slots) {
      if (s.bytes == 0) continue;
      if (s.name == "tokens" || s.name.rfind("field:", 0) == 0) {
        RP_NCCL(nccl_->Broadcast(base + s.offset, base + s.offset, s.bytes, kNcclUint8, 0, comm_,
                                 state_->copy));
      }
    }
    return absl::OkStatus();
  }

  static const Slot* FindSlot(const Layout& l, const std::string& name) {
    for (const Slot& s : l.slots) {
      if (s.name == name) return &s;
    }
    return nullptr;
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
        absl::StatusOr<Layout> l = ComputeLayout(msgs[t], options_.ids_int32);
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
    std::shared_ptr<DeviceBatch> b(new DeviceBatch());
    b->meta_ = std::move(msgs[0]);
    const Layout& l0 = layouts[0];
    absl::StatusOr<char*> base = AllocBatch(b.get(), l0.total);
    if (!base.ok()) return base.status();
    AssignViews(b.get(), l0, *base, *base + l0.ids_offset, options_.ids_int32, &b->tokens_,
                &b->cu_seqlens_, &b->cu_seqlens_padded_, &b->replay_mask_, &b->replay_experts_,
                &b->token_fields_, &b->replay_ids_);
    if (absl::Status s = StageFromHost(b->meta_, l0, *base); !s.ok()) return s;
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
        if (mb > 0) std::memcpy(host + off[t] + AlignUp(eb), msgs[t].replay_mask().data().data(), mb);
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
        if (eb > 0) RP_NCCL(nccl_->Send(p, eb, kNcclUint8, t, comm_, state_->copy));
        if (mb > 0) RP_NCCL(nccl_->Send(p + AlignUp(eb), mb, kNcclUint8, t, comm_, state_->copy));
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
    std::shared_ptr<DeviceBatch> b(new DeviceBatch());
    b->meta_ = std::move(meta);
    absl::StatusOr<Layout> l = ComputeLayout(b->meta_, options_.ids_int32);
    if (!l.ok()) return l.status();
    absl::StatusOr<char*> base = AllocBatch(b.get(), l->total);
    if (!base.ok()) return base.status();
    AssignViews(b.get(), *l, *base, *base + l->ids_offset, options_.ids_int32, &b->tokens_,
                &b->cu_seqlens_, &b->cu_seqlens_padded_, &b->replay_mask_, &b->replay_experts_,
                &b->token_fields_, &b->replay_ids_);
    // cu_seqlens came in the header.
    const Slot* cu = FindSlot(*l, "cu_seqlens");
    const Slot* cup = FindSlot(*l, "cu_seqlens_padded");
    const int64_t small = AlignUp(cu->bytes) + AlignUp(cup->bytes);
    if (small > 0) {
      absl::StatusOr<PinnedSlot*> slot = AcquirePinned(small);
      if (!slot.ok()) return slot.status();
      char* host = static_cast<char*>((*slot)->ptr);
      if (b->meta_.cu_seqlens().data().size() != static_cast<size_t>(cu->bytes) ||
          b->meta_.cu_seqlens_padded().data().size() != static_cast<size_t>(cup->bytes)) {
        return absl::DataLossError("TP header: cu_seqlens sizes differ from their shapes");
      }
      std::memcpy(host, b->meta_.cu_seqlens().data().data(), cu->bytes);
      std::memcpy(host + AlignUp(cu->bytes), b->meta_.cu_seqlens_padded().data().data(), cup->bytes);
      // cu_seqlens and cu_seqlens_padded are adjacent slots (offsets aligned).
      RP_CUDA(cudaMemcpyAsync(*base + cu->offset, host, cu->bytes, cudaMemcpyHostToDevice,
                              state_->copy));
      RP_CUDA(cudaMemcpyAsync(*base + cup->offset, host + AlignUp(cu->bytes), cup->bytes,
                              cudaMemcpyHostToDevice, state_->copy));
      RP_CUDA(cudaEventRecord((*slot)->done, state_->copy));
    }
    if (absl::Status s = BroadcastShared(*l, *base); !s.ok()) return s;
    const Slot* ex = FindSlot(*l, "replay_experts");
    const Slot* mk = FindSlot(*l, "replay_mask");
    if (ex->bytes > 0 || mk->bytes > 0) {
      RP_NCCL(nccl_->GroupStart());
      if (ex->bytes > 0) {
        RP_NCCL(nccl_->Recv(*base + ex->offset, ex->bytes, kNcclUint8, 0, comm_, state_->copy));
      }
      if (mk->bytes > 0) {
        RP_NCCL(nccl_->Recv(*base + mk->offset, mk->bytes, kNcclUint8, 0, comm_, state_->copy));
      }
      RP_NCCL(nccl_->GroupEnd());
    }
    return UnpackAndPublish(std::move(b), *l, item);
  }

  const Nccl* nccl_ = nullptr;
  std::shared_ptr<grpc::Channel> channel_;
  const std::string step_id_;
  const v1::RankCoords rank_;
  bool leader_ = false;
  std::vector<std::unique_ptr<TrainerStream>> streams_;
  ncclComm_t comm_ = nullptr;
  std::string generation_;
  bool reuse_ = false;   // offer / keep communicators across steps
  bool reused_ = false;  // comm_ came from an earlier step
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

#endif  // ROLLPACK_WITH_CUDA

}  // namespace

void CloseTpCommunicators() {
#ifdef ROLLPACK_WITH_CUDA
  TpCommCache::Get().CloseAll();
#endif
}

DeviceStream::DeviceStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceStream::~DeviceStream() = default;

bool DeviceStream::cuda_built() const { return DeviceStreamHasCuda(); }

absl::StatusOr<std::shared_ptr<DeviceBatch>> DeviceStream::Next(void* consumer_stream) {
  return impl_->Next(consumer_stream);
}

absl::StatusOr<std::unique_ptr<DeviceStream>> DeviceStream::Open(
    std::shared_ptr<grpc::Channel> channel, const std::string& step_id,
    const v1::RankCoords& rank, const DeviceStreamOptions& options) {
  if (options.tp_leader_size > 1 && options.device < 0) {
    return absl::InvalidArgumentError("TP-leader mode needs a CUDA device (NCCL)");
  }
  if (options.device < 0) {
    return std::unique_ptr<DeviceStream>(
        new DeviceStream(std::make_unique<HostImpl>(std::move(channel), step_id, rank, options)));
  }
#ifdef ROLLPACK_WITH_CUDA
  if (options.tp_leader_size > 1) {
    auto impl = std::make_unique<TpGroupImpl>(std::move(channel), step_id, rank, options);
    if (absl::Status s = impl->Start(); !s.ok()) return s;
    return std::unique_ptr<DeviceStream>(new DeviceStream(std::move(impl)));
  }
  auto impl = std::make_unique<LocalCudaImpl>(std::move(channel), step_id, rank, options);
  if (absl::Status s = impl->Start(); !s.ok()) return s;
  return std::unique_ptr<DeviceStream>(new DeviceStream(std::move(impl)));
#else
  return absl::FailedPreconditionError(
      "rollpack was built without CUDA (ROLLPACK_WITH_CUDA=OFF): use device -1");
#endif
}

}  // namespace rollpack
