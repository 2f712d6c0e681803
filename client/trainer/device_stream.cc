#include "client/trainer/device_stream.h"

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "client/cpp/microbatch_source.h"
#include "client/cpp/ragged_field.h"
#include "client/cpp/stream_resume.h"
#include "client/cpp/trainer_stream.h"
#include "client/trainer/batch_layout.h"
#include "client/trainer/batch_source.h"
#include "client/trainer/batch_state.h"
#include "kernels/replay_kernels.h"
#include "kernels/replay_kernels_absl.h"

#ifdef ROLLPACK_WITH_CUDA
#include "client/trainer/cuda_staging.h"
#include "client/trainer/tp_communicator.h"
#include "client/trainer/tp_leader.h"
#endif

namespace rollpack {

using trainer_internal::AssignViews;
using trainer_internal::BatchSource;
using trainer_internal::BatchState;
using trainer_internal::CheckBytes;
using trainer_internal::ComputeLayout;
using trainer_internal::CopySlot;
using trainer_internal::FindSlot;
using trainer_internal::Layout;
using trainer_internal::MakeUnpack;

bool DeviceStreamHasCuda() {
#ifdef ROLLPACK_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void CloseTpCommunicators() {
#ifdef ROLLPACK_WITH_CUDA
  trainer_internal::CloseIdleTpComms();
#endif
}

namespace {

// Host arrays pointing into the received message; CPU unpack. The path CI
// runs, and every build without CUDA.
class HostSource final : public BatchSource {
 public:
  HostSource(std::unique_ptr<MicrobatchSource> stream, const DeviceStreamOptions& o)
      : options_(o), stream_(std::move(stream)) {}

  absl::StatusOr<std::shared_ptr<DeviceBatch>> Next(void*) override {
    absl::StatusOr<std::optional<v1::Microbatch>> next = stream_->Next();
    if (!next.ok()) return next.status();
    if (!next->has_value()) return std::shared_ptr<DeviceBatch>();
    auto b = std::make_unique<BatchState>();
    b->meta = std::move(**next);
    absl::StatusOr<Layout> l = ComputeLayout(b->meta, options_.ids_int32, options_.replay_ids);
    if (!l.ok()) return l.status();
    if (absl::Status s = CheckBytes(b->meta, *l); !s.ok()) return s;
    b->host_ids.assign((l->ids_bytes + 7) / 8, 0);
    AssignViews(*l, nullptr, b->host_ids.data(), options_.ids_int32, b.get());
    // Views into the message's own bytes (no copy).
    auto point = [&](ArrayRef* r, v1::NDArray* a) { r->data = a->mutable_data()->data(); };
    point(&b->tokens, b->meta.mutable_tokens());
    point(&b->cu_seqlens, b->meta.mutable_cu_seqlens());
    point(&b->cu_seqlens_padded, b->meta.mutable_cu_seqlens_padded());
    point(&b->replay_mask, b->meta.mutable_replay_mask());
    point(&b->replay_experts, b->meta.mutable_replay_experts());
    for (auto& [name, ref] : b->token_fields) point(&ref, &(*b->meta.mutable_token_fields())[name]);
    // Only when present: mutable_advantages() would make an absent one set.
    if (b->meta.has_advantages()) point(&b->advantages, b->meta.mutable_advantages());
    for (auto& [name, ref] : b->scalars) point(&ref, &(*b->meta.mutable_scalars())[name]);
    for (auto& [name, ragged] : b->ragged_token_fields) {
      v1::RaggedArray& wire = (*b->meta.mutable_ragged_token_fields())[name];
      point(&ragged.offsets, wire.mutable_offsets());
      if (wire.values().dtype() == v1::INT32) {
        point(&ragged.values, wire.mutable_values());
      } else {  // uint16 ids, widened as on a device (DeviceBatch::ragged_token_fields)
        const trainer_internal::Slot* slot = FindSlot(*l, RaggedValuesName(name));
        std::vector<int32_t>& values = b->host_ragged_values[name];
        values.resize(static_cast<size_t>(slot->bytes / 4));
        CopySlot(b->meta, *slot, values.data());
        ragged.values.data = values.data();
      }
    }
    if (l->ids_bytes > 0) {
      kernels::UnpackArgs a = MakeUnpack(*l, b->replay_experts, b->replay_mask, b->host_ids.data(),
                                         options_.ids_int32, options_.masked_fill_minus_one);
      if (absl::Status s = kernels::ToAbslStatus(kernels::cpu::Unpack(a)); !s.ok()) return s;
    }
    return std::make_shared<DeviceBatch>(std::move(b));
  }

