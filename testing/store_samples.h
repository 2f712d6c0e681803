// The model, samples and step requests the store tests share: pool "p" of a
// 2-layer MoE model (E = 4, K = 1), samples of n tokens routed to expert 1,
// and the sample as a reuse step takes it.
#ifndef ROLLPACK_TESTING_STORE_SAMPLES_H_
#define ROLLPACK_TESTING_STORE_SAMPLES_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "server/store/sample_store.h"

namespace rollpack {
namespace store_testing {

// 2 layers, both MoE, E = 4, K = 1.
inline ModelSpec Model() {
  ModelSpec m;
  m.name = "m";
  m.num_layers = 2;
  m.num_experts = 4;
  m.topk = 1;
  return m;
}

// `n` tokens of sample `id`, every row routed and valid.
inline StoredSample Sample(const std::string& id, int64_t n, const std::string& group = "",
                           int32_t group_size = 0, int64_t version = 0) {
  StoredSample s;
  s.sample_id = id;
  s.group_id = group;
  s.group_size = group_size;
  s.policy_version = version;
  s.tokens.assign(n, 3);
  s.experts.assign(n * 2, '\x01');
  s.row_valid.assign(n, 1);
  return s;
}

inline Topology Topo() {
  Topology t;
  t.max_tokens_per_rank = 4096;
  return t;
}

// A step of pool "p" over Topo(), selecting by the defaults.
inline StepRequest Request(const std::string& step_id) {
  StepRequest r;
  r.step_id = step_id;
  r.pool = "p";
  r.topology = Topo();
  return r;
}

// The sample as a step holds it (a reuse step taking it by id, released
// again: the sample stays).
inline StoredSample Taken(SampleStore& store, const std::string& id) {
  static int n = 0;
  StepRequest request = Request("look-" + std::to_string(n++));
  request.sample_ids = {id};
  request.reuse_samples = true;
  absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(request);
  EXPECT_TRUE(step.ok()) << step.status();
  if (!step.ok()) return {};
  StoredSample copy = *(*step)->samples.at(0);
  EXPECT_TRUE(store.ReleaseStep(request.step_id).ok());
  return copy;
}

}  // namespace store_testing
}  // namespace rollpack

#endif  // ROLLPACK_TESTING_STORE_SAMPLES_H_
