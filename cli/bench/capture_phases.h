// The phases of `rollpack bench capture` (cli/bench/capture_command.h):
// requests one at a time per choice size, the same work in this process
// step by step, server-sent events passed through, and many requests in
// flight at once.
#ifndef ROLLPACK_CLI_BENCH_CAPTURE_PHASES_H_
#define ROLLPACK_CLI_BENCH_CAPTURE_PHASES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "cli/bench/capture_client.h"
#include "cli/bench/capture_engine.h"
#include "cli/bench/capture_probes.h"
#include "client/cpp/client.h"

namespace rollpack {

// The default pool (--capture-pool, the uint8 model) and the int16 one.
inline constexpr char kCapturePool[] = "bench";
inline constexpr char kCaptureWidePool[] = "bench-e384";
inline constexpr char kCaptureChatPath[] = "/v1/chat/completions";

// One choice size: its requests and what was measured of them.
struct SizeRow {
  std::string label;
  std::string pool;
  ChoiceShape shape;
  int body_index = 0;          // the engine's X-Bench-Body
  std::string client_body;     // the chat request as the client sends it
  std::string forwarded_body;  // as rollpackd forwards it (the straight requests send this)
  int64_t engine_body_bytes = 0;
  int rounds = 0;
  // Results.
  int64_t client_body_bytes = 0;
  std::vector<double> direct_ms, proxy_ms, paired_ms, own_ms, engine_ms;
  double hist_p50_ms = 0, hist_p99_ms = 0, hist_mean_ms = 0;
  // rollpackd per proxied request (the straight requests never reach it):
  // CPU (user + system, all its threads) and minor page faults.
  double cpu_user_ms = 0, cpu_system_ms = 0, faults = 0;
  // Its busiest threads: (user ms, system ms) per request, busiest first.
  std::vector<std::pair<double, double>> busiest;
  double stripped_per_token = 0;  // the routing payload (metric), per token
  double removed_per_token = 0;   // engine body - client body, per token
  // The same work in this process, p50 ms.
  double prep_ms = 0, parse_ms = 0, sample_ms = 0, validate_ms = 0, put_ms = 0;
  double breakdown_faults = 0;  // minor page faults per request, median
  // Outside rollpackd's own time, in its wait for the engine: a fresh
  // receive buffer of the engine body's size, allocated and zero-filled
  // (std::string::resize, as the proxy reads a Content-Length body), p50 ms.
  double receive_buffer_ms = 0;

  int64_t tokens() const { return shape.prompt_tokens + shape.generated_tokens; }
};

// "8k uint8 E=128".
std::string SizeLabel(int64_t tokens, int experts);

// `row.rounds` pairs (after 5 not counted), alternating which goes first:
// the forwarded request straight to the engine on `direct`, the client's
// through the capture port on `proxy`. Fails when an answer is not 200, not
// `stored` under its sample id, or still holds the routing, or when the pool
// does not hold every sample stored (checked before each release of them).
absl::Status RunSize(SizeRow& row, HttpConnection& direct, HttpConnection& proxy,
                     RollpackClient& client, const RollpackdChild& daemon, int* steps);

// What rollpackd does with the answer, in this process, step by step,
// samples kept and released in batches as RunSize has rollpackd keep them.
// The caller has applied rollpackd's malloc settings (KeepFreedMemory).
absl::Status Breakdown(SizeRow& row, int rounds);

// Streams at once, even ones straight to the engine, odd ones through the
// capture port.
struct StreamSide {
  std::vector<double> event_ms;  // arrival - the engine's write, per event
  int streams_ok = 0;
  std::string problem;
};
struct StreamsResult {
  StreamSide direct, proxy;
  double passthrough_counted = 0;  // the port's passthrough counter, grown by
};
StreamsResult RunStreams(int engine_port, const RollpackdChild& daemon, int streams, int events,
                         int interval_us);

// `requests` requests of `row` in flight at once, each on its own
// connection: straight to the engine, then through `daemon` (a fresh child).
struct BurstSide {
  BurstOutcome outcome;
  double all_in_flight_s = 0;  // from the first connect to the engine holding every request
  int arrived = 0;
  double wall_s = 0;
  // rollpackd (the proxied side only).
  ProcStatus in_flight;
  int open_files = 0;
  int64_t peak_rss_kb = 0;
  int peak_threads = 0;
};
struct ConcurrentResult {
  BurstSide direct, proxy;
  ProcStatus idle, after;  // rollpackd before (one request served) and after
  int idle_files = 0;
  int64_t pool_samples = 0;  // GetPool after, the warm-up request's excluded
  int64_t stored_bytes = 0;
  std::vector<double> own_ms;  // its log, per proxied request
  double hist_p50_ms = 0, hist_p99_ms = 0;
};
// Fails (after filling `out`) when a request was lost: not answered, not 200,
// not stored, or not in the pool.
absl::Status RunConcurrent(FakeEngine& engine, const RollpackdChild& daemon, const SizeRow& row,
                           int requests, int spread_ms, ConcurrentResult* out);

}  // namespace rollpack

#endif  // ROLLPACK_CLI_BENCH_CAPTURE_PHASES_H_
