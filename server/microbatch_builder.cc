#include "server/microbatch_builder.h"

#include <vector>

#include "absl/types/span.h"
#include "scheduler/layout_gather.h"
#include "server/ndarray.h"

namespace rollpack {
namespace {

absl::Span<uint8_t> Bytes(char* data, int64_t size) {
  return absl::MakeSpan(reinterpret_cast<uint8_t*>(data), static_cast<size_t>(size));
}

}  // namespace

absl::Status BuildMicrobatch(const Step& step, const MicrobatchRequest& request,
                             RankMicrobatchLayout* rank, v1::Microbatch* out) {
  out->Clear();
  if (absl::Status s = step.layout.Describe(request.rank, request.index, rank); !s.ok()) {
    return s;
  }
  const GroupLayout& group = *rank->group;
  out->set_step_id(step.step_id);
  out->set_index(request.index);
  out->set_num_microbatches(rank->num_microbatches);
  out->set_local_cp_size(rank->local_cp_size);
  out->set_local_cp_rank(rank->local_cp_rank);
  out->set_max_seqlen(group.max_seqlen);
  out->set_workload(group.work_per_rank);
  for (int seq : group.sequences) out->add_sample_ids(step.samples[seq]->sample_id);
  SetInt32Array(out->mutable_cu_seqlens(), group.cu_seqlens);
  SetInt32Array(out->mutable_cu_seqlens_padded(), group.cu_seqlens_padded);

  auto sample_of = [&](int ordinal) -> const StoredSample& {
    return *step.samples[group.sequences[ordinal]];
  };

  if (rank->first_pipeline_stage || request.all_fields) {
    char* dst = ResizeArray(out->mutable_tokens(), v1::INT32, {rank->local_tokens});
    absl::Status s = GatherRows(
        rank->token_runs, sizeof(int32_t),
        [&](int ordinal) -> const void* { return sample_of(ordinal).tokens.data(); },
        Bytes(dst, rank->local_tokens * int64_t{sizeof(int32_t)}));
    if (!s.ok()) return s;
  }
  if ((rank->last_pipeline_stage || request.all_fields) && !group.sequences.empty()) {
    // Every sample of a pool has the same fields (the store enforces it).
    for (const auto& [name, field] : sample_of(0).token_fields) {
      std::vector<int64_t> shape = {rank->local_tokens};
      shape.insert(shape.end(), field.trailing_shape.begin(), field.trailing_shape.end());
      v1::NDArray& array = (*out->mutable_token_fields())[name];
      char* dst = ResizeArray(&array, field.dtype, shape);
      const int64_t row_bytes = field.row_bytes();
      const std::string& field_name = name;
      absl::Status s = GatherRows(
          rank->token_runs, static_cast<size_t>(row_bytes),
          [&](int ordinal) -> const void* {
            return sample_of(ordinal).token_fields.at(field_name).data.data();
          },
          Bytes(dst, rank->local_tokens * row_bytes));
      if (!s.ok()) return s;
    }
  }

  const ModelSpec& model = step.model;
  out->mutable_replay_layers()->Assign(rank->replay_layers.begin(), rank->replay_layers.end());
  if (model.is_dense()) return absl::OkStatus();

  const int64_t rows = rank->router_rows;
  const int64_t layers = static_cast<int64_t>(rank->replay_layers.size());
  const int id_bytes = model.stored_id_bytes();
  char* experts = ResizeArray(out->mutable_replay_experts(), id_bytes == 1 ? v1::UINT8 : v1::UINT16,
                              {rows, layers, int64_t{model.topk}});
  char* mask = ResizeArray(out->mutable_replay_mask(), v1::UINT8, {rows});
  ReplaySpec spec;
  spec.num_experts = model.num_experts;
  spec.topk = model.topk;
  spec.id_bytes = id_bytes;
  spec.payload_layers = static_cast<int>(step.layout.pipeline().moe_layers().size());
  spec.layer_indices = rank->replay_positions;
  return GatherReplay(
      rank->router_runs, spec,
      [&](int ordinal) {
        const StoredSample& sample = sample_of(ordinal);
        ReplaySource source;
        source.experts = sample.experts.data();
        source.row_offset = 0;
        source.num_rows = sample.num_tokens();
        source.valid = sample.row_valid.data();
        return source;
      },
      Bytes(experts, rows * layers * model.topk * id_bytes), Bytes(mask, rows));
}

}  // namespace rollpack
