// What testing/standin_engine.py generates, from the formulas at the top of
// that file, as the samples a producer would have put: the independent
// expectation the capture tests compare rollpackd's stored bytes with.
#ifndef ROLLPACK_TESTING_STANDIN_OUTPUTS_H_
#define ROLLPACK_TESTING_STANDIN_OUTPUTS_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "rollpack/v1/rollouts.pb.h"

namespace rollpack {

// The stand-in's model flags (--num-layers, --num-experts, --topk), its
// vocabulary, and the routing ids' width (vLLM: uint8 for E <= 256;
// SGLang: int32).
struct StandinModel {
  int num_layers = 4;
  int num_experts = 8;
  int topk = 2;
  int vocab = 32000;
  int id_bytes = 1;
};

// The tokens the stand-in generates for choice `choice` of `prompt`, and
// their logprobs.
inline std::pair<std::vector<int32_t>, std::vector<float>> StandinGenerated(
    const std::vector<int32_t>& prompt, int choice, int max_tokens,
    const StandinModel& model = {}) {
  int64_t seed = 0;
  for (size_t k = 0; k < prompt.size(); ++k) {
    seed = (seed + static_cast<int64_t>(k + 1) * prompt[k]) % 1000003;
  }
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  for (int j = 0; j < max_tokens; ++j) {
    const int32_t g =
        static_cast<int32_t>((seed + 7919LL * j + 104729LL * choice) % model.vocab);
    tokens.push_back(g);
    logprobs.push_back(-static_cast<float>(((g + 3 * j + 5 * choice) % 64) + 1) / 64.0f);
  }
  return {tokens, logprobs};
}

// A whole sample: `tokens` with `loss_mask` and `logprobs`, and the
// stand-in's routing rows for [0, n - 1), every layer MoE.
inline v1::Sample StandinSample(const std::string& id, const std::vector<int32_t>& tokens,
                                const std::vector<uint8_t>& loss_mask,
                                const std::vector<float>& logprobs,
                                const StandinModel& model = {}) {
  auto vector = [](v1::DType dtype, const void* data, size_t n, size_t size) {
    v1::NDArray a;
    a.set_dtype(dtype);
    a.add_shape(static_cast<int64_t>(n));
    a.set_data(std::string(static_cast<const char*>(data), n * size));
    return a;
  };
  v1::Sample s;
  s.set_sample_id(id);
  *s.mutable_tokens() = vector(v1::INT32, tokens.data(), tokens.size(), 4);
  (*s.mutable_token_fields())["loss_mask"] =
      vector(v1::UINT8, loss_mask.data(), loss_mask.size(), 1);
  (*s.mutable_token_fields())["logprobs"] =
      vector(v1::FLOAT32, logprobs.data(), logprobs.size(), 4);
  const int64_t rows = static_cast<int64_t>(tokens.size()) - 1;
  std::string routing;
  for (int64_t p = 0; p < rows; ++p) {
    for (int l = 0; l < model.num_layers; ++l) {
      for (int k = 0; k < model.topk; ++k) {
        const int32_t expert =
            static_cast<int32_t>((7 * p + 3 * l + 11LL * tokens[p] + k) % model.num_experts);
        routing.append(reinterpret_cast<const char*>(&expert), model.id_bytes);
      }
    }
  }
  v1::NDArray& r = *s.mutable_routed_experts();
  r.set_dtype(model.id_bytes == 1 ? v1::UINT8 : model.id_bytes == 2 ? v1::INT16 : v1::INT32);
  r.add_shape(rows);
  r.add_shape(model.num_layers);
  r.add_shape(model.topk);
  r.set_data(routing);
  return s;
}

// Choice `choice` of `prompt`, stored whole: loss mask 0 on the prompt.
inline v1::Sample StandinChoiceSample(const std::string& id, const std::vector<int32_t>& prompt,
                                      int choice, int max_tokens,
                                      const StandinModel& model = {}) {
  auto [generated, generated_logprobs] = StandinGenerated(prompt, choice, max_tokens, model);
  std::vector<int32_t> tokens = prompt;
  tokens.insert(tokens.end(), generated.begin(), generated.end());
  std::vector<uint8_t> loss_mask(prompt.size(), 0);
  loss_mask.resize(tokens.size(), 1);
  std::vector<float> logprobs(prompt.size(), 0.0f);
  logprobs.insert(logprobs.end(), generated_logprobs.begin(), generated_logprobs.end());
  return StandinSample(id, tokens, loss_mask, logprobs, model);
}

// The stand-in's sampling mask of generated token j (id g): the ids its
// sampler "kept", 1 + ((g + j) mod 4) of them, ascending.
inline std::vector<int32_t> StandinKept(int32_t g, int j, const StandinModel& model = {}) {
  std::set<int32_t> kept;
  for (int r = 0; r <= (g + j) % 4; ++r) kept.insert((g + 61 * r) % model.vocab);
  return std::vector<int32_t>(kept.begin(), kept.end());
}

// The ragged field sampling_mask of a sample whose tokens are `prompt_tokens`
// without a list, then `generated` with the stand-in's lists (values int32,
// offsets int64 [n + 1], as the capture port stores them).
inline v1::RaggedArray StandinSamplingMask(size_t prompt_tokens,
                                           const std::vector<int32_t>& generated,
                                           const StandinModel& model = {}) {
  std::vector<int32_t> values;
  std::vector<int64_t> offsets(prompt_tokens + 1, 0);
  for (size_t j = 0; j < generated.size(); ++j) {
    const std::vector<int32_t> kept = StandinKept(generated[j], static_cast<int>(j), model);
    values.insert(values.end(), kept.begin(), kept.end());
    offsets.push_back(static_cast<int64_t>(values.size()));
  }
  v1::RaggedArray field;
  field.mutable_values()->set_dtype(v1::INT32);
  field.mutable_values()->add_shape(static_cast<int64_t>(values.size()));
  field.mutable_values()->set_data(
      std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  field.mutable_offsets()->set_dtype(v1::INT64);
  field.mutable_offsets()->add_shape(static_cast<int64_t>(offsets.size()));
  field.mutable_offsets()->set_data(
      std::string(reinterpret_cast<const char*>(offsets.data()), offsets.size() * 8));
  return field;
}

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_STANDIN_OUTPUTS_H_
