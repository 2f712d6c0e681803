// Shared helpers of the libFuzzer targets: building topologies, models and
// length lists from fuzzer bytes, and the oracle's failure report.
#ifndef ROLLPACK_FUZZ_FUZZ_COMMON_H_
#define ROLLPACK_FUZZ_FUZZ_COMMON_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "scheduler/model_spec.h"
#include "scheduler/topology.h"

namespace rollpack {

// An invariant broke: report and abort so libFuzzer saves the input.
#define FUZZ_CHECK(cond)                                                         \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s at %s:%d\n", #cond, __FILE__, \
                   __LINE__);                                                    \
      std::abort();                                                              \
    }                                                                            \
  } while (0)

// Small but unconstrained: values outside the valid ranges are allowed so
// the validators' refusals are exercised too.
inline Topology FuzzTopology(FuzzedDataProvider* in) {
  Topology t;
  t.dp = in->ConsumeIntegralInRange(0, 5);
  t.cp = 1 << in->ConsumeIntegralInRange(0, 3);
  if (in->ConsumeBool()) t.cp = in->ConsumeIntegralInRange(-1, 6);
  t.tp = in->ConsumeIntegralInRange(0, 4);
  t.pp = in->ConsumeIntegralInRange(0, 5);
  t.vpp = in->ConsumeIntegralInRange(0, 3);
  t.sequence_parallel = in->ConsumeBool();
  t.num_layers_in_first_pipeline_stage = in->ConsumeIntegralInRange(0, 4);
  t.num_layers_in_last_pipeline_stage = in->ConsumeIntegralInRange(0, 4);
  t.max_tokens_per_rank = in->ConsumeIntegralInRange<int64_t>(-2, 4096);
  t.pad_multiple = in->ConsumeIntegralInRange(0, 16);
  t.microbatch_group_size = in->ConsumeIntegralInRange(0, 4);
  t.scheduler = in->ConsumeBool() ? SchedulerKind::kDynamicCp : SchedulerKind::kStaticCp;
  t.min_cp = 1 << in->ConsumeIntegralInRange(0, 2);
  return t;
}

inline ModelSpec FuzzModel(FuzzedDataProvider* in) {
  ModelSpec m;
  m.name = "fuzz";
  m.num_layers = in->ConsumeIntegralInRange(0, 16);
  m.num_experts = in->ConsumeIntegralInRange(0, 300);
  m.topk = in->ConsumeIntegralInRange(0, 9);
  const int moe = in->ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < moe; ++i) m.moe_layers.push_back(in->ConsumeIntegralInRange(-1, 17));
  // MTP layers (layout.md section 10), read last so that inputs written
  // before they existed still give D = 0 (an exhausted provider gives 0 and
  // false); 4 stands for an invalid -1.
  const int mtp = in->ConsumeIntegralInRange(0, 4);
  m.num_mtp_layers = mtp == 4 ? -1 : mtp;
  m.mtp_routing = in->ConsumeBool();
  return m;
}

inline std::vector<int64_t> FuzzLengths(FuzzedDataProvider* in) {
  std::vector<int64_t> lengths(in->ConsumeIntegralInRange(0, 96));
  for (int64_t& n : lengths) n = in->ConsumeIntegralInRange<int64_t>(0, 9000);
  return lengths;
}

}  // namespace rollpack

#endif  // ROLLPACK_FUZZ_FUZZ_COMMON_H_
