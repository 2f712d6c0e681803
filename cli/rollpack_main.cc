// rollpack: the command-line tool (demo, offline planning, ingest).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <stdlib.h>
#include <unistd.h>

#include "cli/bench_layout_command.h"
#include "cli/bench_load_command.h"
#include "cli/bench_transport_command.h"
#include "cli/demo_command.h"
#include "cli/grpc_ceiling.h"
#include "cli/plan_command.h"

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: rollpack <command> [flags]\n"
               "  demo   end-to-end run on an embedded server; exits 0 only if every rank's\n"
               "         bytes match the independent reference\n"
               "  plan   offline packing plan and statistics for a file of lengths\n"
               "  put    ingest captured engine responses: put --from-jsonl FILE --server ADDR\n"
               "         --pool P (runs the Python producer, see docs/producer.md)\n"
               "  bench layout   bytes per rank vs the minimum and vs DP-partition fetching\n"
               "  bench transport   loopback limits vs rollpackd ingest and fetch throughput\n"
               "  bench load   producers + trainer streams for D seconds: throughput, latencies,\n"
               "               peak RSS, every acknowledged sample fetched once per replica\n");
}

}  // namespace

#ifndef ROLLPACK_PYTHON_DIR
#define ROLLPACK_PYTHON_DIR "client/python"  // relative to the repository root
#endif

// `rollpack put` is the Python producer's JSONL ingester (client/python/
// rollpack/__main__.py): the engine adapters live there, once.
int ForwardToPythonPut(int argc, char** argv) {
  const char* existing = getenv("PYTHONPATH");
  std::string path = ROLLPACK_PYTHON_DIR;
  if (existing != nullptr && *existing != '\0') path += std::string(":") + existing;
  setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<char*> args = {const_cast<char*>("/usr/bin/python3"), const_cast<char*>("-m"),
                             const_cast<char*>("rollpack")};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(args[0], args.data());
  std::perror("rollpack put: cannot run /usr/bin/python3");
  return 127;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    Usage();
    return 2;
  }
  const std::string command = argv[1];
  if (command == "demo") return rollpack::RunDemoCommand(argc - 1, argv + 1);
  if (command == "plan") return rollpack::RunPlanCommand(argc - 1, argv + 1);
  if (command == "put") return ForwardToPythonPut(argc, argv);
  if (command == "bench" && argc >= 3) {
    const std::string bench = argv[2];
    if (bench == "layout") return rollpack::RunBenchLayoutCommand(argc - 2, argv + 2);
    if (bench == "transport") return rollpack::RunBenchTransportCommand(argc - 2, argv + 2);
    if (bench == "load") return rollpack::RunBenchLoadCommand(argc - 2, argv + 2);
    // The server half of bench transport's gRPC-alone rows.
    if (bench == "grpc-sink") return rollpack::RunGrpcSinkCommand(argc - 2, argv + 2);
    std::fprintf(stderr, "rollpack bench: unknown benchmark \"%s\"\n", bench.c_str());
    return 2;
  }
  if (command == "-h" || command == "--help" || command == "help") {
    Usage();
    return 0;
  }
  std::fprintf(stderr, "rollpack: unknown command \"%s\"\n", command.c_str());
  Usage();
  return 2;
}
