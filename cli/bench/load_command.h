#ifndef ROLLPACK_CLI_BENCH_LOAD_COMMAND_H_
#define ROLLPACK_CLI_BENCH_LOAD_COMMAND_H_

namespace rollpack {

// `rollpack bench load`: P producers and a controller with R x T trainer
// streams drive a rollpackd child process (or --server) for D seconds.
// Prints throughput, p50/p99 latencies, the server's peak RSS against
// --max-memory, and a count check: every acknowledged sample fetched exactly
// once per replica (tp rank) with equal token checksums. Exit 0 only when
// the counts, checksums and the memory bound hold.
int RunBenchLoadCommand(int argc, char** argv);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_LOAD_COMMAND_H_
