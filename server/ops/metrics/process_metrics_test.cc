// The process_* families against what this test process does: memory held,
// descriptors opened, CPU burned, a thread started.
#include "server/ops/metrics/process_metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rollpack::metrics {
namespace {

ProcessStats ReadOrDie() {
  absl::StatusOr<ProcessStats> stats = ReadProcessStats();
  EXPECT_TRUE(stats.ok()) << stats.status();
  return stats.ok() ? *stats : ProcessStats{};
}

// Busy for `seconds` of this thread's CPU time.
void BurnCpu(double seconds) {
  const std::clock_t until = std::clock() + static_cast<std::clock_t>(seconds * CLOCKS_PER_SEC);
  volatile uint64_t sink = 0;
  while (std::clock() < until) {
    for (int i = 0; i < 100000; ++i) sink = sink * 31 + i;
  }
}

// {"process_open_fds": 12, ...}: unlabelled samples of a text exposition.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    const std::string line = text.substr(start, end - start);
    start = end == std::string::npos ? text.size() : end + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

TEST(ProcessMetricsTest, StatsArePlausible) {
  const ProcessStats stats = ReadOrDie();
  EXPECT_GT(stats.resident_bytes, 1 << 20);  // a gtest binary is past 1 MiB
  EXPECT_GE(stats.virtual_bytes, stats.resident_bytes);
  EXPECT_GE(stats.threads, 1);
  EXPECT_GE(stats.open_fds, 3);  // stdin, stdout, stderr
  EXPECT_GT(stats.max_fds, stats.open_fds);
  EXPECT_GE(stats.cpu_seconds, 0);
  // Started this run, not at boot or in the future (start ticks are 1/100 s).
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(stats.start_time_seconds, now + 1);
  EXPECT_GT(stats.start_time_seconds, now - 600);
}

TEST(ProcessMetricsTest, ResidentMemoryGrowsWithPagesTouched) {
  const int64_t before = ReadOrDie().resident_bytes;
  std::vector<char> held(int64_t{64} << 20, 1);  // written: resident
  asm volatile("" : : "r"(held.data()) : "memory");  // kept: the compiler may not elide it
  const int64_t after = ReadOrDie().resident_bytes;
  EXPECT_GE(after - before, int64_t{60} << 20);
}

TEST(ProcessMetricsTest, OpenFdsCountEveryDescriptor) {
  const int64_t before = ReadOrDie().open_fds;
  std::vector<int> fds;
  for (int i = 0; i < 10; ++i) {
    fds.push_back(open("/dev/null", O_RDONLY | O_CLOEXEC));
    ASSERT_GE(fds.back(), 0);
  }
  EXPECT_EQ(ReadOrDie().open_fds, before + 10);
  for (int fd : fds) close(fd);
  EXPECT_EQ(ReadOrDie().open_fds, before);
}

TEST(ProcessMetricsTest, CpuSecondsAndThreadsFollowTheProcess) {
  const ProcessStats before = ReadOrDie();
  BurnCpu(0.2);
  const ProcessStats burned = ReadOrDie();
  EXPECT_GE(burned.cpu_seconds - before.cpu_seconds, 0.15);
  absl::Notification counted;
  std::thread extra([&counted] { counted.WaitForNotification(); });
  EXPECT_EQ(ReadOrDie().threads, before.threads + 1);
  counted.Notify();
  extra.join();
}

TEST(ProcessMetricsTest, ScrapesExportTheStandardFamilies) {
  ScrapeRegistry registry;
  AddProcessMetrics(registry);
  const std::string first = registry.SerializeText();
  for (const char* family :
       {"process_cpu_seconds_total counter", "process_resident_memory_bytes gauge",
        "process_virtual_memory_bytes gauge", "process_open_fds gauge", "process_max_fds gauge",
        "process_threads gauge", "process_start_time_seconds gauge"}) {
    EXPECT_THAT(first, ::testing::HasSubstr(std::string("# TYPE ") + family + "\n"));
  }
  std::map<std::string, double> samples = Samples(first);
  EXPECT_GT(samples["process_resident_memory_bytes"], 0);
  EXPECT_GT(samples["process_max_fds"], samples["process_open_fds"]);
  EXPECT_GT(samples["process_start_time_seconds"], 1.5e9);
  const double cpu = samples["process_cpu_seconds_total"];
  BurnCpu(0.2);
  samples = Samples(registry.SerializeText());
  EXPECT_GE(samples["process_cpu_seconds_total"] - cpu, 0.15);
}

}  // namespace
}  // namespace rollpack::metrics
