#include "cli/bench/cluster_members.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "httplib.h"
#include "testing/exposition.h"

namespace rollpack {

// utime + stime of `pid` in seconds: its CPU clock (nanoseconds, where
// /proc/<pid>/stat counts 10 ms ticks, coarse next to a fetch of tenths of a
// second), else /proc/<pid>/stat's fields 14 and 15.
absl::StatusOr<int64_t> MinorFaults(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) may hold spaces: count from its ')'.
  const size_t paren = stat.rfind(')');
  std::istringstream fields(paren == std::string::npos ? "" : stat.substr(paren + 1));
  std::string field;
  for (int k = 3; k <= 10 && fields >> field; ++k) {
    int64_t faults = 0;
    if (k == 10 && absl::SimpleAtoi(field, &faults)) return faults;
  }
  return absl::NotFoundError(absl::StrCat("/proc/", pid, "/stat: no minor fault count"));
}

absl::StatusOr<double> CpuSeconds(pid_t pid) {
  clockid_t clock;
  timespec ts{};
  if (clock_getcpuclockid(pid, &clock) == 0 && clock_gettime(clock, &ts) == 0) {
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
  }
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) may hold spaces: count from its ')'.
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) {
    return absl::NotFoundError(absl::StrCat("/proc/", pid, "/stat: no such process"));
  }
  std::istringstream fields(stat.substr(paren + 1));
  std::string field;
  int64_t utime = 0, stime = 0;
  for (int k = 3; k <= 15 && fields >> field; ++k) {
    if (k == 14 && !absl::SimpleAtoi(field, &utime)) break;
    if (k == 15 && !absl::SimpleAtoi(field, &stime)) break;
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

absl::StatusOr<MemberCounters> ReadCounters(const BenchMember& member) {
  httplib::Client http(member.host, member.metrics_port);
  http.set_connection_timeout(5);
  http.set_read_timeout(10);
  httplib::Result res = http.Get("/metrics");
  if (!res || res->status != 200) {
    return absl::UnavailableError(absl::StrCat("GET http://", member.host, ":",
                                               member.metrics_port, "/metrics failed"));
  }
  const std::map<std::string, double> series = ParseExposition(res->body);
  // A renamed series must fail the run, not read as 0.
  auto value = [&](const std::string& name) -> absl::StatusOr<double> {
    auto it = series.find(name);
    if (it == series.end()) {
      return absl::NotFoundError(absl::StrCat("member ", member.address, "'s /metrics has no ",
                                              name));
    }
    return it->second;
  };
  MemberCounters out;
  ASSIGN_OR_RETURN(out.streamed_bytes, value("rollpack_streamed_bytes_total"));
  ASSIGN_OR_RETURN(out.pulled_bytes, value("rollpack_cluster_pulled_bytes_total"));
  ASSIGN_OR_RETURN(out.cpu_seconds, CpuSeconds(member.process->pid()));
  ASSIGN_OR_RETURN(out.minor_faults, MinorFaults(member.process->pid()));
  return out;
}

absl::StatusOr<std::unique_ptr<BenchCluster>> BenchCluster::Start(int size,
                                                                  const MemberLinks* links,
                                                                  const std::string& etcd_url,
                                                                  const std::string& rollpackd,
                                                                  const std::string& dir) {
  std::unique_ptr<BenchCluster> cluster(new BenchCluster());
  for (int i = 0; i < size; ++i) {
    BenchMember member;
    member.host = links != nullptr ? links->member_ip(i) : "127.0.0.1";
    const std::string metrics_file = absl::StrCat(dir, "/m", size, "-", i, ".metrics");
    std::remove(metrics_file.c_str());
    std::vector<std::string> args = {
        "--listen=" + member.host + ":0",
        // The advertised address defaults to the listen address with the
        // port bound: the namespace's address with links.
        "--cluster-etcd=" + etcd_url,
        // A cluster name per M: members of the previous row set are gone
        // (SIGTERM revokes their leases), but a name of its own is certain.
        absl::StrCat("--cluster-name=fetch", size),
        "--metrics-listen=" + member.host + ":0",
        "--metrics-port-file=" + metrics_file,
        "--log-level=error",
        "--max-memory=17179869184",
    };
    std::string binary = rollpackd;
    if (links != nullptr) {
      // `ip netns exec` execs rollpackd in the namespace: same pid, so
      // /proc/<pid>/stat and kill reach rollpackd itself.
      args.insert(args.begin(), {"netns", "exec", links->netns(i), rollpackd});
      binary = access("/usr/sbin/ip", X_OK) == 0 ? "/usr/sbin/ip" : "/sbin/ip";
    }
    absl::StatusOr<std::unique_ptr<DaemonProcess>> process =
        DaemonProcess::Start(binary, args, absl::StrCat(dir, "/m", size, "-", i, ".port"));
    if (!process.ok()) {
      return absl::Status(process.status().code(),
                          absl::StrCat("member ", i, " (", binary, " ", absl::StrJoin(args, " "),
                                       "): ", process.status().message()));
    }
    member.process = *std::move(process);
    member.address = absl::StrCat(member.host, ":", member.process->port());
    const pid_t pid = member.process->pid();
    member.cleanup = std::make_unique<ScopedCleanupAction>([pid] { kill(pid, SIGKILL); });
    // The metrics port file is written right after the gRPC one.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (member.metrics_port <= 0 && absl::Now() < deadline) {
      std::ifstream(metrics_file) >> member.metrics_port;
      if (member.metrics_port <= 0) absl::SleepFor(absl::Milliseconds(10));
    }
    if (member.metrics_port <= 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("member ", i, " wrote no metrics port to ", metrics_file, " in 10 s"));
    }
    cluster->members_.push_back(std::move(member));
  }
  return cluster;
}

BenchCluster::~BenchCluster() {
  for (BenchMember& m : members_) {
    m.cleanup.reset();  // before the pid can be reaped and reused
    m.process->Kill(SIGTERM);
  }
}

}  // namespace rollpack
