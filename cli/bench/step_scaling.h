// `rollpack bench lifecycle --scaling N1,N2,...`: how CreateStep's time
// grows with the step's size (issue 18: plan time n log n up to 1M
// samples). One embedded rollpackd (no cluster), reached over gRPC as a
// trainer reaches it; for each N a pool of N one-token samples, then one
// step that takes all of them. Each row also prints a digest of the plan
// GetPlan returns, so two builds run side by side show the same plans.
#ifndef ROLLPACK_CLI_BENCH_STEP_SCALING_H_
#define ROLLPACK_CLI_BENCH_STEP_SCALING_H_

#include <cstdint>
#include <string>
#include <vector>

namespace rollpack {

struct StepScalingConfig {
  // Pool sizes, in the order run; each a step of all its samples.
  std::vector<int64_t> samples;
  int rounds = 1;
  int dp = 16;
  int cp = 4;
  int64_t max_tokens_per_rank = 16384;
  bool dynamic_cp = false;
  // Durable mode (the server's --data-dir); empty = in memory.
  std::string data_dir;
};

// Prints a table and a JSON line; 0 when every step took its N samples.
int RunStepScaling(const StepScalingConfig& config);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_STEP_SCALING_H_
