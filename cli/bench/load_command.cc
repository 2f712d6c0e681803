#include "cli/bench/load_command.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cli/bench/support.h"
#include "cli/flags.h"
#include "client/cpp/client.h"
#include "testing/synthetic_rollouts.h"
#include "client/cpp/trainer_stream.h"
#include "server/store/durable_log.h"
#include "server/store/crc32c.h"

namespace rollpack {
namespace {

struct LoadConfig {
  std::string server;
  std::string rollpackd;
  int producers = 4;
  int trainers = 4;  // dp
  int tp = 2;        // replicas: every tp rank receives every token of its dp rank
  double seconds = 30;
  int64_t max_memory = 256 << 20;
  int64_t rss_overhead = 256 << 20;
  int batch = 8;
  int step_samples = 64;
  double median_length = 1000;
  int64_t max_length = 4096;
  std::string data_dir;
  std::string fsync = "always";
};

// Latency samples in milliseconds.
class Latencies {
 public:
  void Add(double ms) {
    absl::MutexLock lock(&mu_);
    values_.push_back(ms);
  }
  double Percentile(double p) {
    absl::MutexLock lock(&mu_);
    if (values_.empty()) return 0;
    std::vector<double> v = values_;
    const size_t k = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
    std::nth_element(v.begin(), v.begin() + k, v.end());
    return v[k];
  }
  size_t count() {
    absl::MutexLock lock(&mu_);
    return values_.size();
  }

 private:
  absl::Mutex mu_;
  std::vector<double> values_;
};

constexpr absl::Duration kProgressInterval = absl::Seconds(5);

double Ms(absl::Time since) { return absl::ToDoubleMilliseconds(absl::Now() - since); }

int64_t ReadHwmBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      int64_t kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  }
  return -1;
}

uint32_t TokenChecksum(const char* data, size_t bytes) {
  return Crc32c(absl::string_view(data, bytes));
}

}  // namespace

