#ifndef ROLLPACK_CLI_BENCH_LAYOUT_COMMAND_H_
#define ROLLPACK_CLI_BENCH_LAYOUT_COMMAND_H_

namespace rollpack {

// `rollpack bench layout`: bytes each trainer rank receives from rollpack
// versus the minimal bytes it needs (its own rows and layers) and versus
// fetching its whole DP partition and slicing locally (slime, verl today).
int RunBenchLayoutCommand(int argc, char** argv);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_LAYOUT_COMMAND_H_
