#include "client/trainer/static_targets.h"

#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "kernels/replay_kernels_absl.h"
#include "kernels/unpack_static.h"

#ifdef ROLLPACK_WITH_CUDA
#include <cuda_runtime.h>

#include "client/trainer/cuda_check.h"
#include "kernels/unpack_static_cuda.h"
#endif

namespace rollpack {
namespace {

namespace k = kernels;

absl::Status CheckShape(const ReceivedIds& ids, int64_t max_rows, int64_t layers, int kk) {
  if (ids.rows > max_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batch ", ids.index, " has ", ids.rows,
                     " router rows but the static buffer holds max_rows = ", max_rows));
  }
  if (ids.layers != layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batch ", ids.index, " has ", ids.layers,
                     " replay layers but the static buffer has ", layers));
  }
  if (ids.k != kk) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch ", ids.index, " has K = ", ids.k,
                                                   " but the static buffer has K = ", kk));
  }
  return absl::OkStatus();
}

// The batch's [rows, layers, K] ids, checked against the buffer's shape.
absl::StatusOr<ReceivedIds> IdsOf(const DeviceBatch& b, int64_t max_rows, int64_t layers,
                                  int kk) {
  const ArrayRef& e = b.replay_experts();
  ReceivedIds ids;
  ids.index = b.meta().index();
  if (e.shape.size() != 3 || (e.dtype != v1::UINT8 && e.dtype != v1::UINT16)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "micro-batch ", ids.index, " has no replay_experts [rows, layers, K] uint8/uint16 (a "
        "dense model, E = 0?): nothing to write into a static buffer"));
  }
  ids.experts = e.data;
  ids.uint16 = e.dtype == v1::UINT16;
  ids.rows = e.shape[0];
  ids.layers = e.shape[1];
  ids.k = static_cast<int>(e.shape[2]);
  RETURN_IF_ERROR(CheckShape(ids, max_rows, layers, kk));
  const ArrayRef& m = b.replay_mask();
  if (m.dtype == v1::UINT8 && m.numel() == ids.rows) ids.mask = static_cast<const uint8_t*>(m.data);
  return ids;
}

k::StaticUnpackArgs ArgsFor(const StaticTargets& out, const StaticTargetsOptions& o) {
  k::StaticUnpackArgs a;
  a.layers = out.layers;
  a.k = out.k;
  a.num_experts = o.num_experts;
  a.out = out.data;
  a.out_type = out.int32 ? k::OutIndexType::kI32 : k::OutIndexType::kI64;
  a.max_rows = out.max_rows;
  a.out_row_stride = out.row_stride;
  a.out_layer_stride = out.layer_stride;
  a.masked_fill_minus_one = o.masked_fill_minus_one;
  return a;
}

absl::Status Run(const k::StaticUnpackArgs& a, int device, void* stream) {
  if (device < 0) return k::ToAbslStatus(k::cpu::StaticUnpack(a));
#ifdef ROLLPACK_WITH_CUDA
  trainer_internal::DeviceGuard g(device);
  return k::ToAbslStatus(k::cuda::StaticUnpack(a, stream));
#else
  return absl::FailedPreconditionError(
      "rollpack was built without CUDA (ROLLPACK_WITH_CUDA=OFF): static buffers on device -1 only");
#endif
}

}  // namespace

absl::Status WriteReplayTargets(const DeviceBatch& batch, const StaticTargets& out,
                                const StaticTargetsOptions& options, void* stream) {
  ASSIGN_OR_RETURN(const ReceivedIds ids, IdsOf(batch, out.max_rows, out.layers, out.k));
  k::StaticUnpackArgs a = ArgsFor(out, options);
  a.experts = ids.experts;
  a.in_type = ids.uint16 ? k::IndexType::kU16 : k::IndexType::kU8;
  a.mask = ids.mask;
  a.rows = ids.rows;
  return Run(a, batch.device(), stream);
}

