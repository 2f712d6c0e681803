#include "scheduler/model_spec.h"

#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace rollpack {

std::vector<int> ModelSpec::ResolvedMoeLayers() const {
  if (is_dense()) return {};
  if (!moe_layers.empty()) return moe_layers;
  std::vector<int> all(num_layers);
  std::iota(all.begin(), all.end(), 0);
  return all;
}

int ModelSpec::num_moe_layers() const {
  if (is_dense()) return 0;
  return moe_layers.empty() ? num_layers : static_cast<int>(moe_layers.size());
}

int ModelSpec::stored_layers() const {
  if (is_dense()) return 0;
  return num_moe_layers() + routed_mtp_layers();
}

std::vector<int> ModelSpec::StoredLayerIds() const {
  std::vector<int> ids = ResolvedMoeLayers();
  if (is_dense()) return ids;
  for (int d = 0; d < routed_mtp_layers(); ++d) ids.push_back(num_layers + d);
  return ids;
}

std::string ModelSpec::StoredLayerName(int position) const {
  const int num_moe = num_moe_layers();
  if (position < num_moe) {
    return absl::StrCat("MoE layer ", moe_layers.empty() ? position : moe_layers[position]);
  }
  const int d = position - num_moe;
  return absl::StrCat("MTP layer ", d, " (layer ", num_layers + d, ")");
}

absl::Status ValidateModelSpec(const ModelSpec& spec) {
  const std::string who = absl::StrCat("model \"", spec.name, "\": ");
  if (spec.num_layers < 1 || spec.num_layers > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat(who, "num_layers is ", spec.num_layers,
                                                   ", must be in [1, ", kMaxLayers, "]"));
  }
  for (size_t i = 0; i < spec.moe_layers.size(); ++i) {
    const int l = spec.moe_layers[i];
    if (l < 0 || l >= spec.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, "moe_layers[", i, "] is ", l, ", outside [0, ", spec.num_layers, ")"));
    }
    if (i > 0 && l <= spec.moe_layers[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, "moe_layers must be strictly increasing; moe_layers[", i, "] is ", l,
          " after ", spec.moe_layers[i - 1]));
    }
  }
  for (size_t i = 0; i < spec.finite_token_fields.size(); ++i) {
    const std::string& field = spec.finite_token_fields[i];
    if (field.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, "finite_token_fields[", i, "] is empty"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (spec.finite_token_fields[j] == field) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, "finite_token_fields names \"", field, "\" twice (", j, " and ", i, ")"));
      }
    }
  }
  if (spec.num_experts < 0 || spec.num_experts > 65536) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, "num_experts is ", spec.num_experts, ", must be in [0, 65536]"));
  }
  if (spec.vocab_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, "vocab_size is ", spec.vocab_size, ", must be >= 0 (0: not declared)"));
  }
  if (spec.num_mtp_layers < 0 || spec.num_mtp_layers > kMaxMtpLayers) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, "num_mtp_layers is ", spec.num_mtp_layers, ", must be in [0, ", kMaxMtpLayers, "]"));
  }
  if (spec.mtp_routing && spec.num_mtp_layers < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, "mtp_routing is set but num_mtp_layers is ", spec.num_mtp_layers,
        ": routing of MTP layers needs num_mtp_layers >= 1"));
  }
  if (spec.mtp_routing && spec.is_dense()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, "mtp_routing is set but num_experts is 0 (a dense model has no routing)"));
  }
  if (spec.is_dense()) {
    if (spec.topk != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, "topk is ", spec.topk, " but num_experts is 0 (a dense model)"));
    }
    return absl::OkStatus();
  }
  if (spec.topk < 1 || spec.topk > spec.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, "topk is ", spec.topk, ", must be in [1, num_experts = ",
        spec.num_experts, "]"));
  }
  return absl::OkStatus();
}

}  // namespace rollpack
