#include "cli/bench/capture_phases.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/bench/support.h"
#include "server/capture/captured_sample.h"
#include "server/capture/engine_exchange.h"
#include "server/ingest/sample_validation.h"
#include "server/store/sample_store.h"

namespace rollpack {
namespace {

// simdjson's padding (SIMDJSON_PADDING): the capture port reads engine
// bodies into buffers this much longer, and so does the breakdown here.
constexpr size_t kPadding = 64;

// Releases the samples stored so far (a step over them, released) after
// checking that the pool holds exactly them.
absl::Status ReleaseStored(RollpackClient& client, const std::string& pool,
                           std::vector<std::string>& ids, int64_t max_tokens, int* steps) {
  if (ids.empty()) return absl::OkStatus();
  absl::StatusOr<v1::PoolInfo> info = client.GetPool(pool);
  if (!info.ok()) return info.status();
  if (info->num_samples() != static_cast<int64_t>(ids.size())) {
    return absl::DataLossError(absl::StrCat("pool ", pool, " holds ", info->num_samples(),
                                            " samples, ", ids.size(), " were stored"));
  }
  v1::CreateStepRequest create;
  create.set_step_id(absl::StrCat("release-", ++*steps));
  create.set_pool(pool);
  for (const std::string& id : ids) create.add_sample_ids(id);
  create.mutable_topology()->set_dp(1);
  create.mutable_topology()->set_max_tokens_per_rank(max_tokens);
  absl::StatusOr<v1::StepInfo> step = client.CreateStep(create);
  if (!step.ok()) return step.status();
  absl::StatusOr<v1::ReleaseStepResponse> released = client.ReleaseStep(create.step_id());
  if (!released.ok()) return released.status();
  ids.clear();
  return absl::OkStatus();
}

void RunStream(int port, const std::string& request, int events, std::atomic<bool>* go,
               StreamSide* side, std::mutex* mu) {
  std::vector<double> latencies;
  std::string problem;
  absl::StatusOr<std::unique_ptr<HttpConnection>> c = HttpConnection::Connect(port);
  while (!go->load()) std::this_thread::yield();
  bool done = false;
  int seen = 0;
  if (!c.ok()) {
    problem = c.status().ToString();
  } else {
    std::string text;
    size_t scanned = 0;
    absl::StatusOr<HttpAnswer> a =
        (*c)->Exchange(request, [&](absl::string_view data, int64_t arrived) {
          text.append(data.data(), data.size());
          size_t end;
          while ((end = text.find("\n\n", scanned)) != std::string::npos) {
            const absl::string_view event(text.data() + scanned, end - scanned);
            const size_t k = event.find("\"bench_sent_ns\":");
            if (k != absl::string_view::npos) {
              int64_t sent = 0;
              for (size_t i = k + 16; i < event.size() && event[i] >= '0' && event[i] <= '9'; ++i) {
                sent = sent * 10 + (event[i] - '0');
              }
              latencies.push_back(static_cast<double>(arrived - sent) * 1e-6);
              ++seen;
            } else if (event == "data: [DONE]") {
              done = true;
            }
            scanned = end + 2;
          }
        });
    if (!a.ok()) {
      problem = a.status().ToString();
    } else if (a->status != 200 || seen != events || !done) {
      problem = absl::StrCat("status ", a->status, ", ", seen, " of ", events, " events",
                             done ? "" : ", no [DONE]");
    } else if (!a->Header("x-rollpack-capture").empty()) {
      problem = "a passed-through stream has X-Rollpack-Capture";
    }
  }
  std::lock_guard<std::mutex> lock(*mu);
  side->event_ms.insert(side->event_ms.end(), latencies.begin(), latencies.end());
  if (problem.empty()) {
    ++side->streams_ok;
  } else if (side->problem.empty()) {
    side->problem = problem;
  }
}

BurstSide RunBurstSide(FakeEngine& engine, const std::string& name, int port,
                       const std::vector<std::string>& requests, int spread_ms, pid_t daemon) {
  BurstSide side;
  const int64_t start = SteadyNanos();
  engine.ArmBurst(name, static_cast<int>(requests.size()), absl::Milliseconds(spread_ms),
                  absl::Seconds(60), [&](int arrived) {
                    side.arrived = arrived;
                    side.all_in_flight_s = static_cast<double>(SteadyNanos() - start) * 1e-9;
                    if (daemon > 0) {
                      side.in_flight = ReadProcStatus(daemon);
                      side.open_files = CountOpenFiles(daemon);
                    }
                  });
  std::atomic<bool> sampling{daemon > 0};
  std::thread sampler([&] {
    while (sampling.load()) {
      const ProcStatus s = ReadProcStatus(daemon);
      side.peak_rss_kb = std::max(side.peak_rss_kb, s.rss_kb);
      side.peak_threads = std::max(side.peak_threads, s.threads);
      absl::SleepFor(absl::Milliseconds(10));
    }
  });
  side.outcome = RunBurst(port, requests, absl::Seconds(120));
  side.wall_s = static_cast<double>(SteadyNanos() - start) * 1e-9;
  sampling.store(false);
  sampler.join();
  return side;
}

// rollpackd's counters, the process and each thread.
struct CpuSnapshot {
  ProcCounters process;
  std::map<int, ProcCounters> threads;
};

CpuSnapshot Snap(pid_t pid) { return {ReadProcCounters(pid), ReadThreadCounters(pid)}; }

void Add(ProcCounters& sum, const ProcCounters& from, const ProcCounters& to) {
  sum.user_s += to.user_s - from.user_s;
  sum.system_s += to.system_s - from.system_s;
  sum.minor_faults += to.minor_faults - from.minor_faults;
}

// `sum` += `to` - `from`.
void Add(CpuSnapshot& sum, const CpuSnapshot& from, const CpuSnapshot& to) {
  Add(sum.process, from.process, to.process);
  for (const auto& [tid, after] : to.threads) {
    auto it = from.threads.find(tid);
    Add(sum.threads[tid], it == from.threads.end() ? ProcCounters() : it->second, after);
  }
}

}  // namespace

std::string SizeLabel(int64_t tokens, int experts) {
  const std::string n =
      tokens % 1024 == 0 ? absl::StrCat(tokens / 1024, "k") : absl::StrCat(tokens);
  return absl::StrCat(n, experts > 256 ? " int16 E=" : " uint8 E=", experts);
}

absl::Status RunSize(SizeRow& row, HttpConnection& direct, HttpConnection& proxy,
                     RollpackClient& client, const RollpackdChild& daemon, int* steps) {
  const int warmup = 5;
  const std::string index = absl::StrCat(row.body_index);
  const std::string direct_request =
      HttpRequestBytes("POST", kCaptureChatPath, {{"X-Bench-Body", index}}, row.forwarded_body);
  std::vector<std::string> pending, ids;
  const int64_t release_tokens = int64_t{256} << 10;
  absl::StatusOr<MetricsScrape> before;
  // rollpackd's CPU and faults over the timed requests, its releases left out.
  CpuSnapshot timed, segment;
  for (int r = 0; r < warmup + row.rounds; ++r) {
    if (r == warmup) {
      before = Scrape(daemon.metrics_port());
      if (!before.ok()) return before.status();
      segment = Snap(daemon.pid());
    }
    const std::string id = absl::StrCat("lat-", row.label, "-", r);
    HttpHeaders headers = {{"X-Bench-Body", index}, {"X-Rollpack-Sample-Id", id}};
    if (row.pool != kCapturePool) headers.emplace_back("X-Rollpack-Pool", row.pool);
    const std::string proxy_request =
        HttpRequestBytes("POST", kCaptureChatPath, headers, row.client_body);
    double d = 0, p = 0;
    // Alternated: drift hits both alike.
    for (int leg = 0; leg < 2; ++leg) {
      if ((leg == 0) == (r % 2 == 0)) {
        absl::StatusOr<HttpAnswer> a = direct.Exchange(direct_request);
        if (!a.ok()) return a.status();
        if (a->status != 200 || a->body_bytes != row.engine_body_bytes) {
          return absl::InternalError(absl::StrCat("straight to the engine: status ", a->status,
                                                  ", ", a->body_bytes,
                                                  " bytes: ", direct.body().substr(0, 200)));
        }
        d = a->seconds * 1e3;
      } else {
        absl::StatusOr<HttpAnswer> a = proxy.Exchange(proxy_request);
        if (!a.ok()) return a.status();
        const std::string capture = a->Header("x-rollpack-capture");
        if (a->status != 200 || capture != "stored" || a->Header("x-rollpack-sample-ids") != id) {
          return absl::InternalError(
              absl::StrCat("through the capture port: status ", a->status,
                           ", X-Rollpack-Capture: \"", capture, "\", X-Rollpack-Sample-Ids: \"",
                           a->Header("x-rollpack-sample-ids"), "\" (want ", id, ")"));
        }
        if (absl::StrContains(proxy.body(), "routed_experts")) {
          return absl::InternalError("the client's body still holds routed_experts");
        }
        row.client_body_bytes = a->body_bytes;
        p = a->seconds * 1e3;
      }
    }
    pending.push_back(id);
    if (r >= warmup) {
      row.direct_ms.push_back(d);
      row.proxy_ms.push_back(p);
      row.paired_ms.push_back(p - d);
      ids.push_back(id);
    }
    if (static_cast<int64_t>(pending.size()) * row.tokens() >= release_tokens ||
        r + 1 == warmup + row.rounds) {
      if (r >= warmup) Add(timed, segment, Snap(daemon.pid()));
      if (r + 1 == warmup + row.rounds) {
        row.cpu_user_ms = timed.process.user_s * 1e3 / row.rounds;
        row.cpu_system_ms = timed.process.system_s * 1e3 / row.rounds;
        row.faults = static_cast<double>(timed.process.minor_faults) / row.rounds;
        for (const auto& [tid, t] : timed.threads) {
          const double user = t.user_s * 1e3 / row.rounds;
          const double system = t.system_s * 1e3 / row.rounds;
          if (user + system > 0) row.busiest.emplace_back(user, system);
        }
        std::sort(row.busiest.begin(), row.busiest.end(), [](const auto& a, const auto& b) {
          return a.first + a.second > b.first + b.second;
        });
        absl::StatusOr<MetricsScrape> after = Scrape(daemon.metrics_port());
        if (!after.ok()) return after.status();
        row.hist_p50_ms = HistogramQuantile(before->overhead, after->overhead, 0.5) * 1e3;
        row.hist_p99_ms = HistogramQuantile(before->overhead, after->overhead, 0.99) * 1e3;
        const double n = after->overhead.count - before->overhead.count;
        row.hist_mean_ms = n > 0 ? (after->overhead.sum - before->overhead.sum) / n * 1e3 : 0;
        const double tokens = static_cast<double>(row.rounds) * static_cast<double>(row.tokens());
        row.stripped_per_token = (after->stripped_bytes - before->stripped_bytes) / tokens;
        if (after->samples - before->samples != row.rounds) {
          return absl::DataLossError(absl::StrCat("rollpack_capture_samples_total grew by ",
                                                  after->samples - before->samples, ", not ",
                                                  row.rounds));
        }
      }
      if (absl::Status s = ReleaseStored(client, row.pool, pending, row.tokens(), steps); !s.ok()) {
        return s;
      }
      segment = Snap(daemon.pid());
    }
  }
  row.removed_per_token = static_cast<double>(row.engine_body_bytes - row.client_body_bytes) /
                          static_cast<double>(row.tokens());
  // rollpackd's own time per request, from its log.
  absl::SleepFor(absl::Milliseconds(50));
  const auto log = ReadCaptureLog(daemon.log());
  for (const std::string& id : ids) {
    auto it = log.find(id);
    if (it == log.end()) continue;
    row.engine_ms.push_back(it->second.first);
    row.own_ms.push_back(it->second.second);
  }
  if (row.own_ms.size() != ids.size()) {
    return absl::DataLossError(absl::StrCat("rollpackd logged ", row.own_ms.size(), " of ",
                                            ids.size(), " captured requests (", daemon.log(), ")"));
  }
  return absl::OkStatus();
}

absl::Status Breakdown(SizeRow& row, int rounds) {
  SampleStore store(int64_t{1} << 40);
  ModelSpec model;
  model.name = "bench";
  model.num_layers = row.shape.layers;
  model.num_experts = row.shape.experts;
  model.topk = row.shape.topk;
  if (absl::Status s = store.RegisterModel("pool", model).status(); !s.ok()) return s;
  absl::StatusOr<PoolOptions> options = store.GetOptions("pool");
  if (!options.ok()) return options.status();
  const std::string body = VllmChatBody(row.shape, "chatcmpl-breakdown");
  std::string padded = body;
  padded.append(kPadding, '\0');
  const absl::string_view view(padded.data(), body.size());
  Topology topology;
  topology.max_tokens_per_rank = row.tokens();
  std::vector<double> prep, parse, sample, validate, put, faults, receive;
  std::string receive_buffer;
  // Samples are kept, then released in batches, as RunSize has rollpackd
  // keep them: storing a sample takes memory never touched before.
  // Warm-up: one batch stored and released, so that the timed requests
  // reuse freed memory as rollpackd's do in a steady state.
  const int64_t batch_tokens = int64_t{256} << 10;
  const int warm = static_cast<int>(std::max<int64_t>(2, batch_tokens / row.tokens()));
  std::vector<std::string> kept;
  int steps = 0;
  for (int r = 0; r < warm + rounds; ++r) {
    receive_buffer.clear();
    receive_buffer.shrink_to_fit();
    const absl::Time r0 = absl::Now();
    receive_buffer.resize(body.size() + kPadding);
    const double receive_ms = absl::ToDoubleMilliseconds(absl::Now() - r0);
    const int64_t faults_before = ThreadMinorFaults();
    const absl::Time t0 = absl::Now();
    absl::StatusOr<ForwardedRequest> forwarded =
        ForwardRequest(CaptureEndpoint::kVllmChat, row.client_body, 0);
    if (!forwarded.ok()) return forwarded.status();
    const absl::Time t1 = absl::Now();
    absl::StatusOr<EngineResponse> response =
        ParseEngineResponse(CaptureEndpoint::kVllmChat, *forwarded, view, false);
    if (!response.ok()) return response.status();
    if (response->choices.size() != 1) return absl::InternalError("want one choice");
    const absl::Time t2 = absl::Now();
    CapturedIdentity identity;
    identity.sample_id = absl::StrCat("b", r);
    absl::StatusOr<v1::Sample> s = CapturedSample(Engine::kVllm, response->choices[0], model,
                                                  forwarded->start_offset, identity);
    if (!s.ok()) return s.status();
    const absl::Time t3 = absl::Now();
    int64_t budget = static_cast<int64_t>(s->ByteSizeLong());
    absl::StatusOr<StoredSample> stored =
        ValidateAndTakeSample(&*s, model, options->token_fields, &budget);
    if (!stored.ok()) return stored.status();
    const absl::Time t4 = absl::Now();
    std::vector<StoredSample> batch;
    batch.push_back(*std::move(stored));
    if (absl::Status p = store.Put("pool", std::move(batch)).status(); !p.ok()) return p;
    const absl::Time t5 = absl::Now();
    // The response and the decode buffers go, as in rollpackd.
    response = absl::InternalError("done");
    s = absl::InternalError("done");
    const int64_t faults_after = ThreadMinorFaults();
    if (r >= warm) {
      prep.push_back(absl::ToDoubleMilliseconds(t1 - t0));
      parse.push_back(absl::ToDoubleMilliseconds(t2 - t1));
      sample.push_back(absl::ToDoubleMilliseconds(t3 - t2));
      validate.push_back(absl::ToDoubleMilliseconds(t4 - t3));
      put.push_back(absl::ToDoubleMilliseconds(t5 - t4));
      faults.push_back(static_cast<double>(faults_after - faults_before));
      receive.push_back(receive_ms);
    }
    kept.push_back(identity.sample_id);
    if (static_cast<int64_t>(kept.size()) * row.tokens() >= batch_tokens || r + 1 == warm ||
        r + 1 == warm + rounds) {
      const std::string step = absl::StrCat("s", ++steps);
      absl::StatusOr<std::shared_ptr<const Step>> created =
          store.CreateStep(step, "pool", kept, 0, topology);
      if (!created.ok()) return created.status();
      created->reset();
      if (absl::Status s2 = store.ReleaseStep(step).status(); !s2.ok()) return s2;
      kept.clear();
    }
  }
  row.breakdown_faults = Median(faults);
  row.receive_buffer_ms = Median(receive);
  row.prep_ms = Median(prep);
  row.parse_ms = Median(parse);
  row.sample_ms = Median(sample);
  row.validate_ms = Median(validate);
  row.put_ms = Median(put);
  return absl::OkStatus();
}

StreamsResult RunStreams(int engine_port, const RollpackdChild& daemon, int streams, int events,
                         int interval_us) {
  StreamsResult out;
  absl::StatusOr<MetricsScrape> before = Scrape(daemon.metrics_port());
  const std::string request = HttpRequestBytes(
      "POST", kCaptureChatPath, {{"X-Bench-Stream", absl::StrCat(events, ",", interval_us)}},
      ChatRequestBody(64, events, /*stream=*/true));
  std::atomic<bool> go{false};
  std::mutex mu;
  std::vector<std::thread> threads;
  for (int i = 0; i < streams; ++i) {
    const bool through = i % 2 == 1;
    threads.emplace_back(RunStream, through ? daemon.capture_port() : engine_port,
                         std::cref(request), events, &go, through ? &out.proxy : &out.direct, &mu);
  }
  absl::SleepFor(absl::Milliseconds(50));
  go.store(true);
  for (std::thread& t : threads) t.join();
  absl::StatusOr<MetricsScrape> after = Scrape(daemon.metrics_port());
  if (before.ok() && after.ok()) out.passthrough_counted = after->passthrough - before->passthrough;
  return out;
}

absl::Status RunConcurrent(FakeEngine& engine, const RollpackdChild& daemon, const SizeRow& row,
                           int requests, int spread_ms, ConcurrentResult* out) {
  RollpackClient client(daemon.grpc_address());
  std::vector<std::string> direct_requests, proxy_requests;
  const std::string index = absl::StrCat(row.body_index);
  for (int i = 0; i < requests; ++i) {
    direct_requests.push_back(HttpRequestBytes(
        "POST", kCaptureChatPath, {{"X-Bench-Body", index}, {"X-Bench-Burst", "direct"}},
        row.forwarded_body));
    proxy_requests.push_back(HttpRequestBytes("POST", kCaptureChatPath,
                                              {{"X-Bench-Body", index},
                                               {"X-Bench-Burst", "proxy"},
                                               {"X-Rollpack-Sample-Id", absl::StrCat("burst-", i)}},
                                              row.client_body));
  }
  // One request first, so the idle figures are those of a port in use.
  {
    absl::StatusOr<std::unique_ptr<HttpConnection>> warm =
        HttpConnection::Connect(daemon.capture_port());
    if (warm.ok()) {
      (void)(*warm)->Exchange(HttpRequestBytes(
          "POST", kCaptureChatPath,
          {{"X-Bench-Body", index}, {"X-Rollpack-Sample-Id", "burst-warm"}}, row.client_body));
    }
  }
  absl::SleepFor(absl::Milliseconds(100));
  out->idle = ReadProcStatus(daemon.pid());
  out->idle_files = CountOpenFiles(daemon.pid());
  absl::StatusOr<MetricsScrape> before = Scrape(daemon.metrics_port());
  out->direct = RunBurstSide(engine, "direct", engine.port(), direct_requests, spread_ms, -1);
  out->proxy =
      RunBurstSide(engine, "proxy", daemon.capture_port(), proxy_requests, spread_ms, daemon.pid());
  absl::StatusOr<MetricsScrape> after = Scrape(daemon.metrics_port());
  if (before.ok() && after.ok()) {
    out->hist_p50_ms = HistogramQuantile(before->overhead, after->overhead, 0.5) * 1e3;
    out->hist_p99_ms = HistogramQuantile(before->overhead, after->overhead, 0.99) * 1e3;
  }
  out->after = ReadProcStatus(daemon.pid());
  absl::StatusOr<v1::PoolInfo> pool = client.GetPool(kCapturePool);
  if (!pool.ok()) return pool.status();
  out->pool_samples = pool->num_samples() - 1;  // the warm-up request's
  out->stored_bytes = pool->stored_bytes();
  absl::SleepFor(absl::Milliseconds(50));
  const auto log = ReadCaptureLog(daemon.log());
  for (int i = 0; i < requests; ++i) {
    auto it = log.find(absl::StrCat("burst-", i));
    if (it != log.end()) out->own_ms.push_back(it->second.second);
  }
  for (const BurstSide* side : {&out->direct, &out->proxy}) {
    const bool proxied = side == &out->proxy;
    const BurstOutcome& o = side->outcome;
    if (o.answered != o.sent || o.status_ok != o.sent || (proxied && o.stored != o.sent)) {
      return absl::DataLossError(
          absl::StrCat(proxied ? "through the capture port: " : "straight to the engine: ", o.sent,
                       " sent, ", o.answered, " answered, ", o.status_ok, " status 200",
                       proxied ? absl::StrCat(", ", o.stored, " stored") : std::string(),
                       o.first_problem.empty() ? "" : "; first: ", o.first_problem));
    }
  }
  if (out->pool_samples != requests) {
    return absl::DataLossError(
        absl::StrCat("GetPool: ", out->pool_samples, " samples stored of ", requests));
  }
  return absl::OkStatus();
}

}  // namespace rollpack
