// The process_* families every Prometheus client library exports (the Go and
// Python clients' process collector, which prometheus-cpp 1.0 lacks): CPU
// time, resident and virtual memory, open and allowed file descriptors,
// threads and start time, read from /proc/self at scrape time. Linux only.
#ifndef ROLLPACK_SERVER_OPS_METRICS_PROCESS_METRICS_H_
#define ROLLPACK_SERVER_OPS_METRICS_PROCESS_METRICS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "server/ops/metrics/scrape_registry.h"

namespace rollpack::metrics {

struct ProcessStats {
  double cpu_seconds = 0;  // user + system
  int64_t resident_bytes = 0;
  int64_t virtual_bytes = 0;
  int64_t open_fds = 0;
  double max_fds = 0;  // the soft RLIMIT_NOFILE; +Inf when unlimited
  int64_t threads = 0;
  double start_time_seconds = 0;  // since the Unix epoch
};

// This process's stats now. INTERNAL naming the file and field when /proc
// cannot be read or parsed (no procfs mounted, a kernel format not seen).
absl::StatusOr<ProcessStats> ReadProcessStats();

// Registers process_cpu_seconds_total, process_resident_memory_bytes,
// process_virtual_memory_bytes, process_open_fds, process_max_fds,
// process_threads and process_start_time_seconds, set before every scrape.
// A scrape that cannot read /proc leaves the last values (and logs why once).
void AddProcessMetrics(ScrapeRegistry& registry);

}  // namespace rollpack::metrics

#endif  // ROLLPACK_SERVER_OPS_METRICS_PROCESS_METRICS_H_
