#ifndef ROLLPACK_CLI_BENCH_LIFECYCLE_COMMAND_H_
#define ROLLPACK_CLI_BENCH_LIFECYCLE_COMMAND_H_

namespace rollpack {

// `rollpack bench lifecycle`: the cost of CreateStep's selections
// (docs/lifecycle.md) against today's CreateStep by count, on one store in
// this process (no gRPC), over a pool of S samples in GRPO groups. Each
// round creates, side by side, the same-size step by count, by groups, by
// tokens (and whole groups), newest version first and with a staleness
// bound, each a reuse step released right after (the pool stays the
// same). Plan time included. Prints a table and JSON; exit 0 when every
// selection took the samples it should. With --scaling, how CreateStep's
// time grows with the step instead (bench_step_scaling.h).
int RunBenchLifecycleCommand(int argc, char** argv);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_LIFECYCLE_COMMAND_H_
