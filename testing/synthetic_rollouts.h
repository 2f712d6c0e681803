// Deterministic synthetic rollouts shaped like real engine output: long-tailed
// lengths, routed experts as vLLM/SGLang return them (int32, full layer axis,
// n - 1 rows) plus the other accepted forms, and per-token fields. A model
// with mtp_routing gets its MTP layers' routing after the decoder's.
#ifndef ROLLPACK_TESTING_SYNTHETIC_ROLLOUTS_H_
#define ROLLPACK_TESTING_SYNTHETIC_ROLLOUTS_H_

#include <cstdint>
#include <vector>

#include "rollpack/v1/rollouts.pb.h"

namespace rollpack {

struct SyntheticOptions {
  int num_samples = 256;
  double median_length = 2000;
  double sigma = 0.9;
  int64_t min_length = 16;
  int64_t max_length = 16384;
  uint64_t seed = 1;
  // Vary payload forms (dtype, full/compact, n/n-1 rows, missing rows) the
  // way a fleet of mixed engines would.
  bool mixed_forms = true;
  // Without mixed forms: true = what a narrowing producer sends (compact
  // layer axis, uint8/uint16, n rows); false = raw engine output (int32,
  // full layer axis, n - 1 rows).
  bool narrow_when_uniform = false;
  bool token_fields = true;
};

std::vector<v1::Sample> MakeSyntheticRollouts(const v1::ModelSpec& model,
                                              const SyntheticOptions& options);

}  // namespace rollpack

#endif  // ROLLPACK_TESTING_SYNTHETIC_ROLLOUTS_H_