 private:
  const DeviceStreamOptions options_;
  const std::unique_ptr<MicrobatchSource> stream_;
};

// The one place the device paths' micro-batches come from rollpackd: a
// TrainerStream per rank asked for.
MicrobatchSourceOpener NetworkSources(std::shared_ptr<grpc::Channel> channel,
                                      const std::string& step_id, const DeviceStreamOptions& o) {
  return [channel = std::move(channel), step_id, network = trainer_internal::NetworkOptions(o)](
             const v1::RankCoords& rank) -> absl::StatusOr<std::unique_ptr<MicrobatchSource>> {
    return std::make_unique<TrainerStream>(channel, step_id, rank, network);
  };
}

}  // namespace

DeviceStream::DeviceStream(std::unique_ptr<BatchSource> source, int start_index)
    : source_(std::move(source)), next_index_(start_index) {}
DeviceStream::~DeviceStream() = default;

absl::StatusOr<std::shared_ptr<DeviceBatch>> DeviceStream::Next(void* consumer_stream) {
  absl::StatusOr<std::shared_ptr<DeviceBatch>> b = source_->Next(consumer_stream);
  if (!b.ok()) {
    // TrainerStream's own index stands: it is the same number whenever the
    // paths hand out every batch before the error (they do), and it is the
    // one the network saw.
    if (ResumeFrom(b.status()).has_value()) return b.status();
    return WithResumeFrom(b.status(), next_index_);
  }
  if (*b != nullptr) next_index_ = (*b)->meta().index() + 1;
  return b;
}

absl::StatusOr<std::unique_ptr<DeviceStream>> DeviceStream::Open(
    std::shared_ptr<grpc::Channel> channel, const std::string& step_id,
    const v1::RankCoords& rank, const DeviceStreamOptions& options) {
  MicrobatchSourceOpener sources = NetworkSources(channel, step_id, options);
  return OpenFrom(std::move(sources), std::move(channel), step_id, rank, options);
}

absl::StatusOr<std::unique_ptr<DeviceStream>> DeviceStream::OpenFrom(
    MicrobatchSourceOpener sources, std::shared_ptr<grpc::Channel> channel,
    const std::string& step_id, const v1::RankCoords& rank, const DeviceStreamOptions& options) {
  if (options.tp_leader_size > 1 && options.device < 0) {
    return absl::InvalidArgumentError("TP-leader mode needs a CUDA device (NCCL)");
  }
  if (options.device < 0) {
    absl::StatusOr<std::unique_ptr<MicrobatchSource>> stream = sources(rank);
    if (!stream.ok()) return WithResumeFrom(stream.status(), options.start_index);
    return std::unique_ptr<DeviceStream>(new DeviceStream(
        std::make_unique<HostSource>(*std::move(stream), options), options.start_index));
  }
#ifdef ROLLPACK_WITH_CUDA
  absl::StatusOr<std::unique_ptr<BatchSource>> source =
      options.tp_leader_size > 1
          ? trainer_internal::OpenTpLeaderSource(std::move(sources), std::move(channel), step_id,
                                                 rank, options)
          : trainer_internal::OpenCudaSource(std::move(sources), rank, options);
  // Opening failed past the options (CUDA, NCCL, the rendezvous): opening
  // again later starts where this one would have.
  if (!source.ok()) return WithResumeFrom(source.status(), options.start_index);
  return std::unique_ptr<DeviceStream>(new DeviceStream(*std::move(source), options.start_index));
#else
  return absl::FailedPreconditionError(
      "rollpack was built without CUDA (ROLLPACK_WITH_CUDA=OFF): use device -1");
#endif
}

}  // namespace rollpack
