// An independent, deliberately naive implementation of layout.md: computes
// what a rank must receive position by position, straight from the source
// samples as the producer sent them. The demo and tests use it to check the
// server's bytes; it shares no code with scheduler/layout*.
#ifndef ROLLPACK_TESTING_REFERENCE_LAYOUT_H_
#define ROLLPACK_TESTING_REFERENCE_LAYOUT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rollpack/v1/rollouts.pb.h"
#include "rollpack/v1/scheduler.pb.h"
#include "rollpack/v1/trainer.pb.h"

namespace rollpack {

// A ragged token field as a rank receives it (layout.md section 13).
struct ExpectedRagged {
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;  // the stored id width
  std::string values;                       // raw bytes, lists in row order
  std::vector<int64_t> offsets;             // [rows + 1], from 0
};

struct ExpectedMicrobatch {
  std::vector<std::string> sample_ids;
  int local_cp_size = 1;
  int local_cp_rank = 0;
  std::vector<int32_t> cu_seqlens;
  std::vector<int32_t> cu_seqlens_padded;
  int32_t max_seqlen = 0;
  std::vector<int32_t> tokens;
  // Raw bytes of each token field's local stream.
  std::map<std::string, std::string> token_fields;
  // Each ragged field over the same rows (padding rows: empty lists).
  std::map<std::string, ExpectedRagged> ragged_fields;
  std::vector<int> replay_layers;
  // [rows, layers, K] ids widened to int32, and the mask.
  std::vector<int32_t> replay_experts;
  std::vector<uint8_t> replay_mask;
  int64_t router_rows = 0;
};

// Owned layers of pipeline rank `pp_rank` (Megatron's assignment, naive).
std::vector<int> ReferenceStageLayers(int num_layers, const v1::Topology& topology, int pp_rank);

// `plan` comes from GetPlan (its topology is normalised by the server);
// `samples` maps sample id to the sample as sent.
absl::StatusOr<ExpectedMicrobatch> ReferenceMicrobatch(
    const v1::Plan& plan, const v1::ModelSpec& model,
    const std::map<std::string, const v1::Sample*>& samples, const v1::RankCoords& rank,
    int index);

// Compares every field of `got` with `want`; tokens are expected on the first
// stage (and token fields, dense and ragged, on the last) unless
// `all_fields`. The error names the first difference.
absl::Status CheckMicrobatch(const v1::Microbatch& got, const ExpectedMicrobatch& want,
                             const v1::Topology& topology, const v1::RankCoords& rank,
                             const v1::ModelSpec& model, bool all_fields);

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_REFERENCE_LAYOUT_H_
