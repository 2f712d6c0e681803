// rollpack: the command-line tool (demo, offline planning, ingest).
#include <cstdio>
#include <cstring>
#include <string>

#include "client/cli/bench_layout_command.h"
#include "client/cli/bench_load_command.h"
#include "client/cli/bench_transport_command.h"
#include "client/cli/demo_command.h"
#include "client/cli/plan_command.h"

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: rollpack <command> [flags]\n"
               "  demo   end-to-end run on an embedded server; exits 0 only if every rank's\n"
               "         bytes match the independent reference\n"
               "  plan   offline packing plan and statistics for a file of lengths\n"
               "  bench layout   bytes per rank vs the minimum and vs DP-partition fetching\n"
               "  bench transport   loopback limits vs rollpackd ingest and fetch throughput\n"
               "  bench load   producers + trainer streams for D seconds: throughput, latencies,\n"
               "               peak RSS, every acknowledged sample fetched once per replica\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    Usage();
    return 2;
  }
  const std::string command = argv[1];
  if (command == "demo") return rollpack::RunDemoCommand(argc - 1, argv + 1);
  if (command == "plan") return rollpack::RunPlanCommand(argc - 1, argv + 1);
  if (command == "bench" && argc >= 3) {
    const std::string bench = argv[2];
    if (bench == "layout") return rollpack::RunBenchLayoutCommand(argc - 2, argv + 2);
    if (bench == "transport") return rollpack::RunBenchTransportCommand(argc - 2, argv + 2);
    if (bench == "load") return rollpack::RunBenchLoadCommand(argc - 2, argv + 2);
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
