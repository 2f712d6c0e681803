// Replay targets written into a caller's static buffer, for routers that run
// inside a captured CUDA graph (Megatron's RouterReplay static buffers;
// docs/trainer.md, "Static replay buffers").
//
// A DeviceBatch's own replay_ids are a new allocation per micro-batch, which
// a captured graph cannot read: it replays the pointers it was captured
// with. These functions write the targets into memory the caller allocated
// once, with the unpack kernel (kernels/unpack_static.h), on the caller's
// stream, allocating nothing and never synchronising. Rows past the
// micro-batch's router rows, up to the buffer's max_rows, get filler ids
// (K distinct ids per row and layer), so a graph sized for max_rows never
// routes on ids left from an earlier micro-batch.
//
// Two ways to use them:
// - Eager: WriteReplayTargets(batch, buffer, ...) before the graph is
//   replayed: one kernel reading the batch's staged bytes.
// - Inside the graph: capture WriteStagedReplayTargets(staging, buffer, ...)
//   (one kernel, pointers fixed), and before each replay call
//   StageReplayTargets(batch, staging, ...) outside the capture: two
//   device-to-device copies of the batch's bytes (1 or 2 bytes per id) and a
//   one-thread kernel storing its row count, which the captured kernel reads.
#ifndef ROLLPACK_CLIENT_TRAINER_STATIC_TARGETS_H_
#define ROLLPACK_CLIENT_TRAINER_STATIC_TARGETS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "client/trainer/device_batch.h"

namespace rollpack {

// The caller's buffer: target (row r, local replay layer l, j < K) at
// data + r * row_stride + l * layer_stride + j elements, int64 (what
// Megatron gathers with) or int32. -1 strides: the contiguous
// [max_rows, layers, K] buffer of RouterReplay.set_global_static_buffers,
// whose layer l view [:, l, :] is that layer's target. Any view whose runs
// of K do not overlap works (a slice of a larger buffer, [layers,
// max_rows, K]). Memory of the batch's device (host memory for device -1).
struct StaticTargets {
  void* data = nullptr;
  bool int32 = false;
  int64_t max_rows = 0;
  int64_t layers = 0;
  int k = 0;
  int64_t row_stride = -1;
  int64_t layer_stride = -1;
};

struct StaticTargetsOptions {
  // E: filler ids are (row * K + j) mod E (layout.md section 7's filler,
  // continued past the micro-batch). Required.
  int num_experts = 0;
  // As DeviceStreamOptions::masked_fill_minus_one: rows with mask 0 written
  // as -1 instead of the sender's filler ids (the rows past the micro-batch
  // still get filler ids).
  bool masked_fill_minus_one = false;
};

// Writes `batch`'s targets into `out` on `stream` (a cudaStream_t as void*;
// ignored for a host batch). INVALID_ARGUMENT, naming both numbers, when the
// batch has more router rows than out.max_rows or a different layer count
// or K. Capturable (one kernel launch), but a graph captured with it replays
// this batch's pointers: use the staged pair below for a reusable graph.
absl::Status WriteReplayTargets(const DeviceBatch& batch, const StaticTargets& out,
                                const StaticTargetsOptions& options, void* stream);

// Fixed memory a captured graph reads the current micro-batch from, on the
// batch's device: experts [max_rows, layers, K] (uint8, or uint16 when
// `uint16`: the received dtype, uint8 when E <= 256), mask [max_rows] uint8
// and one int64 row count.
struct StaticStaging {
  void* experts = nullptr;
  bool uint16 = false;
  uint8_t* mask = nullptr;
  int64_t* rows = nullptr;
  int64_t max_rows = 0;
  int64_t layers = 0;
  int k = 0;
};

// Outside any capture: copies the batch's received ids and mask into
// `staging` and stores its row count, stream-ordered on `stream`. Refused as
// WriteReplayTargets is, and when the dtype differs.
absl::Status StageReplayTargets(const DeviceBatch& batch, const StaticStaging& staging,
                                void* stream);

// A micro-batch's received ids as pointers (the C ABI's and Python's form of
// a batch's replay_experts and replay_mask).
struct ReceivedIds {
  const void* experts = nullptr;  // [rows, layers, K]
  bool uint16 = false;
  const uint8_t* mask = nullptr;  // [rows] or null (= all ones)
  int64_t rows = 0;
  int64_t layers = 0;
  int k = 0;
  int index = -1;  // the micro-batch's index, for messages
};

// The same from pointers on `device` (-1 = host memory).
absl::Status StageReplayTargets(const ReceivedIds& ids, const StaticStaging& staging, int device,
                                void* stream);

// The capturable kernel: `out` from what StageReplayTargets last staged (at
// the time the kernel runs). `device`: the staging's CUDA device, -1 = host
// memory (the CPU reference, for tests).
absl::Status WriteStagedReplayTargets(const StaticStaging& staging, const StaticTargets& out,
                                      const StaticTargetsOptions& options, int device,
                                      void* stream);

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_TRAINER_STATIC_TARGETS_H_
