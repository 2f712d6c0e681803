#include "server/ops/metrics/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "spdlog/spdlog.h"

namespace rollpack::metrics {
namespace {

absl::StatusOr<std::string> ReadProcFile(const char* path) {
  FILE* file = std::fopen(path, "r");
  if (file == nullptr) {
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  std::string text;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text.append(buffer, n);
  std::fclose(file);
  return text;
}

// /proc/self/stat, fields numbered as in proc(5) (1 = pid).
struct StatFields {
  int64_t utime_ticks = 0;     // 14
  int64_t stime_ticks = 0;     // 15
  int64_t threads = 0;         // 20
  int64_t start_ticks = 0;     // 22: since boot
  int64_t virtual_bytes = 0;   // 23
  int64_t resident_pages = 0;  // 24
};

absl::StatusOr<StatFields> ReadStat() {
  ASSIGN_OR_RETURN(const std::string text, ReadProcFile("/proc/self/stat"));
  // Field 2, the command name, is in parentheses and may hold spaces and
  // parentheses itself: the fields after it start past the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) {
    return absl::InternalError("/proc/self/stat: no ')' after the command name");
  }
  const std::vector<absl::string_view> rest =
      absl::StrSplit(absl::string_view(text).substr(close + 1), ' ', absl::SkipWhitespace());
  auto field = [&rest](int number, int64_t* out) -> absl::Status {
    const size_t index = number - 3;  // rest[0] is field 3 (state)
    if (index >= rest.size() || !absl::SimpleAtoi(rest[index], out)) {
      return absl::InternalError(absl::StrCat("/proc/self/stat: field ", number, " is \"",
                                              index < rest.size() ? rest[index] : "(missing)",
                                              "\", not an integer"));
    }
    return absl::OkStatus();
  };
  StatFields stat;
  for (const auto& [number, out] :
       {std::pair{14, &stat.utime_ticks}, std::pair{15, &stat.stime_ticks},
        std::pair{20, &stat.threads}, std::pair{22, &stat.start_ticks},
        std::pair{23, &stat.virtual_bytes}, std::pair{24, &stat.resident_pages}}) {
    RETURN_IF_ERROR(field(number, out));
  }
  return stat;
}

// The boot time, seconds since the epoch: /proc/stat's btime line.
absl::StatusOr<int64_t> ReadBootTime() {
  ASSIGN_OR_RETURN(const std::string text, ReadProcFile("/proc/stat"));
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, "btime ")) {
      int64_t seconds = 0;
      if (!absl::SimpleAtoi(line, &seconds)) {
        return absl::InternalError(absl::StrCat("/proc/stat: btime is \"", line, "\""));
      }
      return seconds;
    }
  }
  return absl::InternalError("/proc/stat: no btime line");
}

absl::StatusOr<int64_t> CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) {
    return absl::InternalError(absl::StrCat("cannot open /proc/self/fd: ", std::strerror(errno)));
  }
  int64_t entries = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++entries;
  }
  closedir(dir);
  // Less the descriptor the listing itself held open.
  return entries - 1;
}

}  // namespace

absl::StatusOr<ProcessStats> ReadProcessStats() {
  ASSIGN_OR_RETURN(const StatFields stat, ReadStat());
  ASSIGN_OR_RETURN(const int64_t boot, ReadBootTime());
  ASSIGN_OR_RETURN(const int64_t open_fds, CountOpenFds());
  const double ticks_per_second = static_cast<double>(sysconf(_SC_CLK_TCK));
  ProcessStats out;
  out.cpu_seconds = static_cast<double>(stat.utime_ticks + stat.stime_ticks) / ticks_per_second;
  out.resident_bytes = stat.resident_pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  out.virtual_bytes = stat.virtual_bytes;
  out.threads = stat.threads;
  out.start_time_seconds =
      static_cast<double>(boot) + static_cast<double>(stat.start_ticks) / ticks_per_second;
  out.open_fds = open_fds;
  rlimit files{};
  out.max_fds = getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur == RLIM_INFINITY
                    ? std::numeric_limits<double>::infinity()
                    : static_cast<double>(files.rlim_cur);
  return out;
}

void AddProcessMetrics(ScrapeRegistry& registry) {
  Counter& cpu = registry
                     .AddCounter("process_cpu_seconds_total",
                                 "Total user and system CPU time spent in seconds.")
                     .Add({});
  Gauge& resident = registry
                        .AddGauge("process_resident_memory_bytes", "Resident memory size in bytes.")
                        .Add({});
  Gauge& virtual_memory =
      registry.AddGauge("process_virtual_memory_bytes", "Virtual memory size in bytes.").Add({});
  Gauge& open_fds =
      registry.AddGauge("process_open_fds", "Number of open file descriptors.").Add({});
  Gauge& max_fds =
      registry.AddGauge("process_max_fds", "Maximum number of open file descriptors.").Add({});
  Gauge& threads = registry.AddGauge("process_threads", "Number of OS threads.").Add({});
  Gauge& start_time = registry
                          .AddGauge("process_start_time_seconds",
                                    "Start time of the process since unix epoch in seconds.")
                          .Add({});
  registry.AddCollectCallback([&cpu, &resident, &virtual_memory, &open_fds, &max_fds, &threads,
                               &start_time, logged = std::make_shared<std::atomic<bool>>()] {
    absl::StatusOr<ProcessStats> stats = ReadProcessStats();
    if (!stats.ok()) {
      if (!logged->exchange(true)) {
        spdlog::warn("process_* metrics are not updated: {}", stats.status().ToString());
      }
      return;
    }
    // Scrapes are serialized (ScrapeRegistry): the counter catches up.
    cpu.Increment(stats->cpu_seconds - cpu.Value());
    resident.Set(static_cast<double>(stats->resident_bytes));
    virtual_memory.Set(static_cast<double>(stats->virtual_bytes));
    open_fds.Set(static_cast<double>(stats->open_fds));
    max_fds.Set(stats->max_fds);
    threads.Set(static_cast<double>(stats->threads));
    start_time.Set(stats->start_time_seconds);
  });
}

}  // namespace rollpack::metrics
