// `rollpack plan`: offline capacity planning and benchmarking of the
// scheduler (docs/scheduler.md): flags in, scheduler/plan_report.h out.
#ifndef ROLLPACK_CLI_PLAN_COMMAND_H_
#define ROLLPACK_CLI_PLAN_COMMAND_H_

namespace rollpack {

// argv[0] is "plan". Returns the process exit code (0 ok, 2 usage error,
// 1 planning error).
int RunPlanCommand(int argc, char** argv);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_PLAN_COMMAND_H_
