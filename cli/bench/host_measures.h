// What `rollpack bench transport` measures of the host itself: the limits of
// one loopback TCP connection and of memcpy, and the CPU time processes and
// their threads spent (from /proc and getrusage), so each figure of the bench
// can be read against what the machine can do.
#ifndef ROLLPACK_CLI_BENCH_HOST_MEASURES_H_
#define ROLLPACK_CLI_BENCH_HOST_MEASURES_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>

namespace rollpack {

// Single-stream TCP over 127.0.0.1: the ceiling for one gRPC connection.
// GB/s (1e9 bytes per second); 0 when no socket could be set up.
double LoopbackTcpGBps(int64_t total_bytes);

// memcpy of a buffer larger than the caches: bytes copied per second (GB/s).
double MemcpyGBps(int64_t bytes, int repeats);

// utime + stime of a /proc/.../stat file, in seconds; 0 when unreadable.
double StatCpuSeconds(const std::string& path);

// CPU seconds of each thread of process `pid` (/proc/PID/task/TID/stat).
std::map<int, double> ThreadCpuSeconds(pid_t pid);

// The largest share of `seconds` of wall time one thread was on a CPU
// between two ThreadCpuSeconds readings: near 1, that thread is what limits
// the phase.
double BusiestThreadShare(const std::map<int, double>& before, const std::map<int, double>& after,
                          double seconds);

// CPU seconds (user + system) of this process so far.
double ProcessCpuSeconds();

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_HOST_MEASURES_H_
