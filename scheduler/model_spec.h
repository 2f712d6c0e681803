// The routing payload a pool carries (layout.md section 1).
#ifndef ROLLPACK_SCHEDULER_MODEL_SPEC_H_
#define ROLLPACK_SCHEDULER_MODEL_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace rollpack {

struct ModelSpec {
  std::string name;
  int num_layers = 0;          // N, MTP layers excluded
  std::vector<int> moe_layers;  // M, sorted; empty = every layer is MoE
  int num_experts = 0;         // E; 0 = dense model, no routing payloads
  int topk = 0;                // K <= E
  bool allow_all_zero_layers = false;
  // Token fields whose float values must be finite (NaN/Inf refused).
  std::vector<std::string> finite_token_fields;

  bool is_dense() const { return num_experts == 0; }
  // M with the "empty means all" default applied.
  std::vector<int> ResolvedMoeLayers() const;
  // Bytes of one stored expert id: 1 when E <= 256, else 2.
  int stored_id_bytes() const { return num_experts <= 256 ? 1 : 2; }

  friend bool operator==(const ModelSpec& a, const ModelSpec& b) {
    return a.name == b.name && a.num_layers == b.num_layers &&
           a.moe_layers == b.moe_layers && a.num_experts == b.num_experts &&
           a.topk == b.topk && a.allow_all_zero_layers == b.allow_all_zero_layers &&
           a.finite_token_fields == b.finite_token_fields;
  }
  friend bool operator!=(const ModelSpec& a, const ModelSpec& b) { return !(a == b); }
};

// INVALID_ARGUMENT naming the field when: num_layers < 1; moe_layers not
// strictly increasing or outside [0, num_layers); num_experts < 0 or > 65536;
// topk < 1 or > num_experts for a MoE model; topk != 0 for a dense model.
absl::Status ValidateModelSpec(const ModelSpec& spec);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_MODEL_SPEC_H_
