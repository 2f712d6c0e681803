// The cluster of `rollpack bench cluster --mode fetch`: M rollpackd members
// as child processes coordinated by one etcd (each in its own network
// namespace when links are given), and what each has done so far, read from
// its metrics and /proc.
#ifndef ROLLPACK_CLI_BENCH_CLUSTER_MEMBERS_H_
#define ROLLPACK_CLI_BENCH_CLUSTER_MEMBERS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/bench/cleanup.h"
#include "cli/bench/links.h"
#include "testing/daemon_process.h"

namespace rollpack {

// utime + stime of `pid` in seconds.
absl::StatusOr<double> CpuSeconds(pid_t pid);
// Minor page faults of `pid` so far: the first touches of fresh memory.
absl::StatusOr<int64_t> MinorFaults(pid_t pid);

// One rollpackd member, a child process (in its namespace with links).
struct BenchMember {
  std::unique_ptr<DaemonProcess> process;
  std::string host;  // where it listens, gRPC and metrics
  std::string address;
  int metrics_port = 0;
  // Kills the process on a signal; after `process`, so removed first.
  std::unique_ptr<ScopedCleanupAction> cleanup;
};

// What a member has done so far, from its metrics and /proc.
struct MemberCounters {
  double streamed_bytes = 0;  // micro-batches (or pieces) written to trainer streams
  double pulled_bytes = 0;    // samples it pulled from the other members
  double cpu_seconds = 0;
  int64_t minor_faults = 0;
};

// NOT_FOUND when a series is missing (a renamed series must fail the run,
// not read as 0); UNAVAILABLE when /metrics does not answer.
absl::StatusOr<MemberCounters> ReadCounters(const BenchMember& member);

// An etcd-coordinated cluster of M members for one row set. The destructor
// stops the members with SIGTERM, so each revokes its lease.
class BenchCluster {
 public:
  // `links` may be null (every member on 127.0.0.1); members write their
  // port files under `dir`.
  static absl::StatusOr<std::unique_ptr<BenchCluster>> Start(int size, const MemberLinks* links,
                                                             const std::string& etcd_url,
                                                             const std::string& rollpackd,
                                                             const std::string& dir);
  ~BenchCluster();

  std::vector<BenchMember>& members() { return members_; }

 private:
  BenchCluster() = default;
  std::vector<BenchMember> members_;
};

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_CLUSTER_MEMBERS_H_
