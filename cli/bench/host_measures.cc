#include "cli/bench/host_measures.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace rollpack {

// Single-stream TCP over 127.0.0.1: the ceiling for one gRPC connection.
double LoopbackTcpGBps(int64_t total_bytes) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(listener);
    return 0;
  }
  std::thread sender([addr, total_bytes] {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) return;
    std::vector<char> buffer(1 << 20, 'x');
    for (int64_t sent = 0; sent < total_bytes;) {
      const ssize_t n = write(fd, buffer.data(), std::min<int64_t>(buffer.size(), total_bytes - sent));
      if (n <= 0) break;
      sent += n;
    }
    close(fd);
  });
  int fd = accept(listener, nullptr, nullptr);
  std::vector<char> buffer(1 << 20);
  const absl::Time start = absl::Now();
  int64_t received = 0;
  while (true) {
    const ssize_t n = read(fd, buffer.data(), buffer.size());
    if (n <= 0) break;
    received += n;
  }
  const double s = absl::ToDoubleSeconds(absl::Now() - start);
  sender.join();
  close(fd);
  close(listener);
  return received / s / 1e9;
}

// memcpy of a buffer larger than the caches: bytes copied per second.
double MemcpyGBps(int64_t bytes, int repeats) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  const absl::Time start = absl::Now();
  for (int i = 0; i < repeats; ++i) std::memcpy((i % 2 ? a : b).data(), (i % 2 ? b : a).data(), bytes);
  return static_cast<double>(bytes) * repeats / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
}

// utime + stime of a /proc/.../stat file, in seconds; 0 when unreadable.
double StatCpuSeconds(const std::string& path) {
  std::ifstream in(path);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = content.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream fields(content.substr(close + 2));
  std::string f;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stol(f);
    if (i == 15) stime = std::stol(f);
  }
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

// CPU seconds of each thread of process `pid` (/proc/PID/task/TID/stat).
std::map<int, double> ThreadCpuSeconds(pid_t pid) {
  std::map<int, double> out;
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    int tid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &tid)) continue;
    out[tid] = StatCpuSeconds((entry.path() / "stat").string());
  }
  return out;
}

// The largest share of `seconds` of wall time one thread was on a CPU: near
// 1, that thread is what limits the phase.
double BusiestThreadShare(const std::map<int, double>& before, const std::map<int, double>& after,
                          double seconds) {
  double busiest = 0;
  for (const auto& [tid, cpu] : after) {
    auto it = before.find(tid);
    busiest = std::max(busiest, cpu - (it == before.end() ? 0.0 : it->second));
  }
  return seconds > 0 ? busiest / seconds : 0;
}


// CPU seconds (user + system) of this process so far.
double ProcessCpuSeconds() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

}  // namespace rollpack
