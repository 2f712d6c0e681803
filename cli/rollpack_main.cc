// rollpack: the command-line tool (demo, offline planning, ingest, benchmarks).
// Only dispatch happens here; each command parses its own flags (cli/flags.h)
// and answers its own --help.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <stdlib.h>
#include <unistd.h>

#include "cli/bench/capture_command.h"
#include "cli/bench/cluster_command.h"
#include "cli/bench/lifecycle_command.h"
#include "cli/bench/mask_command.h"
#include "cli/bench/pieces_command.h"
#include "cli/bench/layout_command.h"
#include "cli/bench/load_command.h"
#include "cli/bench/transport_command.h"
#include "cli/demo_command.h"
#include "cli/bench/grpc_ceiling.h"
#include "cli/plan_command.h"
#include "cli/python_forward.h"
#include "server/ops/build_info.h"

namespace {

// `rollpack put` (the Python producer's JSONL ingester: the engine adapters
// live there, once), `rollpack pool`, `step`, ... (the controller tools, over
// rollpack.Controller) are client/python/rollpack/__main__.py's, reached by
// ForwardToPython (cli/python_forward.h); argv goes on as is.
using rollpack::ForwardToPython;

// Answered here, not by Python: the version is the binary's.
int PrintVersion(int argc, char** argv) {
  std::printf("%s\n", rollpack::VersionLine("rollpack").c_str());
  return 0;
}

// Each command gets argv from its own name on (argv[0] == name).
struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};

const Command kCommands[] = {
    {"demo", "end-to-end run on an embedded server; exits 0 only if every rank's bytes match",
     rollpack::RunDemoCommand},
    {"plan", "offline packing plan and statistics for a file of lengths",
     rollpack::RunPlanCommand},
    {"put", "ingest captured engine responses via the Python producer (docs/producer.md)",
     ForwardToPython},
    {"pool", "show, list, register or annotate pools (docs/operations.md#controller)",
     ForwardToPython},
    {"step", "create, show, plan, release and list steps (docs/operations.md#controller)",
     ForwardToPython},
    {"cluster", "the cluster's members, their samples and health, and etcd (docs/cluster.md)",
     ForwardToPython},
    {"member", "drain a member before maintenance, or undrain it (docs/cluster.md)",
     ForwardToPython},
    {"version", "this build: version, commit, gRPC and protobuf (also --version)", PrintVersion},
};

const Command kBenchmarks[] = {
    {"layout", "bytes per rank vs the minimum and vs DP-partition fetching",
     rollpack::RunBenchLayoutCommand},
    {"transport", "loopback limits vs rollpackd ingest and fetch throughput",
     rollpack::RunBenchTransportCommand},
    {"load", "producers + trainer streams for D seconds: throughput, latencies, peak RSS",
     rollpack::RunBenchLoadCommand},
    {"cluster",
     "CreateStep over M members vs one server; --mode fetch: direct pulls vs proxy, GB/s",
     rollpack::RunBenchClusterCommand},
    {"lifecycle", "CreateStep by groups / tokens / versions vs by count; --scaling: vs size",
     rollpack::RunBenchLifecycleCommand},
    {"pieces", "extending a sample piece by piece: last pieces vs first vs sent whole",
     rollpack::RunBenchPiecesCommand},
    {"capture", "capture port: own time per request vs straight to the engine; 2,000 in flight",
     rollpack::RunBenchCaptureCommand},
    {"mask", "sampling masks: bytes per token vs a bitset; ingest and fetch with vs without",
     rollpack::RunBenchMaskCommand},
    // Started by bench transport; listed so that its --help can be found.
    {"grpc-sink", "the server half of bench transport's gRPC-alone rows (internal)",
     rollpack::RunGrpcSinkCommand},
};

bool IsHelp(const std::string& arg) { return arg == "-h" || arg == "--help" || arg == "help"; }

void PrintBenchmarks(FILE* out) {
  for (const Command& b : kBenchmarks) {
    std::fprintf(out, "  bench %-12s %s\n", b.name, b.summary);
  }
}

void Usage(FILE* out) {
  std::fprintf(out, "usage: rollpack <command> [flags]   (rollpack <command> --help: its flags)\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-18s %s\n", c.name, c.summary);
  PrintBenchmarks(out);
}

void BenchUsage(FILE* out) {
  std::fprintf(out, "usage: rollpack bench <benchmark> [flags]   "
                    "(rollpack bench <benchmark> --help: its flags)\n");
  PrintBenchmarks(out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    Usage(stderr);
    return 2;
  }
  const std::string command = argv[1];
  if (IsHelp(command)) {
    Usage(stdout);
    return 0;
  }
  if (command == "--version") return PrintVersion(argc - 1, argv + 1);
  for (const Command& c : kCommands) {
    if (command == c.name) return c.run(argc - 1, argv + 1);
  }
  if (command == "bench") {
    if (argc < 3) {
      BenchUsage(stderr);
      return 2;
    }
    const std::string bench = argv[2];
    if (IsHelp(bench)) {
      BenchUsage(stdout);
      return 0;
    }
    for (const Command& b : kBenchmarks) {
      if (bench == b.name) return b.run(argc - 2, argv + 2);
    }
    std::fprintf(stderr, "rollpack bench: unknown benchmark \"%s\"\n", bench.c_str());
    BenchUsage(stderr);
    return 2;
  }
  std::fprintf(stderr, "rollpack: unknown command \"%s\"\n", command.c_str());
  Usage(stderr);
  return 2;
}
