// rollpackd: the rollpack sidecar server.
#include <algorithm>
#include <pthread.h>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "server/server.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC address host:port; port 0 picks a free one (see --port-file)");
ABSL_FLAG(int64_t, max_memory, 0,
          "bytes of samples to hold before PutSamples gets RESOURCE_EXHAUSTED; 0 = half the RAM");
ABSL_FLAG(int, max_message_bytes, 512 << 20, "largest gRPC message, either way");
ABSL_FLAG(std::string, port_file, "",
          "write the bound port to this file once serving (for port 0)");
ABSL_FLAG(int, shutdown_grace_seconds, 10,
          "on SIGTERM/SIGINT, let streams in flight finish for this long");

namespace {

// Accepts the documented dashed spelling (--max-memory) for absl's
// underscored flag names (--max_memory).
std::vector<std::string> NormalizeFlagSpelling(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& arg = args[i];
    if (arg == "--") break;
    if (arg.rfind("--", 0) != 0) continue;
    const size_t end = std::min(arg.find('='), arg.size());
    std::replace(arg.begin() + 2, arg.begin() + end, '-', '_');
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("rollpackd --listen 127.0.0.1:50051 [--max-memory BYTES]");
  std::vector<std::string> args = NormalizeFlagSpelling(argc, argv);
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());

  // Block the stop signals in every thread (gRPC's inherit the mask) and
  // wait for them synchronously: no work in a signal handler.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  rollpack::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.max_memory_bytes = absl::GetFlag(FLAGS_max_memory);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  absl::StatusOr<std::unique_ptr<rollpack::RollpackServer>> server =
      rollpack::RollpackServer::Start(options);
  if (!server.ok()) {
    spdlog::error("rollpackd: {}", server.status().ToString());
    return 1;
  }

  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << (*server)->port() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  spdlog::info("rollpackd listening on {} (max memory {} bytes)", (*server)->address(),
               (*server)->store().Stats().max_memory_bytes);
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  spdlog::info("rollpackd: signal {}, shutting down", signal_number);
  (*server)->Shutdown(absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_seconds)));
  spdlog::info("rollpackd: stopped");
  return 0;
}
