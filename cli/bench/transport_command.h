#ifndef ROLLPACK_CLI_BENCH_TRANSPORT_COMMAND_H_
#define ROLLPACK_CLI_BENCH_TRANSPORT_COMMAND_H_

namespace rollpack {

// `rollpack bench transport`: the machine's limits (loopback TCP, memcpy)
// and rollpackd's ingest and fetch throughput, server CPU per GB and peak RSS
// per payload byte, measured side by side in one run against a rollpackd
// child process.
int RunBenchTransportCommand(int argc, char** argv);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_TRANSPORT_COMMAND_H_
