#include "testing/synthetic_rollouts.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"

namespace rollpack {
namespace {

template <typename T>
void Put(std::string* data, int64_t i, int64_t value) {
  const T v = static_cast<T>(value);
  std::memcpy(data->data() + i * sizeof(T), &v, sizeof(T));
}

}  // namespace

std::vector<v1::Sample> MakeSyntheticRollouts(const v1::ModelSpec& model,
                                              const SyntheticOptions& options) {
  std::mt19937_64 rng(options.seed);
  std::lognormal_distribution<double> length_dist(std::log(options.median_length), options.sigma);
  std::uniform_int_distribution<int32_t> token_dist(0, 151935);
  std::uniform_real_distribution<float> logprob_dist(-8.0f, 0.0f);
  std::vector<int> moe(model.moe_layers().begin(), model.moe_layers().end());
  if (moe.empty()) {
    moe.resize(model.num_layers());
    std::iota(moe.begin(), moe.end(), 0);
  }
  const int e = model.num_experts();
  const int k = model.topk();
  std::vector<int> experts(std::max(e, 1));
  std::iota(experts.begin(), experts.end(), 0);

  std::vector<v1::Sample> samples;
  samples.reserve(options.num_samples);
  for (int i = 0; i < options.num_samples; ++i) {
    const int64_t n = std::clamp<int64_t>(std::llround(length_dist(rng)), options.min_length,
                                          options.max_length);
    v1::Sample s;
    s.set_sample_id(absl::StrCat("rollout-", i));
    s.set_group_id(absl::StrCat("prompt-", i / 8));
    s.set_policy_version(7);
    (*s.mutable_scalars())["reward"] = (i % 3) * 0.5;
    v1::NDArray* tokens = s.mutable_tokens();
    tokens->set_dtype(v1::INT32);
    tokens->add_shape(n);
    tokens->mutable_data()->resize(n * 4);
    for (int64_t t = 0; t < n; ++t) Put<int32_t>(tokens->mutable_data(), t, token_dist(rng));
    if (options.token_fields) {
      v1::NDArray& lp = (*s.mutable_token_fields())["logprobs"];
      lp.set_dtype(v1::FLOAT32);
      lp.add_shape(n);
      lp.mutable_data()->resize(n * 4);
      for (int64_t t = 0; t < n; ++t) {
        const float v = logprob_dist(rng);
        std::memcpy(lp.mutable_data()->data() + 4 * t, &v, 4);
      }
      v1::NDArray& mask = (*s.mutable_token_fields())["loss_mask"];
      mask.set_dtype(v1::UINT8);
      mask.add_shape(n);
      mask.mutable_data()->resize(n);
      const int64_t prompt = std::min<int64_t>(n - 1, 32 + i % 200);
      for (int64_t t = 0; t < n; ++t) (*mask.mutable_data())[t] = t >= prompt ? 1 : 0;
    }
    if (e == 0) {
      samples.push_back(std::move(s));
      continue;
    }
    // Forms: 0 = vLLM (int32, full, n-1 rows); 1 = compact uint8/uint16, n
    // rows; 2 = int16 compact with a missing row and a row offset.
    const int form = options.mixed_forms ? i % 3 : options.narrow_when_uniform ? 1 : 0;
    const bool full = form == 0;
    const int64_t offset = form == 2 ? std::min<int64_t>(n - 1, 3) : 0;
    const int64_t rows = (form == 1 ? n : n - 1) - offset;
    // With mtp_routing the MTP layers' entries follow the decoder's
    // (layout.md section 10).
    const int mtp = model.mtp_routing() ? model.num_mtp_layers() : 0;
    const int layers = (full ? model.num_layers() : static_cast<int>(moe.size())) + mtp;
    v1::DType dtype = form == 0 ? v1::INT32 : form == 2 ? v1::INT16 : (e <= 256 ? v1::UINT8 : v1::UINT16);
    const int itemsize = dtype == v1::UINT8 ? 1 : dtype == v1::INT32 ? 4 : 2;
    v1::NDArray* re = s.mutable_routed_experts();
    re->set_dtype(dtype);
    re->add_shape(rows);
    re->add_shape(layers);
    re->add_shape(k);
    re->mutable_data()->assign(rows * layers * k * itemsize, '\0');
    s.set_routed_experts_row_offset(static_cast<int32_t>(offset));
    for (int64_t r = 0; r < rows; ++r) {
      const bool missing = form == 2 && r == rows / 2 && rows > 2;
      for (int l = 0; l < layers; ++l) {
        // Partial Fisher-Yates: k distinct experts per (row, layer).
        for (int j = 0; j < k; ++j) {
          std::uniform_int_distribution<int> pick(j, e - 1);
          std::swap(experts[j], experts[pick(rng)]);
        }
        for (int j = 0; j < k; ++j) {
          const int64_t idx = (r * layers + l) * k + j;
          const int64_t id = missing ? -1 : experts[j];
          switch (itemsize) {
            case 1:
              Put<uint8_t>(re->mutable_data(), idx, id);
              break;
            case 2:
              if (dtype == v1::INT16) {
                Put<int16_t>(re->mutable_data(), idx, id);
              } else {
                Put<uint16_t>(re->mutable_data(), idx, id);
              }
              break;
            default:
              Put<int32_t>(re->mutable_data(), idx, id);
          }
        }
      }
    }
    samples.push_back(std::move(s));
  }
  return samples;
}

}  // namespace rollpack
