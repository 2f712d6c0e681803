// What `rollpack bench capture` reads of the rollpackd child it drives: the
// child itself (started with --capture-*, its log in a file), its /proc
// figures (RSS, threads, open files, CPU and page faults, per thread too),
// its /metrics histograms and counters, and the per-request line its
// capture port logs.
#ifndef ROLLPACK_CLI_BENCH_CAPTURE_PROBES_H_
#define ROLLPACK_CLI_BENCH_CAPTURE_PROBES_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace rollpack {

// The q-quantile of `v` (the value of rank ceil(q n)); 0 when empty.
double Percentile(std::vector<double> v, double q);

// /proc/PID/status.
struct ProcStatus {
  int64_t rss_kb = 0;
  int64_t hwm_kb = 0;  // peak RSS
  int threads = 0;
};
ProcStatus ReadProcStatus(pid_t pid);

// CPU seconds (user, system) and minor page faults so far, of a process
// (/proc/PID/stat) or of one thread (/proc/PID/task/TID/stat).
struct ProcCounters {
  double user_s = 0;
  double system_s = 0;
  int64_t minor_faults = 0;
};
ProcCounters ReadProcCounters(const std::string& stat_path);
ProcCounters ReadProcCounters(pid_t pid);
// Every thread's, by thread id.
std::map<int, ProcCounters> ReadThreadCounters(pid_t pid);
// Minor page faults of the calling thread so far.
int64_t ThreadMinorFaults();
int CountOpenFiles(pid_t pid);

// rollpackd as a child process on 127.0.0.1 with ephemeral gRPC, capture
// and metrics ports, its stdout and stderr in DIR/NAME.log. Killed when
// destroyed.
class RollpackdChild {
 public:
  static absl::StatusOr<std::unique_ptr<RollpackdChild>> Start(const std::string& binary,
                                                               const std::string& dir,
                                                               const std::string& name,
                                                               std::vector<std::string> args);
  ~RollpackdChild() { Stop(); }

  // A memory-only child with nothing left to keep: killed, not drained (a
  // graceful stop waits seconds for the benchmark's idle connections).
  void Stop();

  pid_t pid() const { return pid_; }
  int capture_port() const { return capture_port_; }
  int metrics_port() const { return metrics_port_; }
  const std::string& grpc_address() const { return grpc_address_; }
  const std::string& log() const { return log_; }

 private:
  RollpackdChild() = default;
  pid_t pid_ = -1;
  int capture_port_ = 0;
  int metrics_port_ = 0;
  std::string grpc_address_;
  std::string log_;
};

// A Prometheus histogram as scraped.
struct Histogram {
  std::vector<std::pair<double, double>> buckets;  // (le, cumulative count)
  double count = 0;
  double sum = 0;
};

// The capture port's series (shared/spec/capture.md section 7).
struct MetricsScrape {
  Histogram overhead;  // rollpack_capture_overhead_seconds{mode="body"}
  Histogram upstream;  // rollpack_capture_upstream_seconds
  double stripped_bytes = 0;
  double samples = 0;
  double passthrough = 0;  // requests_total{result="passthrough"}, every endpoint
};
absl::StatusOr<MetricsScrape> Scrape(int metrics_port);

// histogram_quantile over the observations between two scrapes: linear
// within the bucket the rank falls in (Prometheus' rule), in seconds.
double HistogramQuantile(const Histogram& before, const Histogram& after, double q);

// Per captured request, from rollpackd's log line (`samples=[ID] ...
// engine=X ms overhead=Y ms`): sample id -> (engine ms, overhead ms).
std::map<std::string, std::pair<double, double>> ReadCaptureLog(const std::string& path);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_CAPTURE_PROBES_H_