absl::Status StageReplayTargets(const DeviceBatch& batch, const StaticStaging& staging,
                                void* stream) {
  ASSIGN_OR_RETURN(const ReceivedIds ids,
                   IdsOf(batch, staging.max_rows, staging.layers, staging.k));
  return StageReplayTargets(ids, staging, batch.device(), stream);
}

absl::Status StageReplayTargets(const ReceivedIds& ids, const StaticStaging& staging, int device,
                                void* stream) {
  RETURN_IF_ERROR(CheckShape(ids, staging.max_rows, staging.layers, staging.k));
  // The staging buffer is sized [max_rows, layers, K]; the sizes come from
  // the caller (C ABI), so bound them before any byte count is formed.
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  if (ids.rows < 0 || staging.layers < 0 || staging.k < 1 || staging.max_rows < 0 ||
      (staging.layers > 0 && staging.max_rows > kMaxElements / staging.layers / staging.k)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro-batch ", ids.index, ": rows ", ids.rows, ", staging [max_rows ", staging.max_rows,
        ", layers ", staging.layers, ", K ", staging.k,
        "]: sizes must be >= 0 (K >= 1) and max_rows x layers x K < 2^40"));
  }
  if (ids.uint16 != staging.uint16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro-batch ", ids.index, " holds ", ids.uint16 ? "uint16" : "uint8",
        " ids but the staging buffer is ", staging.uint16 ? "uint16" : "uint8"));
  }
  const size_t id_bytes = static_cast<size_t>(ids.rows * ids.layers * ids.k) *
                          (ids.uint16 ? 2 : 1);
  const size_t rows = static_cast<size_t>(ids.rows);
  if (staging.rows == nullptr || (rows > 0 && staging.mask == nullptr) ||
      (id_bytes > 0 && (staging.experts == nullptr || ids.experts == nullptr))) {
    return absl::InvalidArgumentError("StaticStaging: null experts, mask or rows");
  }
  if (device < 0) {
    if (id_bytes > 0) std::memcpy(staging.experts, ids.experts, id_bytes);
    if (ids.mask != nullptr) std::memcpy(staging.mask, ids.mask, rows);
    else std::memset(staging.mask, 1, rows);
    *staging.rows = ids.rows;
    return absl::OkStatus();
  }
#ifdef ROLLPACK_WITH_CUDA
  trainer_internal::DeviceGuard g(device);
  auto st = static_cast<cudaStream_t>(stream);
  if (id_bytes > 0) {
    RP_CUDA(cudaMemcpyAsync(staging.experts, ids.experts, id_bytes, cudaMemcpyDeviceToDevice, st));
  }
  if (rows > 0) {
    if (ids.mask != nullptr) {
      RP_CUDA(cudaMemcpyAsync(staging.mask, ids.mask, rows, cudaMemcpyDeviceToDevice, st));
    } else {
      RP_CUDA(cudaMemsetAsync(staging.mask, 1, rows, st));
    }
  }
  return k::ToAbslStatus(k::cuda::StoreRows(staging.rows, ids.rows, stream));
#else
  return absl::FailedPreconditionError("rollpack was built without CUDA (ROLLPACK_WITH_CUDA=OFF)");
#endif
}

absl::Status WriteStagedReplayTargets(const StaticStaging& staging, const StaticTargets& out,
                                      const StaticTargetsOptions& options, int device,
                                      void* stream) {
  if (staging.max_rows != out.max_rows || staging.layers != out.layers || staging.k != out.k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "staging [", staging.max_rows, ", ", staging.layers, ", ", staging.k,
        "] and static buffer [", out.max_rows, ", ", out.layers, ", ", out.k, "] differ"));
  }
  if (staging.rows == nullptr) return absl::InvalidArgumentError("StaticStaging.rows is null");
  k::StaticUnpackArgs a = ArgsFor(out, options);
  a.experts = staging.experts;
  a.in_type = staging.uint16 ? k::IndexType::kU16 : k::IndexType::kU8;
  a.mask = staging.mask;
  a.rows_ptr = staging.rows;
  return Run(a, device, stream);
}

}  // namespace rollpack
