#include "cli/bench/capture_command.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/bench/capture_client.h"
#include "cli/bench/capture_engine.h"
#include "cli/bench/capture_phases.h"
#include "cli/bench/capture_probes.h"
#include "cli/bench/support.h"
#include "cli/flags.h"
#include "client/cpp/client.h"
#include "server/capture/engine_exchange.h"
#include "base/keep_freed_memory.h"

namespace rollpack {
namespace {

struct CaptureBenchConfig {
  std::vector<std::string> sizes = {"1024", "8192", "32768"};
  int rounds = 500;
  int64_t wide_tokens = 8192;
  int layers = 48;
  int topk = 8;
  int experts = 128;
  int wide_experts = 384;
  int breakdown_rounds = 20;
  int concurrent = 2000;
  int64_t concurrent_tokens = 1024;
  int answer_spread_ms = 1000;
  int streams = 16;
  int stream_events = 200;
  int stream_interval_us = 5000;
  int64_t max_memory = int64_t{16} << 30;
  std::string rollpackd;
  bool keep_logs = false;
};

std::string Mb(int64_t bytes) { return absl::StrFormat("%.2f", static_cast<double>(bytes) / 1e6); }

std::string JsonList(const std::vector<std::string>& items) {
  return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
}

}  // namespace

int RunBenchCaptureCommand(int argc, char** argv) {
  CaptureBenchConfig c;
  FlagSet flags(
      "rollpack bench capture",
      "The HTTP capture port (shared/spec/capture.md section 8): a stand-in vLLM in this process "
      "answers /v1/chat/completions (bodies computed once) behind a rollpackd child with "
      "--capture-*. Per request, one at a time: rollpackd's own time (its log and the "
      "overhead histogram), and end to end through the port against straight to the engine, "
      "alternated; the same work in this process step by step; 2,000 requests in flight on a "
      "fresh child (threads, RSS, none lost); server-sent events through the port against "
      "straight, at once. Prints tables and JSON.");
  flags.List(
      "sizes", &c.sizes,
      "Tokens per choice (prompt + generated, half each) of the uint8 rows (E = --experts).");
  flags
      .Int("rounds", &c.rounds,
           "Request pairs (straight + through the port) per size up to 8,192 tokens; larger "
           "sizes get rounds x 8192 / tokens (at least 10).")
      .Min(1);
  flags
      .Int64("wide-tokens", &c.wide_tokens,
             "Tokens of the int16 row (E = --wide-experts, vLLM's int16 ids); 0: no such row.")
      .Min(0);
  flags.Int("layers", &c.layers, "MoE layers of the model.").Min(1);
  flags.Int("topk", &c.topk, "Experts per token.").Min(1);
  flags.Int("experts", &c.experts, "Experts per layer of the uint8 rows (<= 256).").Range(2, 256);
  flags.Int("wide-experts", &c.wide_experts, "Experts per layer of the int16 row (> 256).")
      .Range(257, 32767);
  flags
      .Int("breakdown-rounds", &c.breakdown_rounds,
           "Rounds of the in-process breakdown per row; 0: none.")
      .Min(0);
  flags.Int("concurrent", &c.concurrent, "Requests in flight at once; 0: no such phase.").Min(0);
  flags.Int64("concurrent-tokens", &c.concurrent_tokens, "Tokens per choice of those requests.")
      .Min(2);
  flags
      .Int("answer-spread-ms", &c.answer_spread_ms,
           "Once all are in flight, the engine answers them spread over this long.")
      .Min(0);
  flags
      .Int("streams", &c.streams,
           "Streams at once, half straight to the engine, half through the port; 0: none.")
      .Min(0);
  flags.Int("stream-events", &c.stream_events, "Events per stream.").Min(1);
  flags.Int("stream-interval-us", &c.stream_interval_us, "Between a stream's events.").Min(0);
  flags.Int64("max-memory", &c.max_memory, "The rollpackd children's --max-memory, bytes.").Min(1);
  flags.String("rollpackd", &c.rollpackd,
               "rollpackd binary to start; empty: the one next to this program.");
  flags.Bool("keep-logs", &c.keep_logs, "Keep the children's logs (their directory is printed).");
  if (ParseResult r = flags.Parse(argc, argv); r.should_exit()) return r.exit_code();
  // As rollpackd (before any thread starts): the breakdown in this process
  // then pays what rollpackd pays for the memory of the samples it keeps.
  KeepFreedMemory();
  if (c.experts % c.topk != 0 || c.wide_experts % c.topk != 0) {
    return flags.UsageError("--experts and --wide-experts must be multiples of --topk");
  }
  std::vector<int64_t> sizes;
  for (const std::string& s : c.sizes) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(s, &n) || n < 2) return flags.UsageError("--sizes: integers >= 2");
    sizes.push_back(n);
  }
  const std::string binary = c.rollpackd.empty() ? SelfDir() + "/rollpackd" : c.rollpackd;
  if (access(binary.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "rollpack bench capture: no rollpackd at %s (--rollpackd)\n",
                 binary.c_str());
    return 1;
  }
  // 2,000 client connections and as many of rollpackd's to the engine end
  // in this process.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  char tmpl[] = "/tmp/rollpack-bench-capture-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::fprintf(stderr, "rollpack bench capture: mkdtemp failed\n");
    return 1;
  }
  const std::string dir = tmpl;
  bool ok = true;
  auto fail = [&](const std::string& what, const absl::Status& s) {
    std::fprintf(stderr, "rollpack bench capture: %s: %s\n", what.c_str(), s.ToString().c_str());
    ok = false;
  };
  struct Cleanup {
    const std::string& dir;
    const bool& keep;
    ~Cleanup() {
      if (!keep) std::filesystem::remove_all(dir);
    }
  };
  bool keep = c.keep_logs;
  Cleanup cleanup{dir, keep};

  // ---- The rows and the engine's bodies, computed once.
  std::vector<SizeRow> rows;
  std::vector<std::string> bodies;
  auto make_row = [&](int64_t tokens, int experts, const std::string& pool, int rounds) {
    SizeRow row;
    row.shape.prompt_tokens = tokens / 2;
    row.shape.generated_tokens = tokens - tokens / 2;
    row.shape.layers = c.layers;
    row.shape.topk = c.topk;
    row.shape.experts = experts;
    row.label = SizeLabel(tokens, experts);
    row.pool = pool;
    row.rounds = rounds;
    row.client_body =
        ChatRequestBody(row.shape.prompt_tokens, row.shape.generated_tokens, /*stream=*/false);
    absl::StatusOr<ForwardedRequest> forwarded =
        ForwardRequest(CaptureEndpoint::kVllmChat, row.client_body, 0);
    if (!forwarded.ok()) fail("ForwardRequest", forwarded.status());
    if (forwarded.ok()) row.forwarded_body = forwarded->body;
    row.body_index = static_cast<int>(bodies.size());
    bodies.push_back(VllmChatBody(row.shape, absl::StrCat("chatcmpl-bench-", tokens)));
    row.engine_body_bytes = static_cast<int64_t>(bodies.back().size());
    return row;
  };
  // Sizes past 8k: fewer rounds, the same bytes in all.
  auto rounds_for = [&](int64_t tokens) {
    return tokens <= 8192 ? c.rounds
                          : std::max<int>(10, static_cast<int>(c.rounds * 8192 / tokens));
  };
  for (int64_t n : sizes) rows.push_back(make_row(n, c.experts, kCapturePool, rounds_for(n)));
  if (c.wide_tokens > 0) {
    rows.push_back(
        make_row(c.wide_tokens, c.wide_experts, kCaptureWidePool, rounds_for(c.wide_tokens)));
  }
  const SizeRow burst_row = make_row(c.concurrent_tokens, c.experts, kCapturePool, 0);
  if (!ok) return 1;

  absl::StatusOr<std::unique_ptr<FakeEngine>> started = FakeEngine::Start(bodies);
  if (!started.ok()) {
    fail("fake engine", started.status());
    return 1;
  }
  FakeEngine& engine = **started;
  const std::string model_file = dir + "/model.json";
  std::ofstream(model_file) << absl::StrCat("{\"name\": \"bench-moe\", \"numLayers\": ", c.layers,
                                            ", \"numExperts\": ", c.experts, ", \"topk\": ", c.topk,
                                            "}");
  const std::vector<std::string> daemon_args = {
      absl::StrCat("--max-memory=", c.max_memory),
      absl::StrCat("--capture-upstream=http://127.0.0.1:", engine.port()),
      "--capture-engine=vllm",
      absl::StrCat("--capture-pool=", kCapturePool),
      "--capture-model=" + model_file,
      // Each captured request's line (its own time) is logged at debug.
      "--log-level=debug",
  };

  // ---- Per request, one at a time; then streams, on the same child.
  StreamsResult streams;
  ProcStatus latency_daemon;
  {
    absl::StatusOr<std::unique_ptr<RollpackdChild>> daemon =
        RollpackdChild::Start(binary, dir, "rollpackd-requests", daemon_args);
    if (!daemon.ok()) {
      fail("rollpackd", daemon.status());
      keep = true;
      return 1;
    }
    RollpackClient client((*daemon)->grpc_address());
    v1::ModelSpec wide;
    wide.set_name("bench-moe-wide");
    wide.set_num_layers(c.layers);
    wide.set_num_experts(c.wide_experts);
    wide.set_topk(c.topk);
    if (absl::StatusOr<bool> r = client.RegisterModel(kCaptureWidePool, wide); !r.ok()) {
      fail("RegisterModel", r.status());
      return 1;
    }
    absl::StatusOr<std::unique_ptr<HttpConnection>> direct = HttpConnection::Connect(engine.port());
    absl::StatusOr<std::unique_ptr<HttpConnection>> proxy =
        HttpConnection::Connect((*daemon)->capture_port());
    if (!direct.ok() || !proxy.ok()) {
      fail("connect", direct.ok() ? proxy.status() : direct.status());
      return 1;
    }
    int steps = 0;
    for (SizeRow& row : rows) {
      if (absl::Status s = RunSize(row, **direct, **proxy, client, **daemon, &steps); !s.ok()) {
        fail(row.label, s);
        keep = true;
        std::fprintf(stderr, "rollpack bench capture: logs kept in %s\n", dir.c_str());
        return 1;
      }
    }
    latency_daemon = ReadProcStatus((*daemon)->pid());

    if (c.streams > 0) {
      streams =
          RunStreams(engine.port(), **daemon, c.streams, c.stream_events, c.stream_interval_us);
      for (const StreamSide* side : {&streams.direct, &streams.proxy}) {
        if (!side->problem.empty()) {
          fail(side == &streams.direct ? "stream straight to the engine"
                                       : "stream through the capture port",
               absl::InternalError(side->problem));
        }
      }
    }
    (*daemon)->Stop();
  }
  if (!ok) return 1;

  // ---- The same work in this process, step by step.
  for (SizeRow& row : rows) {
    if (c.breakdown_rounds == 0) break;
    if (absl::Status s = Breakdown(row, c.breakdown_rounds); !s.ok()) {
      fail(absl::StrCat("breakdown ", row.label), s);
      return 1;
    }
  }

  // ---- 2,000 in flight, on a fresh child.
  ConcurrentResult burst;
  if (c.concurrent > 0) {
    absl::StatusOr<std::unique_ptr<RollpackdChild>> daemon =
        RollpackdChild::Start(binary, dir, "rollpackd-burst", daemon_args);
    if (!daemon.ok()) {
      fail("rollpackd", daemon.status());
      keep = true;
      return 1;
    }
    if (absl::Status s =
            RunConcurrent(engine, **daemon, burst_row, c.concurrent, c.answer_spread_ms, &burst);
        !s.ok()) {
      fail(absl::StrCat(c.concurrent, " in flight"), s);
      keep = true;
    }
  }
  if (engine.refused() > 0) {
    fail("fake engine", absl::InternalError(absl::StrCat(engine.refused(), " requests refused")));
  }

  // ---- The tables.
  std::printf(
      "rollpack bench capture: rollpackd child (capture port: 2 event loops, 2 record threads, "
      "memory store), a stand-in vLLM in this process; %d MoE layers, top-%d; "
      "/v1/chat/completions, one choice, prompt = generated = tokens / 2; %d cores\n\n",
      c.layers, c.topk, static_cast<int>(std::thread::hardware_concurrency()));

  std::printf(
      "rollpackd's own time per captured request, one at a time (ms; log = its per-request "
      "overhead, hist = rollpack_capture_overhead_seconds)\n");
  std::printf("%-18s %5s %8s %8s %9s %9s %9s %10s %13s %8s\n", "choice", "n", "log p50", "log p99",
              "hist p50", "hist p99", "hist mean", "engine p50", "CPU usr+sys", "faults");
  for (const SizeRow& r : rows) {
    std::printf("%-18s %5zu %8.2f %8.2f %9.2f %9.2f %9.2f %10.2f %6.2f+%-6.2f %8.0f\n",
                r.label.c_str(), r.own_ms.size(), Percentile(r.own_ms, 0.5),
                Percentile(r.own_ms, 0.99), r.hist_p50_ms, r.hist_p99_ms, r.hist_mean_ms,
                Percentile(r.engine_ms, 0.5), r.cpu_user_ms, r.cpu_system_ms, r.faults);
  }
  std::printf(
      "(engine = rollpackd's wait for the engine's whole body; CPU and minor page faults: "
      "rollpackd, all threads, per request)\n");
  std::printf("rollpackd's busiest threads, CPU ms per request (user+system):\n");
  for (const SizeRow& r : rows) {
    std::vector<std::string> threads;
    for (size_t i = 0; i < r.busiest.size() && i < 4; ++i) {
      threads.push_back(absl::StrFormat("%.2f+%.2f", r.busiest[i].first, r.busiest[i].second));
    }
    std::printf("  %-18s %s\n", r.label.c_str(), absl::StrJoin(threads, "  ").c_str());
  }

  std::printf(
      "\nEnd to end, this client, the same request straight to the engine and through the "
      "capture port, alternated (ms)\n");
  std::printf("%-18s %11s %11s %11s %11s %10s %10s %12s\n", "choice", "direct p50", "direct p99",
              "proxy p50", "proxy p99", "added p50", "added p99", "paired p50");
  for (const SizeRow& r : rows) {
    const double dp50 = Percentile(r.direct_ms, 0.5), dp99 = Percentile(r.direct_ms, 0.99);
    const double pp50 = Percentile(r.proxy_ms, 0.5), pp99 = Percentile(r.proxy_ms, 0.99);
    std::printf("%-18s %11.2f %11.2f %11.2f %11.2f %10.2f %10.2f %12.2f\n", r.label.c_str(), dp50,
                dp99, pp50, pp99, pp50 - dp50, pp99 - dp99, Percentile(r.paired_ms, 0.5));
  }

  std::printf(
      "\nBytes: the engine's body, the client's, and what was removed per token "
      "(prompt + generated)\n");
  std::printf("%-18s %13s %14s %18s %18s\n", "choice", "engine MB", "client KB", "routing B/token",
              "removed B/token");
  for (const SizeRow& r : rows) {
    std::printf("%-18s %13s %14.1f %18.1f %18.1f\n", r.label.c_str(),
                Mb(r.engine_body_bytes).c_str(), static_cast<double>(r.client_body_bytes) / 1e3,
                r.stripped_per_token, r.removed_per_token);
  }

  if (c.breakdown_rounds > 0) {
    std::printf(
        "\nThe same work in this process, one thread, p50 ms (where rollpackd's own time "
        "goes)\n");
    std::printf("%-18s %8s %12s %13s %9s %7s %7s %7s %8s %9s\n", "choice", "request", "parse+strip",
                "decode+sample", "validate", "store", "sum", "faults", "log p50", "recv buf");
    for (const SizeRow& r : rows) {
      const double sum = r.prep_ms + r.parse_ms + r.sample_ms + r.validate_ms + r.put_ms;
      std::printf("%-18s %8.3f %12.3f %13.3f %9.3f %7.3f %7.3f %7.0f %8.2f %9.3f\n",
                  r.label.c_str(), r.prep_ms, r.parse_ms, r.sample_ms, r.validate_ms, r.put_ms, sum,
                  r.breakdown_faults, Percentile(r.own_ms, 0.5), r.receive_buffer_ms);
    }
    std::printf(
        "(log p50: rollpackd's own time, above; recv buf: a fresh receive buffer of the "
        "engine body's size, zero-filled, as the proxy makes one per answer: in its "
        "engine wait, not its own time)\n");
  }

  if (c.concurrent > 0) {
    std::printf(
        "\n%d requests in flight at once (%s tokens each, one connection each; the engine "
        "answers once all arrived, spread over %d ms)\n",
        c.concurrent, absl::StrCat(c.concurrent_tokens).c_str(), c.answer_spread_ms);
    std::printf("%-22s %10s %10s %9s %9s %9s %9s\n", "", "in flight", "answered", "stored", "p50 s",
                "p99 s", "wall s");
    for (const BurstSide* side : {&burst.direct, &burst.proxy}) {
      const BurstOutcome& o = side->outcome;
      std::printf("%-22s %10s %10d %9s %9.3f %9.3f %9.3f\n",
                  side == &burst.direct ? "straight to the engine" : "through the capture port",
                  absl::StrFormat("%.2fs", side->all_in_flight_s).c_str(), o.answered,
                  side == &burst.direct ? "-" : absl::StrCat(o.stored).c_str(),
                  Percentile(o.seconds, 0.5), Percentile(o.seconds, 0.99), side->wall_s);
    }
    std::printf(
        "rollpackd: threads %d idle, %d in flight, %d at most; open files %d idle, %d in "
        "flight\n",
        burst.idle.threads, burst.proxy.in_flight.threads, burst.proxy.peak_threads,
        burst.idle_files, burst.proxy.open_files);
    std::printf(
        "rollpackd: RSS %.1f MB idle, %.1f MB in flight (%.1f KB per request), %.1f MB "
        "peak (VmHWM %.1f MB), %.1f MB after; samples stored %.1f MB (GetPool: %lld)\n",
        burst.idle.rss_kb / 1e3, burst.proxy.in_flight.rss_kb / 1e3,
        static_cast<double>(burst.proxy.in_flight.rss_kb - burst.idle.rss_kb) /
            std::max(1, c.concurrent),
        burst.proxy.peak_rss_kb / 1e3, burst.after.hwm_kb / 1e3, burst.after.rss_kb / 1e3,
        static_cast<double>(burst.stored_bytes) / 1e6, static_cast<long long>(burst.pool_samples));
    std::printf(
        "rollpackd: peak - idle - stored = %.1f MB (engine answers read and not yet recorded, "
        "at most; %.2f MB each)\n",
        (burst.after.hwm_kb - burst.idle.rss_kb) / 1e3 -
            static_cast<double>(burst.stored_bytes) / 1e6,
        static_cast<double>(burst_row.engine_body_bytes) / 1e6);
    std::printf(
        "rollpackd's own time under that load (ms): log p50 %.2f, p99 %.2f; hist p50 "
        "%.2f, p99 %.2f\n",
        Percentile(burst.own_ms, 0.5), Percentile(burst.own_ms, 0.99), burst.hist_p50_ms,
        burst.hist_p99_ms);
  }

  const double sd50 = Percentile(streams.direct.event_ms, 0.5);
  const double sd99 = Percentile(streams.direct.event_ms, 0.99);
  const double sp50 = Percentile(streams.proxy.event_ms, 0.5);
  const double sp99 = Percentile(streams.proxy.event_ms, 0.99);
  if (c.streams > 0) {
    std::printf(
        "\nServer-sent events, %d streams at once (half straight, half through the port), "
        "%d events %d us apart: the engine's write to this client's read, per event (ms)\n",
        c.streams, c.stream_events, c.stream_interval_us);
    std::printf("%-24s %8s %9s %9s %9s\n", "", "events", "p50", "p99", "max");
    std::printf("%-24s %8zu %9.3f %9.3f %9.3f\n", "straight to the engine",
                streams.direct.event_ms.size(), sd50, sd99, Percentile(streams.direct.event_ms, 1));
    std::printf("%-24s %8zu %9.3f %9.3f %9.3f\n", "through the capture port",
                streams.proxy.event_ms.size(), sp50, sp99, Percentile(streams.proxy.event_ms, 1));
    std::printf("%-24s %8s %9.3f %9.3f\n", "added", "", sp50 - sd50, sp99 - sd99);
  }

  // Targets (spec section 8).
  const SizeRow* target = nullptr;
  for (const SizeRow& r : rows) {
    if (r.tokens() == 8192 && r.shape.experts <= 256) target = &r;
  }
  std::printf("\nTargets (capture.md section 8):\n");
  if (target != nullptr) {
    const double p50 = Percentile(target->own_ms, 0.5), p99 = Percentile(target->own_ms, 0.99);
    std::printf("  own time, 8k tokens: p50 %.2f ms <= 2 ms: %s; p99 %.2f ms <= 10 ms: %s\n", p50,
                p50 <= 2 ? "met" : "MISSED", p99, p99 <= 10 ? "met" : "MISSED");
  }
  if (c.concurrent > 0) {
    std::printf("  %d in flight: %s (answered %d, stored %d, GetPool %lld); threads %d at most\n",
                c.concurrent, ok ? "none lost" : "LOST SOME", burst.proxy.outcome.answered,
                burst.proxy.outcome.stored, static_cast<long long>(burst.pool_samples),
                burst.proxy.peak_threads);
  }
  if (c.streams > 0) {
    std::printf("  streaming, added per event: p50 %.3f ms, p99 %.3f ms <= 1 ms: %s\n", sp50 - sd50,
                sp99 - sd99, sp99 - sd99 <= 1 && sp50 - sd50 <= 1 ? "met" : "MISSED");
  }

  // ---- JSON.
  std::vector<std::string> json_rows;
  for (const SizeRow& r : rows) {
    json_rows.push_back(absl::StrFormat(
        "{\"choice\": \"%s\", \"tokens\": %d, \"experts\": %d, \"requests\": %d, "
        "\"own_p50_ms\": %.3f, \"own_p99_ms\": %.3f, \"hist_p50_ms\": %.3f, \"hist_p99_ms\": "
        "%.3f, \"hist_mean_ms\": %.3f, \"engine_p50_ms\": %.3f, \"direct_p50_ms\": %.3f, "
        "\"direct_p99_ms\": %.3f, \"proxy_p50_ms\": %.3f, \"proxy_p99_ms\": %.3f, "
        "\"paired_added_p50_ms\": %.3f, \"cpu_user_ms\": %.3f, \"cpu_system_ms\": %.3f, "
        "\"minor_faults\": %.0f, \"engine_body_bytes\": %d, \"client_body_bytes\": %d, "
        "\"routing_bytes_per_token\": %.2f, \"removed_bytes_per_token\": %.2f, "
        "\"breakdown_ms\": {\"request\": %.4f, \"parse_strip\": %.4f, \"decode_sample\": %.4f, "
        "\"validate\": %.4f, \"store\": %.4f, \"minor_faults\": %.0f, "
        "\"receive_buffer\": %.4f}}",
        r.label, r.tokens(), r.shape.experts, static_cast<int>(r.own_ms.size()),
        Percentile(r.own_ms, 0.5), Percentile(r.own_ms, 0.99), r.hist_p50_ms, r.hist_p99_ms,
        r.hist_mean_ms, Percentile(r.engine_ms, 0.5), Percentile(r.direct_ms, 0.5),
        Percentile(r.direct_ms, 0.99), Percentile(r.proxy_ms, 0.5), Percentile(r.proxy_ms, 0.99),
        Percentile(r.paired_ms, 0.5), r.cpu_user_ms, r.cpu_system_ms, r.faults, r.engine_body_bytes,
        r.client_body_bytes, r.stripped_per_token, r.removed_per_token, r.prep_ms, r.parse_ms,
        r.sample_ms, r.validate_ms, r.put_ms, r.breakdown_faults, r.receive_buffer_ms));
  }
  std::string json = absl::StrCat("{\"layers\": ", c.layers, ", \"topk\": ", c.topk,
                                  ", \"requests\": ", JsonList(json_rows));
  if (c.concurrent > 0) {
    auto side = [](const BurstSide& s) {
      return absl::StrFormat(
          "{\"sent\": %d, \"answered\": %d, \"status_ok\": %d, \"stored\": %d, "
          "\"all_in_flight_s\": %.3f, \"p50_s\": %.4f, \"p99_s\": %.4f, \"wall_s\": %.3f}",
          s.outcome.sent, s.outcome.answered, s.outcome.status_ok, s.outcome.stored,
          s.all_in_flight_s, Percentile(s.outcome.seconds, 0.5),
          Percentile(s.outcome.seconds, 0.99), s.wall_s);
    };
    absl::StrAppend(
        &json,
        absl::StrFormat(
            ", \"concurrent\": {\"requests\": %d, \"tokens\": %d, \"direct\": %s, \"proxy\": %s, "
            "\"threads_idle\": %d, \"threads_in_flight\": %d, \"threads_peak\": %d, "
            "\"open_files_in_flight\": %d, \"rss_idle_mb\": %.1f, \"rss_in_flight_mb\": %.1f, "
            "\"rss_peak_mb\": %.1f, \"vm_hwm_mb\": %.1f, \"stored_mb\": %.1f, "
            "\"pool_samples\": %d, \"own_p50_ms\": %.3f, \"own_p99_ms\": %.3f}",
            c.concurrent, c.concurrent_tokens, side(burst.direct), side(burst.proxy),
            burst.idle.threads, burst.proxy.in_flight.threads, burst.proxy.peak_threads,
            burst.proxy.open_files, burst.idle.rss_kb / 1e3, burst.proxy.in_flight.rss_kb / 1e3,
            burst.proxy.peak_rss_kb / 1e3, burst.after.hwm_kb / 1e3,
            static_cast<double>(burst.stored_bytes) / 1e6, burst.pool_samples,
            Percentile(burst.own_ms, 0.5), Percentile(burst.own_ms, 0.99)));
  }
  if (c.streams > 0) {
    absl::StrAppend(
        &json,
        absl::StrFormat(", \"streams\": {\"streams\": %d, \"events\": %d, \"interval_us\": %d, "
                        "\"direct_p50_ms\": %.4f, \"direct_p99_ms\": %.4f, \"proxy_p50_ms\": %.4f, "
                        "\"proxy_p99_ms\": %.4f, \"passthrough_counted\": %.0f}",
                        c.streams, c.stream_events, c.stream_interval_us, sd50, sd99, sp50, sp99,
                        streams.passthrough_counted));
  }
  absl::StrAppend(&json, ", \"latency_child_rss_mb\": ", latency_daemon.rss_kb / 1e3,
                  ", \"ok\": ", ok ? "true" : "false", "}");
  std::printf("\nJSON:\n%s\n", json.c_str());
  if (keep) std::printf("logs: %s\n", dir.c_str());
  return ok ? 0 : 1;
}

}  // namespace rollpack
