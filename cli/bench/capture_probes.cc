#include "cli/bench/capture_probes.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cli/bench/capture_client.h"
#include "testing/child_process.h"

namespace rollpack {

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

ProcStatus ReadProcStatus(pid_t pid) {
  ProcStatus s;
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    int64_t v = 0;
    auto field = [&](absl::string_view name) {
      if (!absl::StartsWith(line, name)) return false;
      absl::string_view rest = absl::string_view(line).substr(name.size());
      rest = absl::StripAsciiWhitespace(absl::StripSuffix(absl::StripAsciiWhitespace(rest), "kB"));
      return absl::SimpleAtoi(rest, &v);
    };
    if (field("VmRSS:")) s.rss_kb = v;
    if (field("VmHWM:")) s.hwm_kb = v;
    if (field("Threads:")) s.threads = static_cast<int>(v);
  }
  return s;
}

// `path`: /proc/PID/stat, or /proc/PID/task/TID/stat for one thread.
ProcCounters ReadProcCounters(const std::string& path) {
  ProcCounters c;
  std::ifstream in(path);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = content.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return c;
  // After the name: state (3), ..., minflt (10), ..., utime (14), stime (15).
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(content).substr(close + 2), ' ');
  if (fields.size() < 13) return c;
  int64_t minflt = 0, utime = 0, stime = 0;
  (void)absl::SimpleAtoi(fields[7], &minflt);
  (void)absl::SimpleAtoi(fields[11], &utime);
  (void)absl::SimpleAtoi(fields[12], &stime);
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  c.user_s = static_cast<double>(utime) / tick;
  c.system_s = static_cast<double>(stime) / tick;
  c.minor_faults = minflt;
  return c;
}

ProcCounters ReadProcCounters(pid_t pid) {
  return ReadProcCounters(absl::StrCat("/proc/", pid, "/stat"));
}

// Every thread's counters, by thread id.
std::map<int, ProcCounters> ReadThreadCounters(pid_t pid) {
  std::map<int, ProcCounters> out;
  std::error_code error;
  for (const auto& entry :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), error)) {
    int tid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &tid)) continue;
    out[tid] = ReadProcCounters((entry.path() / "stat").string());
  }
  return out;
}

// Minor page faults of the calling thread so far.
int64_t ThreadMinorFaults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

int CountOpenFiles(pid_t pid) {
  int n = 0;
  if (DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(d);
  }
  return n;
}

absl::StatusOr<std::unique_ptr<RollpackdChild>> RollpackdChild::Start(
    const std::string& binary, const std::string& dir, const std::string& name,
    std::vector<std::string> args) {
  auto child = std::unique_ptr<RollpackdChild>(new RollpackdChild());
  child->log_ = absl::StrCat(dir, "/", name, ".log");
  const std::string grpc_file = absl::StrCat(dir, "/", name, ".port");
  const std::string capture_file = absl::StrCat(dir, "/", name, ".capture_port");
  const std::string metrics_file = absl::StrCat(dir, "/", name, ".metrics_port");
  args.insert(args.begin(), binary);
  args.push_back("--listen=127.0.0.1:0");
  args.push_back("--port-file=" + grpc_file);
  args.push_back("--capture-listen=127.0.0.1:0");
  args.push_back("--capture-port-file=" + capture_file);
  args.push_back("--metrics-listen=127.0.0.1:0");
  args.push_back("--metrics-port-file=" + metrics_file);
  // The log is opened here, not in the child: a failure to open it is the
  // command's error, and the child only inherits it as stdout and stderr.
  const int log_fd = open(child->log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("cannot write ", child->log_));
  ChildOutput output;
  output.stdout_fd = log_fd;
  output.stderr_fd = log_fd;
  absl::StatusOr<pid_t> spawned = SpawnChild(std::move(args), output);
  close(log_fd);
  if (!spawned.ok()) return spawned.status();
  const pid_t pid = *spawned;
  child->pid_ = pid;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    int grpc = 0;
    std::ifstream(grpc_file) >> grpc;
    if (grpc > 0) {
      std::ifstream(capture_file) >> child->capture_port_;
      std::ifstream(metrics_file) >> child->metrics_port_;
      child->grpc_address_ = absl::StrCat("127.0.0.1:", grpc);
      if (child->capture_port_ <= 0 || child->metrics_port_ <= 0) {
        return absl::InternalError("rollpackd wrote no capture or metrics port");
      }
      return child;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      child->pid_ = -1;
      return absl::UnavailableError(
          absl::StrCat(binary, " exited (status ", status, ") before serving; see ", child->log_));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat(binary, " did not start; see ", child->log_));
}

