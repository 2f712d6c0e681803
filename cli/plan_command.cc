#include "cli/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "cli/flags.h"
#include "scheduler/lengths_file.h"
#include "scheduler/plan_report.h"
#include "scheduler/plan_validation.h"
#include "scheduler/planner.h"
#include "scheduler/scheduler_kind.h"

namespace rollpack {

int RunPlanCommand(int argc, char** argv) {
  std::string lengths_path, svg_path;
  bool json = false;
  Topology t;
  std::string scheduler(TraitsOf(t.scheduler).name);
  // 0 for a size means 1, as on the wire (layout.md section 1).
  int vpp = 1, min_cp = 1, pad_multiple = 1, mgs = 0;
  FlagSet flags("rollpack plan",
                "Offline capacity planning and benchmarking of the scheduler "
                "(docs/scheduler.md): reads a file of sequence lengths, computes the plan for "
                "the topology and token budget given by the flags, validates it and prints its "
                "statistics. Exits 0 on success, 2 on a usage error, 1 when planning fails.");
  flags.String("lengths", &lengths_path,
               "Required. File of sequence lengths, one integer per line; blank lines and "
               "lines starting with '#' are skipped.");
  flags.Int("dp", &t.dp, "Data-parallel size; 0 means 1.").Min(0);
  flags.Int("cp", &t.cp, "Context-parallel size; 0 means 1.").Min(0);
  flags.Int("tp", &t.tp, "Tensor-parallel size; 0 means 1.").Min(0);
  flags.Int("pp", &t.pp, "Pipeline-parallel size; 0 means 1.").Min(0);
  flags.Int("vpp", &vpp, "Virtual pipeline stages per rank; 0 means 1.").Min(0);
  flags.Bool("sequence-parallel", &t.sequence_parallel,
             "Sequence parallelism over the TP group, which sets the padding alignment.");
  flags.Int64("max-tokens-per-rank", &t.max_tokens_per_rank,
              "Required. Token budget T of one rank in one micro-batch.")
      .Min(1);
  flags.String("scheduler", &scheduler, SchedulerKindSpellings() + ".");
  flags.Int("min-cp", &min_cp, "Smallest CP group the dynamic CP scheduler forms; 0 means 1.")
      .Min(0);
  flags.Int("pad-multiple", &pad_multiple,
            "Every padded length is a multiple of this; 0 means 1.")
      .Min(0);
  flags.Int("microbatch-group-size", &mgs,
            "Micro-batches the plan keeps together; 0 means --pp when --vpp > 1, else 1.")
      .Min(0);
  flags.Bool("json", &json, "Print the plan and its statistics as JSON instead of a table.");
  flags.String("svg", &svg_path, "Also write a picture of the plan to this file.");
  if (ParseResult r = flags.Parse(argc, argv); r.should_exit()) return r.exit_code();
  if (lengths_path.empty() || t.max_tokens_per_rank <= 0) {
    return flags.UsageError("--lengths and --max-tokens-per-rank are required");
  }
  if (std::optional<SchedulerKind> kind = SchedulerKindFromName(scheduler)) {
    t.scheduler = *kind;
  } else {
    return flags.UsageError(absl::StrCat("invalid value '", scheduler,
                                         "' for --scheduler: want ", SchedulerKindNames()));
  }
  t.dp = std::max(t.dp, 1);
  t.cp = std::max(t.cp, 1);
  t.tp = std::max(t.tp, 1);
  t.pp = std::max(t.pp, 1);
  t.vpp = std::max(vpp, 1);
  t.min_cp = std::max(min_cp, 1);
  t.pad_multiple = std::max(pad_multiple, 1);
  t.microbatch_group_size = mgs > 0 ? mgs : (t.vpp > 1 ? t.pp : 1);

  absl::StatusOr<std::vector<int64_t>> lengths =
      ReadLengthsFile(lengths_path);
  if (!lengths.ok()) {
    std::cerr << "rollpack plan: " << lengths.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<Plan> plan = ComputePlan(*lengths, t);
  if (!plan.ok()) {
    std::cerr << "rollpack plan: " << plan.status() << "\n";
    return 1;
  }
  if (absl::Status s = ValidatePlan(*plan, *lengths, t); !s.ok()) {
    std::cerr << "rollpack plan: internal error, invalid plan: " << s << "\n";
    return 1;
  }
  const PlanReport report = ReportPlan(*plan, *lengths, t);
  if (json) {
    std::cout << PlanToJson(*plan, *lengths, t, report);
  } else {
    std::cout << FormatReport(report);
  }
  if (!svg_path.empty()) {
    std::ofstream svg(svg_path);
    svg << PlanToSvg(*plan, t);
    if (!svg) {
      std::cerr << "rollpack plan: cannot write " << svg_path << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace rollpack
