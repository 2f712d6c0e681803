// One delivered micro-batch of a rank (docs/trainer.md, layout.md §7).
#ifndef ROLLPACK_CLIENT_TRAINER_DEVICE_BATCH_H_
#define ROLLPACK_CLIENT_TRAINER_DEVICE_BATCH_H_

#include <map>
#include <memory>
#include <string>

#include "client/trainer/array_ref.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack {

namespace trainer_internal {
struct BatchState;  // batch_state.h: what the delivery paths fill in
}  // namespace trainer_internal

// One micro-batch. Metadata from the wire message (its big byte fields are
// released on a device), arrays on `device`. Device memory is freed when the
// batch is destroyed, stream-ordered after the consumer's stream given to
// DeviceStream::Next(), so tensors viewing it stay valid while the batch is
// alive.
class DeviceBatch {
 public:
  // Only the delivery paths can make the state (its header is private to
  // the library), so only they construct batches.
  explicit DeviceBatch(std::unique_ptr<trainer_internal::BatchState> state);
  ~DeviceBatch();
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;

  const v1::Microbatch& meta() const;
  int device() const;
  const ArrayRef& tokens() const;
  const ArrayRef& cu_seqlens() const;
  const ArrayRef& cu_seqlens_padded() const;
  // [rows, layers, K] uint8 / uint16 as received.
  const ArrayRef& replay_experts() const;
  const ArrayRef& replay_mask() const;
  // [layers, rows, K] int64 (or int32): the unpacked RouterReplay targets.
  const ArrayRef& replay_ids() const;
  const std::map<std::string, ArrayRef>& token_fields() const;
  // Per sequence, in the order of meta().sample_ids() (lifecycle.md section
  // 6), on `device` like cu_seqlens: float32 [S] advantages (absent, dtype
  // DTYPE_UNSPECIFIED, when the step has no estimator) and float64 [S] per
  // scalar every sample of the step has. Group ids and policy versions are
  // host data: meta().group_ids(), meta().policy_versions(). All of them
  // were checked against the number of sequences when the batch was made
  // (both lists empty from a rollpackd older than them).
  const ArrayRef& advantages() const;
  const std::map<std::string, ArrayRef>& scalars() const;
  // Ragged token fields (layout.md section 13), delivered with
  // token_fields, on `device`: values INT32 [num_values] (uint16 ids
  // widened), offsets INT64 [rows + 1] over the rows of tokens (padding rows
  // have empty lists), from 0; checked (monotone, ending at num_values)
  // before the batch was made.
  const std::map<std::string, RaggedArrayRef>& ragged_token_fields() const;

 private:
  std::unique_ptr<trainer_internal::BatchState> state_;
};

}  // namespace rollpack

#endif  // ROLLPACK_CLIENT_TRAINER_DEVICE_BATCH_H_
