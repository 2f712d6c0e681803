#include "server/capture/captured_sample.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/capture/routing_decode.h"
#include "server/capture/routing_rows.h"
#include "server/capture/sampling_mask_json.h"

namespace rollpack {
namespace {

template <typename T>
v1::NDArray Vector1d(v1::DType dtype, const std::vector<T>& values) {
  v1::NDArray array;
  array.set_dtype(dtype);
  array.add_shape(static_cast<int64_t>(values.size()));
  array.mutable_data()->assign(reinterpret_cast<const char*>(values.data()),
                               values.size() * sizeof(T));
  return array;
}

absl::Status Named(const std::string& sample_id, absl::string_view field,
                   const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("sample \"", sample_id, "\": ", field, ": ", status.message()));
}

// The choice's routing as routed_experts of a sample of `num_tokens`
// tokens, and its row offset.
absl::StatusOr<std::pair<v1::NDArray, int64_t>> Routing(Engine engine,
                                                        const EngineChoice& choice,
                                                        const ModelSpec& model,
                                                        int64_t num_tokens, int64_t start) {
  if (engine == Engine::kVllm) {
    ASSIGN_OR_RETURN(v1::NDArray array, DecodeNpyRouting(choice.routing_base64));
    ASSIGN_OR_RETURN(int64_t offset,
                     PlaceRoutingRows(array.shape(), num_tokens, model, start));
    return std::make_pair(std::move(array), offset);
  }
  ASSIGN_OR_RETURN(DecodedRouting decoded,
                   DecodeSglangRouting(choice.routing_base64, choice.routing_dtype, num_tokens,
                                       model, start));
  return std::make_pair(std::move(decoded.array), decoded.row_offset);
}

// The sampling mask's lists of tokens [from, total) of a choice of `prompt`
// prompt tokens: prompt tokens get empty lists (the sampler chose none of
// them), generated token j its list j.
v1::RaggedArray SamplingMaskField(const SamplingMaskLists& mask, int64_t prompt, int64_t from,
                                  int64_t total) {
  const int64_t first = std::max<int64_t>(from - prompt, 0);
  const int64_t begin = mask.offsets[first];
  const int64_t end = mask.offsets.back();
  std::vector<int64_t> offsets;
  offsets.reserve(total - from + 1);
  offsets.push_back(0);
  for (int64_t i = from; i < total; ++i) {
    offsets.push_back(i < prompt ? offsets.back() : mask.offsets[i - prompt + 1] - begin);
  }
  v1::RaggedArray field;
  v1::NDArray& values = *field.mutable_values();
  values.set_dtype(v1::INT32);
  values.add_shape(end - begin);
  values.mutable_data()->assign(reinterpret_cast<const char*>(mask.ids.data() + begin),
                                static_cast<size_t>(end - begin) * sizeof(int32_t));
  *field.mutable_offsets() = Vector1d(v1::INT64, offsets);
  return field;
}

}  // namespace

absl::StatusOr<v1::Sample> CapturedSample(Engine engine, const EngineChoice& choice,
                                          const ModelSpec& model, int64_t start_offset,
                                          const CapturedIdentity& identity) {
  const std::string& id = identity.sample_id;
  if (!choice.unusable.ok()) return Named(id, "choice", choice.unusable);
  if (choice.routing_base64.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample \"", id, "\": the engine returned no routed experts"));
  }
  if (choice.generated_ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample \"", id, "\": the engine returned no generated token ids"));
  }
  if (!choice.logprobs.empty() && choice.logprobs.size() != choice.generated_ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sample \"", id, "\": ", choice.logprobs.size(), " logprobs for ",
        choice.generated_ids.size(), " generated tokens"));
  }
  if (choice.sampling_mask.present() &&
      choice.sampling_mask.lists() != static_cast<int64_t>(choice.generated_ids.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sample \"", id, "\": ", kSamplingMaskField, ": ", choice.sampling_mask.lists(),
        " lists of kept token ids for ", choice.generated_ids.size(), " generated tokens"));
  }
  const int64_t prompt = static_cast<int64_t>(choice.prompt_ids.size());
  const int64_t total = prompt + static_cast<int64_t>(choice.generated_ids.size());
  if (identity.stored_tokens >= total) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample \"", id, "\": the turn has ", total, " tokens, ",
                     identity.stored_tokens, " are stored already"));
  }

  v1::Sample sample;
  sample.set_sample_id(id);
  sample.set_group_id(identity.group_id);
  sample.set_group_size(identity.group_size);
  sample.set_policy_version(identity.policy_version);
  sample.set_partial(identity.partial);
  sample.set_piece(identity.piece);
  for (const auto& [name, value] : identity.scalars) (*sample.mutable_scalars())[name] = value;

  // Token i of the whole sequence, for i >= stored_tokens.
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;
  std::vector<float> logprobs;
  tokens.reserve(total - identity.stored_tokens);
  loss_mask.reserve(total - identity.stored_tokens);
  for (int64_t i = identity.stored_tokens; i < total; ++i) {
    const bool generated = i >= prompt;
    tokens.push_back(generated ? choice.generated_ids[i - prompt] : choice.prompt_ids[i]);
    loss_mask.push_back(generated ? 1 : 0);
    if (!choice.logprobs.empty()) {
      logprobs.push_back(generated ? choice.logprobs[i - prompt] : 0.0f);
    }
  }
  *sample.mutable_tokens() = Vector1d(v1::INT32, tokens);
  (*sample.mutable_token_fields())["loss_mask"] = Vector1d(v1::UINT8, loss_mask);
  if (!choice.logprobs.empty()) {
    (*sample.mutable_token_fields())["logprobs"] = Vector1d(v1::FLOAT32, logprobs);
  }
  if (choice.sampling_mask.present()) {
    (*sample.mutable_ragged_token_fields())[std::string(kSamplingMaskField)] =
        SamplingMaskField(choice.sampling_mask, prompt, identity.stored_tokens, total);
  }

  auto routing = Routing(engine, choice, model, total, start_offset);
  if (!routing.ok()) return Named(id, "routed_experts", routing.status());
  v1::NDArray& rows = routing->first;
  int64_t offset = routing->second;
  if (offset < start_offset) {
    // An engine that ignored the start answered rows the session has
    // stored already: they are never replaced (lifecycle.md section 5).
    const int64_t skip = std::min<int64_t>(start_offset - offset, rows.shape(0));
    const int64_t row_bytes =
        rows.shape(0) > 0 ? static_cast<int64_t>(rows.data().size()) / rows.shape(0) : 0;
    rows.mutable_data()->erase(0, static_cast<size_t>(skip * row_bytes));
    rows.set_shape(0, rows.shape(0) - skip);
    offset += skip;
  }
  *sample.mutable_routed_experts() = std::move(rows);
  sample.set_routed_experts_row_offset(static_cast<int32_t>(offset));
  return sample;
}

}  // namespace rollpack
