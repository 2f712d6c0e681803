// The routing payload a pool carries (layout.md sections 1 and 10).
#ifndef ROLLPACK_SCHEDULER_MODEL_SPEC_H_
#define ROLLPACK_SCHEDULER_MODEL_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace rollpack {

// Bound on num_mtp_layers: real models have 1 to 3 MTP depths; a larger
// value is a mistaken field, refused before any sample arrives.
inline constexpr int kMaxMtpLayers = 64;
// Bound on num_layers: the deepest models have about 130 layers. The layout
// keeps a few words per layer and rank, so an unbounded count (a forged
// cluster step record: 700 million) exhausted a member's memory.
inline constexpr int kMaxLayers = 4096;

struct ModelSpec {
  std::string name;
  int num_layers = 0;          // N, MTP layers excluded
  std::vector<int> moe_layers;  // M, sorted; empty = every layer is MoE
  int num_experts = 0;         // E; 0 = dense model, no routing payloads
  int topk = 0;                // K <= E
  bool allow_all_zero_layers = false;
  // Token fields whose float values must be finite (NaN/Inf refused).
  std::vector<std::string> finite_token_fields;
  // D: multi-token-prediction layers N..N+D-1 on the last pipeline stage
  // (layout.md section 10).
  int num_mtp_layers = 0;
  // The samples carry the MTP layers' routing after the decoder's.
  bool mtp_routing = false;
  // V: the vocabulary size; 0 = not declared (layout.md section 13).
  int vocab_size = 0;

  bool is_dense() const { return num_experts == 0; }
  // M with the "empty means all" default applied.
  std::vector<int> ResolvedMoeLayers() const;
  // |M| without building it (0 for a dense model).
  int num_moe_layers() const;
  // MTP layers whose routing the samples carry: D with mtp_routing, else 0.
  int routed_mtp_layers() const { return mtp_routing ? num_mtp_layers : 0; }
  // Layers on the stored layer axis [rows, |M| + routed D, K]: the MoE
  // layers, then the routed MTP layers (0 for a dense model).
  int stored_layers() const;
  // Global layer ids of the stored layer axis, in order: M, then N..N+D-1
  // with mtp_routing.
  std::vector<int> StoredLayerIds() const;
  // How errors name stored layer `position`: "MoE layer 5", or
  // "MTP layer 0 (layer 61)".
  std::string StoredLayerName(int position) const;
  // Bytes of one stored expert id: 1 when E <= 256, else 2.
  int stored_id_bytes() const { return num_experts <= 256 ? 1 : 2; }
  // Bytes of one stored ragged-field id (layout.md section 13): 2 when
  // 0 < V <= 65536, else 4.
  int ragged_id_bytes() const { return vocab_size > 0 && vocab_size <= 65536 ? 2 : 4; }

  friend bool operator==(const ModelSpec& a, const ModelSpec& b) {
    return a.name == b.name && a.num_layers == b.num_layers &&
           a.moe_layers == b.moe_layers && a.num_experts == b.num_experts &&
           a.topk == b.topk && a.allow_all_zero_layers == b.allow_all_zero_layers &&
           a.finite_token_fields == b.finite_token_fields &&
           a.num_mtp_layers == b.num_mtp_layers && a.mtp_routing == b.mtp_routing &&
           a.vocab_size == b.vocab_size;
  }
  friend bool operator!=(const ModelSpec& a, const ModelSpec& b) { return !(a == b); }
};

// INVALID_ARGUMENT naming the field when: num_layers < 1 or > kMaxLayers; moe_layers not
// strictly increasing or outside [0, num_layers); num_experts < 0 or > 65536;
// topk < 1 or > num_experts for a MoE model; topk != 0 for a dense model;
// num_mtp_layers < 0 or > kMaxMtpLayers; mtp_routing with num_mtp_layers < 1
// or a dense model.
absl::Status ValidateModelSpec(const ModelSpec& spec);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_MODEL_SPEC_H_