int RunBenchLoadCommand(int argc, char** argv) {
  LoadConfig config;
  FlagSet flags("rollpack bench load",
                "P producers and a controller with R x T trainer streams drive a rollpackd child "
                "process (or --server) for D seconds. Prints throughput, p50/p99 latencies, the "
                "server's peak RSS against --max-memory, and a count check: every acknowledged "
                "sample fetched exactly once per replica (tp rank) with equal token checksums. "
                "Exits 0 only when the counts, checksums and the memory bound hold.");
  flags.Double("seconds", &config.seconds, "How long the producers run (D).").Min(0);
  flags.Int("producers", &config.producers, "Producer threads (P).").Min(1);
  flags.Int("trainers", &config.trainers, "Trainer streams per replica, the step's dp (R).")
      .Min(1);
  flags.Int("tp", &config.tp,
            "Replicas (T): every tp rank receives every token of its dp rank.")
      .Min(1);
  flags.Int64("max-memory", &config.max_memory, "The rollpackd child's --max-memory, bytes.")
      .Min(0);
  flags.Int64("rss-overhead", &config.rss_overhead,
              "Peak RSS allowed above --max-memory before the run fails, bytes.")
      .Min(0);
  flags.Int("batch", &config.batch, "Samples per PutSamples call.").Min(1);
  flags.Int("step-samples", &config.step_samples,
            "Samples per step; at least --trainers.")
      .Min(1);
  flags.Double("median-length", &config.median_length, "Median rollout length, tokens.");
  flags.Int64("max-length", &config.max_length, "Longest rollout, tokens.").Min(1);
  flags.String("data-dir", &config.data_dir,
               "Durable store directory for the rollpackd child; empty: memory only.");
  flags.String("fsync", &config.fsync,
               "The child's --fsync (always, batch or never), with --data-dir.");
  flags.String("server", &config.server,
               "HOST:PORT of a running rollpackd instead of a child process.");
  flags.String("rollpackd", &config.rollpackd,
               "rollpackd binary to start; empty: the one next to this program.");
  if (ParseResult r = flags.Parse(argc, argv); r.should_exit()) return r.exit_code();
  if (config.step_samples < config.trainers) {
    return flags.UsageError(absl::StrCat("--step-samples ", config.step_samples,
                                         " must be at least --trainers ", config.trainers));
  }

  // ---- The server: a rollpackd child unless --server.
  pid_t child = -1;
  std::string address = config.server;
  char tmpl[] = "/tmp/rollpack_bench_load_XXXXXX";
  const std::string tmp = mkdtemp(tmpl);
  if (address.empty()) {
    const std::string binary = config.rollpackd.empty() ? SelfDir() + "/rollpackd" : config.rollpackd;
    const std::string port_file = tmp + "/port";
    std::vector<std::string> args = {binary, "--listen=127.0.0.1:0", "--port-file=" + port_file,
                                     absl::StrCat("--max-memory=", config.max_memory)};
    if (!config.data_dir.empty()) {
      args.push_back("--data-dir=" + config.data_dir);
      args.push_back("--fsync=" + config.fsync);
    }
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    child = fork();
    if (child == 0) {
      execv(binary.c_str(), cargs.data());
      _exit(127);
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    int port = 0;
    while (port == 0 && absl::Now() < deadline) {
      std::ifstream(port_file) >> port;
      int status;
      if (port == 0 && waitpid(child, &status, WNOHANG) == child) {
        std::fprintf(stderr, "bench load: %s exited before serving\n", binary.c_str());
        return 1;
      }
      if (port == 0) absl::SleepFor(absl::Milliseconds(10));
    }
    if (port == 0) {
      kill(child, SIGKILL);
      waitpid(child, nullptr, 0);
      std::fprintf(stderr, "bench load: rollpackd did not start\n");
      return 1;
    }
    address = absl::StrCat("127.0.0.1:", port);
  }
  auto stop_child = [&] {
    if (child > 0) {
      kill(child, SIGTERM);
      waitpid(child, nullptr, 0);
      child = -1;
    }
    std::string cmd = "rm -rf " + tmp;
    (void)std::system(cmd.c_str());
  };

  v1::ModelSpec model;
  model.set_name("bench-moe");
  model.set_num_layers(16);
  model.set_num_experts(128);
  model.set_topk(8);
  ClientOptions client_options;
  client_options.deadline = absl::Seconds(120);
  RollpackClient control(MakeChannel(address, client_options), client_options);
  const std::string pool = "bench";
  if (absl::StatusOr<bool> r = control.RegisterModel(pool, model); !r.ok()) {
    std::fprintf(stderr, "bench load: RegisterModel: %s\n", r.status().ToString().c_str());
    stop_child();
    return 1;
  }

  // ---- Ledger: acknowledged samples and their token checksums; fetch counts per replica.
  absl::Mutex mu;
  absl::flat_hash_map<std::string, uint32_t> acked;
  absl::flat_hash_map<std::string, std::vector<int>> fetched;
  // Puts given up at the end while RESOURCE_EXHAUSTED: never acknowledged,
  // but an earlier message of their stream may have been committed.
  absl::flat_hash_map<std::string, bool> abandoned;  // id -> count per tp replica
  // Fetched before its producer recorded the acknowledgement (the server
  // commits, a step takes the sample and a trainer reads it, all before the
  // producer's thread takes `mu`): settled against `acked` at the end.
  struct EarlyFetch {
    std::string id;
    int replica;
    uint32_t checksum;
    bool in_bounds;
  };
  std::vector<EarlyFetch> early;
  int64_t checksum_mismatches = 0, unknown_fetched = 0;
  std::atomic<int64_t> sent_bytes{0}, exhausted{0}, put_errors{0};
  Latencies put_ms, create_ms, mb_ms, release_ms;

  std::atomic<bool> producing{true};
  const absl::Time start = absl::Now();
  std::vector<std::thread> producers;
  for (int p = 0; p < config.producers; ++p) {
    producers.emplace_back([&, p] {
      RollpackClient client(MakeChannel(address, client_options), client_options);
      SyntheticOptions options;
      options.num_samples = 64;
      options.median_length = config.median_length;
      options.max_length = config.max_length;
      options.seed = 77 + p;
      const std::vector<v1::Sample> templates = MakeSyntheticRollouts(model, options);
      int64_t seq = 0;
      while (producing) {
        std::vector<v1::Sample> batch;
        std::vector<uint32_t> sums;
        int64_t bytes = 0;
        for (int i = 0; i < config.batch; ++i) {
          v1::Sample s = templates[(seq + i) % templates.size()];
          s.set_sample_id(absl::StrCat("p", p, "-", seq + i));
          // Vary the first token so equal templates give different checksums.
          std::memcpy(s.mutable_tokens()->mutable_data()->data(), &seq, 4);
          sums.push_back(TokenChecksum(s.tokens().data().data(), s.tokens().data().size()));
          bytes += static_cast<int64_t>(s.ByteSizeLong());
          batch.push_back(std::move(s));
        }
        seq += config.batch;
        // Retry on RESOURCE_EXHAUSTED until the trainers free memory: the
        // same ids, so a partly committed stream comes back as duplicates.
        while (true) {
          const absl::Time t0 = absl::Now();
          absl::StatusOr<v1::PutSamplesResponse> put = client.PutSamples(pool, batch);
          if (put.ok()) {
            put_ms.Add(Ms(t0));
            sent_bytes += bytes;
            absl::MutexLock lock(&mu);
            for (size_t i = 0; i < batch.size(); ++i) acked[batch[i].sample_id()] = sums[i];
            break;
          }
          if (put.status().code() == absl::StatusCode::kResourceExhausted) {
            exhausted++;
            absl::SleepFor(absl::Milliseconds(20));
            if (!producing) {  // not acknowledged: not counted
              absl::MutexLock lock(&mu);
              for (const v1::Sample& s : batch) abandoned[s.sample_id()] = true;
              break;
            }
            continue;
          }
          put_errors++;
          std::fprintf(stderr, "bench load: put: %s\n", put.status().ToString().c_str());
          return;
        }
      }
    });
  }

  // ---- Controller: steps of S samples, R x T trainer streams each, then release.
  int steps = 0;
  int64_t microbatches = 0, fetched_bytes = 0;
  int fetch_errors = 0;
  auto run_step = [&](int num_samples, int dp) -> bool {
    v1::CreateStepRequest create;
    create.set_step_id(absl::StrCat("step-", steps));
    create.set_pool(pool);
    create.set_num_samples(num_samples);
    v1::Topology* t = create.mutable_topology();
    t->set_dp(dp);
    t->set_tp(config.tp);
    t->set_max_tokens_per_rank(std::max<int64_t>(config.max_length, 4096));
    const absl::Time t0 = absl::Now();
    absl::StatusOr<v1::StepInfo> step = control.CreateStep(create);
    if (!step.ok()) {
      std::fprintf(stderr, "bench load: CreateStep: %s\n", step.status().ToString().c_str());
      return false;
    }
    create_ms.Add(Ms(t0));
    std::vector<std::thread> trainers;
    std::atomic<int64_t> step_mbs{0}, step_bytes{0};
    std::atomic<int> errors{0};
    for (int d = 0; d < dp; ++d) {
      for (int r = 0; r < config.tp; ++r) {
        trainers.emplace_back([&, d, r] {
          v1::RankCoords rank;
          rank.set_dp(d);
          rank.set_tp(r);
          TrainerStream stream(control.channel(), create.step_id(), rank);
          while (true) {
            const absl::Time w = absl::Now();
            absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
            if (!next.ok()) {
              std::fprintf(stderr, "bench load: fetch: %s\n", next.status().ToString().c_str());
              errors++;
              return;
            }
            if (!next->has_value()) return;
            mb_ms.Add(Ms(w));
            const v1::Microbatch& mb = **next;
            step_mbs++;
            step_bytes += static_cast<int64_t>(mb.ByteSizeLong());
            const int32_t* cu = reinterpret_cast<const int32_t*>(mb.cu_seqlens().data().data());
            const int32_t* cup = reinterpret_cast<const int32_t*>(mb.cu_seqlens_padded().data().data());
            absl::MutexLock lock(&mu);
            for (int j = 0; j < mb.sample_ids_size(); ++j) {
              const std::string& id = mb.sample_ids(j);
              const size_t offset = static_cast<size_t>(cup[j]) * 4;
              const size_t len = static_cast<size_t>(cu[j + 1] - cu[j]) * 4;
              auto it = acked.find(id);
              if (it == acked.end()) {
                if (!abandoned.contains(id)) {
                  const bool in_bounds = offset + len <= mb.tokens().data().size();
                  early.push_back({id, r,
                                   in_bounds ? TokenChecksum(mb.tokens().data().data() + offset, len)
                                             : 0,
                                   in_bounds});
                }
                continue;
              }
              if (offset + len > mb.tokens().data().size() ||
                  TokenChecksum(mb.tokens().data().data() + offset, len) != it->second) {
                checksum_mismatches++;
              }
              std::vector<int>& counts = fetched[id];
              counts.resize(config.tp, 0);
              counts[r]++;
            }
          }
        });
      }
    }
    for (std::thread& th : trainers) th.join();
    microbatches += step_mbs;
    fetched_bytes += step_bytes;
    fetch_errors += errors;
    const absl::Time r0 = absl::Now();
    absl::StatusOr<v1::ReleaseStepResponse> released = control.ReleaseStep(create.step_id());
    if (!released.ok()) {
      std::fprintf(stderr, "bench load: ReleaseStep: %s\n", released.status().ToString().c_str());
      return false;
    }
    release_ms.Add(Ms(r0));
    ++steps;
    return errors == 0;
  };

  // A line on stderr every few seconds: a run takes minutes, and the table
  // only comes at its end.
  absl::Time next_progress = start + kProgressInterval;
  auto progress = [&](const char* phase) {
    if (absl::Now() < next_progress) return;
    next_progress = absl::Now() + kProgressInterval;
    size_t num_acked_now = 0;
    {
      absl::MutexLock lock(&mu);
      num_acked_now = acked.size();
    }
    std::fprintf(stderr,
                 "bench load: %s %.0f s of %.0f: %zu samples acknowledged, %.1f MB sent, %lld "
                 "steps fetched, %lld puts refused for memory\n",
                 phase, absl::ToDoubleSeconds(absl::Now() - start), config.seconds, num_acked_now,
                 sent_bytes.load() / 1e6, static_cast<long long>(steps),
                 static_cast<long long>(exhausted.load()));
  };

  bool ok = true;
  const absl::Time end = start + absl::Seconds(config.seconds);
  while (ok && absl::Now() < end) {
    progress("producing:");
    absl::StatusOr<v1::PoolInfo> info = control.GetPool(pool);
    if (!info.ok()) {
      ok = false;
      break;
    }
    if (info->num_free_samples() >= config.step_samples) {
      ok = run_step(config.step_samples, config.trainers);
    } else {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  producing = false;
  for (std::thread& th : producers) th.join();
  const double produce_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  // Drain: everything acknowledged goes through a step.
  while (ok) {
    absl::StatusOr<v1::PoolInfo> info = control.GetPool(pool);
    if (!info.ok()) {
      ok = false;
      break;
    }
    const int64_t free = info->num_free_samples();
    if (free == 0) break;
    progress("draining:");
    const int take = static_cast<int>(std::min<int64_t>(free, config.step_samples));
    ok = run_step(take, take >= config.trainers ? config.trainers : 1);
  }
  const double total_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const int64_t peak_rss = child > 0 ? ReadHwmBytes(child) : -1;
  absl::StatusOr<v1::PoolInfo> final_pool = control.GetPool(pool);

  // ---- Count check.
  int64_t missing = 0, duplicated = 0;
  {
    absl::MutexLock lock(&mu);
    for (const EarlyFetch& e : early) {
      auto it = acked.find(e.id);
      if (it == acked.end()) {
        if (!abandoned.contains(e.id)) unknown_fetched++;  // never acknowledged
        continue;
      }
      if (!e.in_bounds || e.checksum != it->second) checksum_mismatches++;
      std::vector<int>& counts = fetched[e.id];
      counts.resize(config.tp, 0);
      counts[e.replica]++;
    }
    for (const auto& [id, sum] : acked) {
      auto it = fetched.find(id);
      for (int r = 0; r < config.tp; ++r) {
        const int n = it == fetched.end() ? 0 : it->second[r];
        if (n == 0) missing++;
        if (n > 1) duplicated++;
      }
    }
  }
  const bool counts_ok = ok && missing == 0 && duplicated == 0 && checksum_mismatches == 0 &&
                         unknown_fetched == 0 && put_errors == 0 && fetch_errors == 0;
  const bool memory_ok = peak_rss < 0 || peak_rss <= config.max_memory + config.rss_overhead;

  const int64_t num_acked = static_cast<int64_t>(acked.size());
  std::printf("rollpack bench load: %d producers, %d x %d trainer streams (dp x tp), %.0f s "
              "(+%.1f s drain), --max-memory %lld%s\n",
              config.producers, config.trainers, config.tp, config.seconds,
              total_seconds - produce_seconds, static_cast<long long>(config.max_memory),
              config.data_dir.empty() ? "" : (" durable, --fsync " + config.fsync).c_str());
  std::printf("| metric | value |\n|---|---|\n");
  std::printf("| samples acknowledged | %lld (%.0f/s) |\n", static_cast<long long>(num_acked),
              num_acked / produce_seconds);
  std::printf("| ingest | %.1f MB/s (%.2f GB sent) |\n", sent_bytes / produce_seconds / 1e6,
              sent_bytes / 1e9);
  std::printf("| fetch | %.1f MB/s (%lld micro-batches, %.2f GB) |\n", fetched_bytes / total_seconds / 1e6,
              static_cast<long long>(microbatches), fetched_bytes / 1e9);
  std::printf("| steps | %d |\n", steps);
  std::printf("| PutSamples (batch of %d) p50 / p99 | %.2f / %.2f ms |\n", config.batch,
              put_ms.Percentile(0.5), put_ms.Percentile(0.99));
  std::printf("| CreateStep p50 / p99 | %.2f / %.2f ms |\n", create_ms.Percentile(0.5),
              create_ms.Percentile(0.99));
  std::printf("| micro-batch wait p50 / p99 | %.3f / %.3f ms |\n", mb_ms.Percentile(0.5),
              mb_ms.Percentile(0.99));
  std::printf("| ReleaseStep p50 / p99 | %.2f / %.2f ms |\n", release_ms.Percentile(0.5),
              release_ms.Percentile(0.99));
  std::printf("| RESOURCE_EXHAUSTED retries | %lld |\n", static_cast<long long>(exhausted.load()));
  if (peak_rss >= 0) {
    std::printf("| server peak RSS | %.1f MiB (max-memory %.1f MiB + overhead %.1f MiB = %.1f) %s |\n",
                peak_rss / 1048576.0, config.max_memory / 1048576.0,
                (peak_rss - config.max_memory) / 1048576.0,
                (config.max_memory + config.rss_overhead) / 1048576.0,
                memory_ok ? "ok" : "OVER");
  }
  std::printf("| count check | %lld acknowledged x %d replicas: missing %lld, duplicated %lld, "
              "checksum mismatches %lld, unknown %lld, left in pool %lld: %s |\n",
              static_cast<long long>(num_acked), config.tp, static_cast<long long>(missing),
              static_cast<long long>(duplicated), static_cast<long long>(checksum_mismatches),
              static_cast<long long>(unknown_fetched),
              static_cast<long long>(final_pool.ok() ? final_pool->num_samples() : -1),
              counts_ok ? "ok" : "FAILED");
  stop_child();
  return counts_ok && memory_ok && num_acked > 0 ? 0 : 1;
}

}  // namespace rollpack
