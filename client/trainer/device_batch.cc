#include "client/trainer/device_batch.h"

#include <utility>

#include "client/trainer/batch_state.h"

namespace rollpack {

DeviceBatch::DeviceBatch(std::unique_ptr<trainer_internal::BatchState> state)
    : state_(std::move(state)) {}
DeviceBatch::~DeviceBatch() = default;

const v1::Microbatch& DeviceBatch::meta() const { return state_->meta; }
int DeviceBatch::device() const { return state_->device; }
const ArrayRef& DeviceBatch::tokens() const { return state_->tokens; }
const ArrayRef& DeviceBatch::cu_seqlens() const { return state_->cu_seqlens; }
const ArrayRef& DeviceBatch::cu_seqlens_padded() const { return state_->cu_seqlens_padded; }
const ArrayRef& DeviceBatch::replay_experts() const { return state_->replay_experts; }
const ArrayRef& DeviceBatch::replay_mask() const { return state_->replay_mask; }
const ArrayRef& DeviceBatch::replay_ids() const { return state_->replay_ids; }
const std::map<std::string, ArrayRef>& DeviceBatch::token_fields() const {
  return state_->token_fields;
}
const ArrayRef& DeviceBatch::advantages() const { return state_->advantages; }
const std::map<std::string, ArrayRef>& DeviceBatch::scalars() const { return state_->scalars; }
const std::map<std::string, RaggedArrayRef>& DeviceBatch::ragged_token_fields() const {
  return state_->ragged_token_fields;
}

}  // namespace rollpack
