#include "cli/bench/lifecycle_command.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cli/bench/annotations.h"
#include "cli/bench/step_scaling.h"
#include "cli/bench/support.h"
#include "cli/flags.h"
#include "server/ingest/sample_validation.h"
#include "server/store/convert.h"
#include "server/store/sample_store.h"
#include "testing/synthetic_rollouts.h"

namespace rollpack {
namespace {

struct LifecycleBenchConfig {
  int samples = 65536;
  int group_size = 8;
  // The step's share of the pool: 1 = every sample.
  int step_fraction = 1;
  int rounds = 5;
  double median_length = 256;
  int64_t max_length = 2048;
  int dp = 16;
  int cp = 4;
  int64_t max_tokens_per_rank = 16384;
  bool dynamic_cp = false;
  // Non-empty: the scaling run (bench_step_scaling.h) instead of the table.
  std::vector<std::string> scaling;
  int scaling_rounds = 1;
  std::string data_dir;
  // > 0: the annotation run (bench_annotations.h) instead of the table.
  int64_t annotations = 0;
  int annotation_batch = 1000;
  int annotation_members = 3;
};

struct Mode {
  std::string name;
  StepRequest request;
  std::vector<double> ms;
  int64_t samples_taken = 0;
};

}  // namespace

int RunBenchLifecycleCommand(int argc, char** argv) {
  LifecycleBenchConfig config;
  FlagSet flags("rollpack bench lifecycle",
                "CreateStep by groups, by tokens, newest version first and with a staleness "
                "bound, against CreateStep by count: the same step size from the same pool, "
                "side by side in one run, on one store in this process (plan time included).");
  flags.Int("samples", &config.samples, "Samples in the pool (S).").Min(1);
  flags.Int("group-size", &config.group_size, "Samples per GRPO group.").Min(1);
  flags.Int("step-fraction", &config.step_fraction,
            "A step takes S / this many samples (1: all of them).")
      .Min(1);
  flags.Int("rounds", &config.rounds, "Rounds; each runs every selection once.").Min(1);
  flags.Double("median-length", &config.median_length, "Median rollout length, tokens.");
  flags.Int64("max-length", &config.max_length, "Longest rollout, tokens.").Min(1);
  flags.Int("dp", &config.dp, "Data-parallel ranks of the step.").Min(1);
  flags.Int("cp", &config.cp, "Context-parallel ranks of the step.").Min(1);
  flags.Int64("max-tokens-per-rank", &config.max_tokens_per_rank, "Per-rank token budget.")
      .Min(1);
  flags.Bool("dynamic-cp", &config.dynamic_cp, "Plan with the dynamic CP scheduler.");
  flags.List("scaling", &config.scaling,
             "Instead of the selection table: for each N given (e.g. 100000,300000,1000000), "
             "a pool of N one-token samples on an embedded rollpackd and one CreateStep over "
             "gRPC that takes them all; prints how its time grows with N.");
  flags.Int("scaling-rounds", &config.scaling_rounds,
            "With --scaling: rounds per N (each ingests N samples again).")
      .Min(1);
  flags.String("data-dir", &config.data_dir,
               "With --scaling: the embedded rollpackd's --data-dir (durable mode).");
  flags.Int64("annotations", &config.annotations,
              "Instead of the selection table: AnnotateSamples throughput over a pool of this "
              "many one-token samples (e.g. 100000), on one rollpackd in memory and durable, "
              "and on a cluster annotated through one member; --rounds rounds each.")
      .Min(0);
  flags.Int("annotation-batch", &config.annotation_batch,
            "With --annotations: annotations per request.")
      .Min(1);
  flags.Int("annotation-members", &config.annotation_members,
            "With --annotations: cluster members holding the samples (0: no cluster row; "
            "needs /usr/bin/etcd).")
      .Min(0);
  if (ParseResult r = flags.Parse(argc, argv); r.should_exit()) return r.exit_code();
  if (config.annotations > 0) {
    AnnotationBenchConfig annotation;
    annotation.samples = config.annotations;
    annotation.batch = config.annotation_batch;
    annotation.members = config.annotation_members;
    annotation.rounds = config.rounds;
    return RunAnnotationBench(annotation);
  }
  if (!config.scaling.empty()) {
    StepScalingConfig scaling;
    for (const std::string& n : config.scaling) {
      int64_t value = 0;
      // CreateStepRequest.num_samples is an int32.
      if (!absl::SimpleAtoi(n, &value) || value < 1 || value > INT32_MAX) {
        return flags.UsageError(
            absl::StrCat("--scaling wants sample counts in [1, 2^31), got \"", n, "\""));
      }
      scaling.samples.push_back(value);
    }
    scaling.rounds = config.scaling_rounds;
    scaling.dp = config.dp;
    scaling.cp = config.cp;
    scaling.max_tokens_per_rank = config.max_tokens_per_rank;
    scaling.dynamic_cp = config.dynamic_cp;
    scaling.data_dir = config.data_dir;
    return RunStepScaling(scaling);
  }
  const int groups = config.samples / config.group_size;
  if (groups < 1 || config.samples % config.group_size != 0) {
    std::fprintf(stderr, "rollpack bench lifecycle: --samples must be a multiple of --group-size\n");
    return 2;
  }

  // The pool: whole groups, versions rising every 1024 groups, one
  // arrival order. Fields are kept small: selection reads metadata only.
  SyntheticOptions synthetic;
  synthetic.num_samples = config.samples;
  synthetic.median_length = config.median_length;
  synthetic.max_length = config.max_length;
  synthetic.seed = 7;
  const ModelSpec model = FromProto(BenchModel());
  SampleStore store(int64_t{1} << 40);
  if (!store.RegisterModel("pool", model).ok()) return 1;
  std::vector<StoredSample> samples;
  std::vector<int64_t> lengths;
  int64_t total_tokens = 0;
  int index = 0;
  for (v1::Sample& s : MakeSyntheticRollouts(BenchModel(), synthetic)) {
    s.set_group_id(absl::StrCat("g", index / config.group_size));
    s.set_group_size(config.group_size);
    s.set_policy_version(1 + index / (config.group_size * 1024));
    absl::StatusOr<StoredSample> stored = ValidateSample(s, model);
    if (!stored.ok()) {
      std::fprintf(stderr, "rollpack bench lifecycle: %s\n", stored.status().ToString().c_str());
      return 1;
    }
    lengths.push_back(stored->num_tokens());
    total_tokens += stored->num_tokens();
    samples.push_back(*std::move(stored));
    ++index;
  }
  if (absl::Status s = store.Put("pool", std::move(samples)).status(); !s.ok()) {
    std::fprintf(stderr, "rollpack bench lifecycle: Put: %s\n", s.ToString().c_str());
    return 1;
  }

  Topology topology;
  topology.dp = config.dp;
  topology.cp = config.cp;
  topology.max_tokens_per_rank = config.max_tokens_per_rank;
  if (config.dynamic_cp) topology.scheduler = SchedulerKind::kDynamicCp;
  const int step_groups = std::max(1, groups / config.step_fraction);
  const int step_samples = step_groups * config.group_size;
  int64_t step_tokens = 0;
  for (int i = 0; i < step_samples; ++i) step_tokens += lengths[i];

  auto base = [&](const std::string& id) {
    StepRequest r;
    r.step_id = id;
    r.pool = "pool";
    r.topology = topology;
    r.reuse_samples = true;  // released right after: the pool stays the same
    return r;
  };
  std::vector<Mode> modes;
  modes.push_back({"num_samples (today)", base("count"), {}, 0});
  modes.back().request.selection.num_samples = step_samples;
  modes.push_back({"num_groups", base("groups"), {}, 0});
  modes.back().request.selection.num_groups = step_groups;
  modes.push_back({"num_samples, whole_groups", base("whole"), {}, 0});
  modes.back().request.selection.num_samples = step_samples;
  modes.back().request.selection.whole_groups = true;
  modes.push_back({"num_tokens", base("tokens"), {}, 0});
  modes.back().request.selection.num_tokens = step_tokens;
  modes.push_back({"num_tokens, whole_groups", base("tokens-whole"), {}, 0});
  modes.back().request.selection.num_tokens = step_tokens;
  modes.back().request.selection.whole_groups = true;
  modes.push_back({"num_samples, NEWEST_VERSION", base("newest"), {}, 0});
  modes.back().request.selection.num_samples = step_samples;
  modes.back().request.selection.order = SelectionOrder::kNewestVersion;
  modes.push_back({"num_samples, staleness bound", base("stale"), {}, 0});
  modes.back().request.selection.num_samples = step_samples;
  // A bound no sample passes: the cost of checking, the same samples taken.
  // (The version it reports stays the pool's; the other rows set no bound,
  // so they stay plain.)
  modes.back().request.selection.policy_version = 1 << 10;
  modes.back().request.selection.max_staleness = 1 << 20;

  bool ok = true;
  for (int round = 0; round < config.rounds; ++round) {
    // Rotated each round, so no selection always runs first.
    for (size_t k = 0; k < modes.size(); ++k) {
      Mode& mode = modes[(k + round) % modes.size()];
      const absl::Time start = absl::Now();
      absl::StatusOr<std::shared_ptr<const Step>> step = store.CreateStep(mode.request);
      const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
      if (!step.ok()) {
        std::fprintf(stderr, "rollpack bench lifecycle: %s: %s\n", mode.name.c_str(),
                     step.status().ToString().c_str());
        return 1;
      }
      mode.ms.push_back(ms);
      mode.samples_taken = static_cast<int64_t>((*step)->sample_ids.size());
      // Every selection here takes the same samples (the oldest; the
      // newest version first is the last groups).
      if (mode.samples_taken != step_samples) ok = false;
      if (!store.ReleaseStep(mode.request.step_id).ok()) return 1;
    }
  }

  const double today = Median(modes[0].ms);
  std::printf("rollpack bench lifecycle: pool of %d samples in groups of %d (median %.0f tokens), "
              "steps of %d samples (%lld tokens), dp %d cp %d, %d rounds\n\n",
              config.samples, config.group_size, config.median_length, step_samples,
              static_cast<long long>(step_tokens), config.dp, config.cp, config.rounds);
  std::printf("%-34s %12s %12s %10s\n", "CreateStep selection", "median ms", "samples", "vs today");
  std::vector<std::string> json;
  for (const Mode& mode : modes) {
    const double median = Median(mode.ms);
    std::printf("%-34s %12.1f %12lld %10.2f\n", mode.name.c_str(), median,
                static_cast<long long>(mode.samples_taken), median / today);
    json.push_back(absl::StrFormat("{\"selection\": \"%s\", \"median_ms\": %.2f, "
                                   "\"samples\": %d, \"ratio\": %.3f}",
                                   mode.name, median, mode.samples_taken, median / today));
  }
  std::printf("%-34s %12s\n", "every selection took the step size", ok ? "yes" : "NO");
  std::printf("\nJSON:\n{\"samples\": %d, \"group_size\": %d, \"step_samples\": %d, "
              "\"rounds\": %d, \"modes\": [%s], \"ok\": %s}\n",
              config.samples, config.group_size, step_samples, config.rounds,
              absl::StrJoin(json, ", ").c_str(), ok ? "true" : "false");
  return ok ? 0 : 1;
}

}  // namespace rollpack
