// What a DeviceBatch holds, filled in by the delivery paths (host, CUDA
// staging, TP leader). Private to the library, so that the public batch can
// only be read.
#ifndef ROLLPACK_CLIENT_TRAINER_BATCH_STATE_H_
#define ROLLPACK_CLIENT_TRAINER_BATCH_STATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "client/trainer/array_ref.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack::trainer_internal {

struct BatchState {
  BatchState() = default;
  BatchState(const BatchState&) = delete;
  BatchState& operator=(const BatchState&) = delete;
  // The device memory outlives the batch until the consumer's queued work
  // is done: release runs stream-ordered after consumer_stream.
  ~BatchState() {
    if (release) release(consumer_stream);
  }

  v1::Microbatch meta;
  int device = -1;
  ArrayRef tokens, cu_seqlens, cu_seqlens_padded, replay_experts, replay_mask, replay_ids;
  std::map<std::string, ArrayRef> token_fields;
  // Per sequence (lifecycle.md section 6): advantages absent (dtype
  // DTYPE_UNSPECIFIED) when the step has no estimator.
  ArrayRef advantages;
  std::map<std::string, ArrayRef> scalars;
  // Ragged token fields (layout.md section 13), by name.
  std::map<std::string, RaggedArrayRef> ragged_token_fields;
  std::vector<int64_t> host_ids;  // host path: the unpacked ids live here
  // Host path: uint16 ragged values widened to int32 live here, by field.
  std::map<std::string, std::vector<int32_t>> host_ragged_values;
  std::function<void(void*)> release;
  void* consumer_stream = nullptr;
};

}  // namespace rollpack::trainer_internal

#endif  // ROLLPACK_CLIENT_TRAINER_BATCH_STATE_H_