void RollpackdChild::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

absl::StatusOr<MetricsScrape> Scrape(int port) {
  absl::StatusOr<std::unique_ptr<HttpConnection>> c = HttpConnection::Connect(port);
  if (!c.ok()) return c.status();
  absl::StatusOr<HttpAnswer> a =
      (*c)->Exchange(HttpRequestBytes("GET", "/metrics", {{"Connection", "close"}}, ""));
  if (!a.ok()) return a.status();
  if (a->status != 200) return absl::InternalError(absl::StrCat("/metrics: status ", a->status));
  MetricsScrape m;
  for (absl::string_view line : absl::StrSplit((*c)->body(), '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    double value = 0;
    if (!absl::SimpleAtod(line.substr(space + 1), &value)) continue;
    const absl::string_view series = line.substr(0, space);
    const absl::string_view name = series.substr(0, series.find('{'));
    // `only`: the series of one label value (the overhead's mode="body":
    // the requests this benchmark times are read whole).
    auto histogram = [&](absl::string_view base, Histogram& h, absl::string_view only = "") {
      if (!only.empty() && !absl::StrContains(series, only)) return;
      if (name == absl::StrCat(base, "_count")) h.count = value;
      if (name == absl::StrCat(base, "_sum")) h.sum = value;
      if (name == absl::StrCat(base, "_bucket")) {
        const size_t le = series.find("le=\"");
        if (le == absl::string_view::npos) return;
        const absl::string_view bound = series.substr(le + 4, series.find('"', le + 4) - le - 4);
        double b = std::numeric_limits<double>::infinity();
        if (bound != "+Inf" && !absl::SimpleAtod(bound, &b)) return;
        h.buckets.emplace_back(b, value);
      }
    };
    histogram("rollpack_capture_overhead_seconds", m.overhead, "mode=\"body\"");
    histogram("rollpack_capture_upstream_seconds", m.upstream);
    if (name == "rollpack_capture_stripped_bytes_total") m.stripped_bytes = value;
    if (name == "rollpack_capture_samples_total") m.samples = value;
    if (name == "rollpack_capture_requests_total" &&
        absl::StrContains(series, "result=\"passthrough\"")) {
      m.passthrough += value;
    }
  }
  return m;
}

// histogram_quantile over the observations between two scrapes: linear
// within the bucket the rank falls in (Prometheus' rule), in seconds.
double HistogramQuantile(const Histogram& before, const Histogram& after, double q) {
  std::vector<std::pair<double, double>> delta;
  for (size_t i = 0; i < after.buckets.size(); ++i) {
    const double b = i < before.buckets.size() ? before.buckets[i].second : 0;
    delta.emplace_back(after.buckets[i].first, after.buckets[i].second - b);
  }
  std::sort(delta.begin(), delta.end());
  if (delta.empty() || delta.back().second <= 0) return 0;
  const double rank = q * delta.back().second;
  double lower = 0, below = 0;
  for (const auto& [le, cumulative] : delta) {
    if (cumulative >= rank) {
      if (std::isinf(le)) return lower;
      if (cumulative == below) return le;
      return lower + (le - lower) * (rank - below) / (cumulative - below);
    }
    lower = le;
    below = cumulative;
  }
  return lower;
}

// Per captured request, from rollpackd's log line (`samples=[ID] ...
// engine=X ms overhead=Y ms`): sample id -> (engine ms, overhead ms).
std::map<std::string, std::pair<double, double>> ReadCaptureLog(const std::string& path) {
  std::map<std::string, std::pair<double, double>> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t s = line.find("samples=[");
    const size_t e = line.find("engine=");
    const size_t o = line.find("overhead=");
    if (s == std::string::npos || e == std::string::npos || o == std::string::npos) continue;
    const size_t close = line.find(']', s);
    if (close == std::string::npos) continue;
    const std::string id = line.substr(s + 9, close - s - 9);
    out[id] = {std::strtod(line.c_str() + e + 7, nullptr),
               std::strtod(line.c_str() + o + 9, nullptr)};
  }
  return out;
}

}  // namespace rollpack
