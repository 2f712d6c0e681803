#include "cli/bench/transport_command.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cli/bench/support.h"
#include "cli/flags.h"
#include "cli/bench/grpc_ceiling.h"
#include "cli/bench/host_measures.h"
#include "client/cpp/client.h"
#include "client/cpp/received_microbatch.h"
#include "testing/synthetic_rollouts.h"
#include "client/cpp/trainer_stream.h"
#include "grpcpp/create_channel.h"
#include "server/server.h"

namespace rollpack {
namespace {

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

// A server child process (rollpackd, or this program's gRPC sink) whose CPU
// time and peak RSS we can read; stopped with SIGTERM when destroyed.
class Daemon {
 public:
  // Runs `binary server_args... --port-file F` and waits for the port in F.
  static std::unique_ptr<Daemon> Start(const std::string& binary,
                                       const std::vector<std::string>& server_args) {
    static int started = 0;
    const std::string port_file =
        absl::StrCat("/tmp/rollpack-bench-", getpid(), "-", started++, ".port");
    unlink(port_file.c_str());
    std::vector<std::string> args = {binary};
    args.insert(args.end(), server_args.begin(), server_args.end());
    args.push_back("--port-file");
    args.push_back(port_file);
    pid_t pid = fork();
    if (pid == 0) {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    auto daemon = std::unique_ptr<Daemon>(new Daemon(pid));
    for (int i = 0; i < 200; ++i) {
      std::ifstream in(port_file);
      int port = 0;
      if (in >> port && port > 0) {
        daemon->address_ = absl::StrCat("127.0.0.1:", port);
        unlink(port_file.c_str());
        return daemon;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return nullptr;
  }
  ~Daemon() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  double CpuSeconds() const { return StatCpuSeconds(absl::StrCat("/proc/", pid_, "/stat")); }
  int64_t PeakRssBytes() const {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
    }
    return 0;
  }
  // Starts PeakRssBytes afresh from the current RSS (a phase's own peak).
  void ResetPeakRss() const {
    std::ofstream(absl::StrCat("/proc/", pid_, "/clear_refs")) << "5";
  }

 private:
  explicit Daemon(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  std::string address_;
};

// Distinct sample ids over a small set of distinct payloads: generating
// routing for millions of tokens would dominate the run, copying does not.
std::vector<v1::Sample> Replicate(const std::vector<v1::Sample>& base, int count,
                                  const std::string& prefix) {
  std::vector<v1::Sample> out(count);
  for (int i = 0; i < count; ++i) {
    out[i] = base[i % base.size()];
    out[i].set_sample_id(absl::StrCat(prefix, "-", i));
  }
  return out;
}

int64_t WireBytes(const std::vector<v1::Sample>& samples) {
  int64_t bytes = 0;
  for (const v1::Sample& s : samples) bytes += static_cast<int64_t>(s.ByteSizeLong());
  return bytes;
}

// A trainer rank's connection, with the flow-control window a rank grants
// (ClientOptions::stream_window_bytes; 0 = gRPC's own auto-tuning).
std::shared_ptr<grpc::Channel> DistinctChannel(const std::string& address, int id,
                                               const ClientOptions& options) {
  grpc::ChannelArguments args = BulkChannelArguments(options);
  args.SetInt("rollpack.connection", id);  // a connection of its own
  if (options.tls_root_certs_pem.empty()) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = options.tls_root_certs_pem;
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

struct IngestResult {
  double gbps = 0, samples_per_s = 0, server_cpu_s_per_gb = 0;
  // This process's CPU over the ingest: nothing but the producers runs then.
  double producer_cpu_s_per_gb = 0;
  // The busiest thread's share of the wall time, server and producer side.
  double server_busiest_thread = 0, producer_busiest_thread = 0;
  int64_t bytes = 0;
};

IngestResult Ingest(const Daemon& daemon, const std::string& pool,
                    const std::vector<std::vector<v1::Sample>>& per_producer,
                    const ClientOptions& producer_options) {
  IngestResult r;
  int64_t samples = 0;
  for (const auto& batch : per_producer) {
    r.bytes += WireBytes(batch);
    samples += static_cast<int64_t>(batch.size());
  }
  const double cpu0 = daemon.CpuSeconds();
  const double producer_cpu0 = ProcessCpuSeconds();
  const std::map<int, double> server_threads0 = ThreadCpuSeconds(daemon.pid());
  const std::map<int, double> producer_threads0 = ThreadCpuSeconds(getpid());
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  std::atomic<bool> ok{true};
  // Each producer thread's own CPU, read before it exits (and leaves /proc).
  std::vector<double> producer_thread_cpu(per_producer.size());
  for (size_t p = 0; p < per_producer.size(); ++p) {
    threads.emplace_back([&, p] {
      // Connections of its own, put_streams of them.
      RollpackClient client(daemon.address(), producer_options);
      if (!client.PutSamples(pool, per_producer[p]).ok()) ok = false;
      timespec cpu;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
      producer_thread_cpu[p] = cpu.tv_sec + 1e-9 * cpu.tv_nsec;
    });
  }
  for (std::thread& t : threads) t.join();
  const double s = Seconds(start);
  if (!ok) return IngestResult{};  // bytes 0: the caller reports the failure
  r.gbps = r.bytes / s / 1e9;
  r.samples_per_s = samples / s;
  r.server_cpu_s_per_gb = (daemon.CpuSeconds() - cpu0) / (r.bytes / 1e9);
  r.producer_cpu_s_per_gb = (ProcessCpuSeconds() - producer_cpu0) / (r.bytes / 1e9);
  r.server_busiest_thread =
      BusiestThreadShare(server_threads0, ThreadCpuSeconds(daemon.pid()), s);
  // gRPC's threads from /proc, the producer threads (gone by now) from above.
  r.producer_busiest_thread = std::max(
      BusiestThreadShare(producer_threads0, ThreadCpuSeconds(getpid()), s),
      *std::max_element(producer_thread_cpu.begin(), producer_thread_cpu.end()) / s);
  return r;
}

// False, with the call and its status on stderr, for an error: the bench's
// exit code alone does not say which call of which phase failed.
bool Reported(const absl::Status& status, const char* call) {
  if (status.ok()) return true;
  std::fprintf(stderr, "bench transport: %s: %s\n", call, status.ToString().c_str());
  return false;
}
template <typename T>
bool Reported(const absl::StatusOr<T>& result, const char* call) {
  return Reported(result.status(), call);
}

// Copies every array of `m` into `staging`, one after another.
void StageArrays(const ReceivedMicrobatch& m, std::vector<char>* staging) {
  std::vector<std::string> arrays = {"tokens", "cu_seqlens", "cu_seqlens_padded",
                                     "replay_experts", "replay_mask"};
  for (const auto& [name, array] : m.meta().token_fields()) {
    arrays.push_back(absl::StrCat(ReceivedMicrobatch::kFieldPrefix, name));
  }
  int64_t total = 0;
  for (const std::string& a : arrays) total += std::max<int64_t>(0, m.data_size(a));
  if (static_cast<int64_t>(staging->size()) < total) staging->resize(total);
  char* at = staging->data();
  for (const std::string& a : arrays) {
    m.CopyData(a, at);
    at += std::max<int64_t>(0, m.data_size(a));
  }
}

struct FetchResult {
  int streams = 0;
  double gbps = 0, first_all_ms = 0, server_cpu_s_per_gb = 0;
  // From CreateStep's return, when the ranks open their streams.
  double streams_gbps = 0;
  // This process's CPU over the fetch: nothing but the trainer ranks runs.
  double trainer_cpu_s_per_gb = 0;
  // Of first_all_ms: until CreateStep returned (plan and layout).
  double create_step_ms = 0;
  // The first and the median rank to hold its first micro-batch.
  double first_min_ms = 0, first_median_ms = 0;
  // Empty when every stream ran to its end (or its first micro-batch).
  std::string error;
  int64_t bytes = 0;
  int64_t microbatches = 0;
};

FetchResult Fetch(const Daemon& daemon, RollpackClient& control, const std::string& pool,
                  int num_samples, const v1::Topology& topology, bool first_only,
                  const ClientOptions& trainer_options) {
  FetchResult r;
  v1::CreateStepRequest create;
  create.set_step_id(absl::StrCat(pool, "-step"));
  create.set_pool(pool);
  create.set_num_samples(num_samples);
  *create.mutable_topology() = topology;
  std::vector<v1::RankCoords> ranks;
  for (int d = 0; d < topology.dp(); ++d)
    for (int c = 0; c < std::max(1, topology.cp()); ++c)
      for (int t = 0; t < std::max(1, topology.tp()); ++t)
        for (int p = 0; p < std::max(1, topology.pp()); ++p) {
          v1::RankCoords rank;
          rank.set_dp(d);
          rank.set_cp(c);
          rank.set_tp(t);
          rank.set_pp(p);
          ranks.push_back(rank);
        }
  r.streams = static_cast<int>(ranks.size());
  // Each trainer rank is its own process in real life: its own connection.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (size_t i = 0; i < ranks.size(); ++i) {
    channels.push_back(
        DistinctChannel(daemon.address(), 1000 + static_cast<int>(i), trainer_options));
    channels.back()->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  }
  std::vector<double> first_ms(ranks.size(), 0);
  std::vector<int64_t> bytes(ranks.size(), 0);
  std::vector<int64_t> microbatches(ranks.size(), 0);
  // Trainer rank processes exist before the step does: their threads start
  // (and touch their stacks) before the clock, then go together once the
  // step is created. Spawning 64 threads would otherwise be timed too.
  absl::Notification step_created;
  absl::Mutex error_mu;
  std::atomic<bool> created_ok{false};
  absl::Time start;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i) {
    threads.emplace_back([&, i] {
      step_created.WaitForNotification();
      if (!created_ok) return;
      TrainerStream stream(channels[i], create.step_id(), ranks[i]);
      // What DeviceStream does on a GPU rank before the host-to-device
      // copy: each array copied once from the received buffers into a
      // staging buffer kept between micro-batches.
      std::vector<char> staging;
      bool first = true;
      while (true) {
        absl::StatusOr<std::optional<ReceivedMicrobatch>> next = stream.NextReceived();
        if (!next.ok()) {
          absl::MutexLock lock(&error_mu);
          if (r.error.empty()) r.error = absl::StrCat("rank ", i, ": ", next.status().ToString());
          return;
        }
        if (!next->has_value()) return;
        if (first) {
          first_ms[i] = Seconds(start) * 1e3;
          first = false;
          if (first_only) return;
        }
        StageArrays(**next, &staging);
        bytes[i] += (*next)->wire_bytes();
        ++microbatches[i];
      }
    });
  }
  const double cpu0 = daemon.CpuSeconds();
  const double trainer_cpu0 = ProcessCpuSeconds();
  start = absl::Now();
  const absl::StatusOr<v1::StepInfo> created = control.CreateStep(create);
  created_ok = created.ok();
  r.create_step_ms = Seconds(start) * 1e3;
  const absl::Time streams_open = absl::Now();
  step_created.Notify();
  for (std::thread& t : threads) t.join();
  if (!created_ok) {
    r.error = absl::StrCat("CreateStep: ", created.status().ToString());
    return r;
  }
  const double s = Seconds(start);
  const double streaming = s - absl::ToDoubleSeconds(streams_open - start);
  std::sort(first_ms.begin(), first_ms.end());
  r.first_min_ms = first_ms.front();
  r.first_median_ms = first_ms[first_ms.size() / 2];
  for (size_t i = 0; i < ranks.size(); ++i) {
    r.bytes += bytes[i];
    r.microbatches += microbatches[i];
    r.first_all_ms = std::max(r.first_all_ms, first_ms[i]);
  }
  r.gbps = r.bytes / s / 1e9;
  r.streams_gbps = r.bytes / streaming / 1e9;
  r.server_cpu_s_per_gb = r.bytes > 0 ? (daemon.CpuSeconds() - cpu0) / (r.bytes / 1e9) : 0;
  r.trainer_cpu_s_per_gb = r.bytes > 0 ? (ProcessCpuSeconds() - trainer_cpu0) / (r.bytes / 1e9) : 0;
  (void)control.ReleaseStep(create.step_id());
  return r;
}

v1::Topology MakeTopology(int dp, int cp, int tp, int pp, int64_t max_tokens) {
  v1::Topology t;
  t.set_dp(dp);
  t.set_cp(cp);
  t.set_tp(tp);
  t.set_pp(pp);
  t.set_max_tokens_per_rank(max_tokens);
  return t;
}

}  // namespace

int RunBenchTransportCommand(int argc, char** argv) {
  int samples_per_case = 1024;
  int first_mb_samples = 8192;
  // Profiling one phase is easier without the others.
  std::vector<std::string> phases = {"ingest", "fetch", "first"};
  std::vector<std::string> server_args;
  std::string rollpackd;  // default: next to this binary
  std::string tls_ca;
  ClientOptions producer_options;
  ClientOptions trainer_options;
  FlagSet flags("rollpack bench transport",
                "Loopback limits (TCP, memcpy, gRPC alone into a sink process) against "
                "rollpackd's ingest and fetch throughput and the time from CreateStep to the "
                "first micro-batch on every rank, with rollpackd as a child process.");
  flags.Int("samples", &samples_per_case, "Synthetic rollouts per ingest and fetch case.")
      .Min(1);
  flags.Int("first-mb-samples", &first_mb_samples,
            "Samples of the step whose time to first micro-batch is measured.")
      .Min(1);
  flags.List("phases", &phases, "Phases to run, of ingest, fetch and first.");
  flags.Repeated("server-arg", &server_args,
                 "A flag passed to the rollpackd child as is; --grpc-arg=... ones also go to "
                 "the gRPC sink.");
  flags.String("rollpackd", &rollpackd,
               "rollpackd binary to start; empty: the one next to this program.");
  flags.String("tls-ca", &tls_ca,
               "PEM CA that signed the certificate of --server-arg=--tls-cert=...: rollpackd's "
               "clients speak TLS trusting it (the gRPC-alone limit stays plaintext).");
  flags.Int64("batch-bytes", &producer_options.batch_bytes,
              "Bytes of each PutSamples message, and of the gRPC-alone messages.")
      .Min(1);
  flags.Int("put-streams", &producer_options.put_streams,
            "Connections each producer stripes PutSamples over, 1 to 64; the default 0 "
            "means one per core, at most 4.")
      .Range(1, 64);
  flags.Int("stream-window-bytes", &trainer_options.stream_window_bytes,
            "HTTP/2 stream window each trainer rank grants the server, fixed (the trainer "
            "client's default); 0 = gRPC's auto-tuning (BDP probing), as gRPC alone runs.")
      .Min(0);
  if (ParseResult r = flags.Parse(argc, argv); r.should_exit()) return r.exit_code();
  for (const std::string& phase : phases) {
    // An empty list ("--phases=") measures the limits alone, as it always did.
    if (!phase.empty() && phase != "ingest" && phase != "fetch" && phase != "first") {
      return flags.UsageError(absl::StrCat("invalid value '", phase,
                                           "' in --phases: want ingest, fetch or first"));
    }
  }
  const std::string self = SelfPath();  // the gRPC sink runs in a copy of this program
  if (self.empty()) return 1;
  const std::string binary = rollpackd.empty() ? SelfDir() + "/rollpackd" : rollpackd;
  producer_options.put_streams = ResolvedPutStreams(producer_options);
  ClientOptions control_options;
  if (!tls_ca.empty()) {
    std::ifstream in(tls_ca);
    std::stringstream pem;
    pem << in.rdbuf();
    if (!in || pem.str().find("-----BEGIN") == std::string::npos) {
      return flags.UsageError(absl::StrCat("--tls-ca ", tls_ca, " is not a readable PEM file"));
    }
    producer_options.tls_root_certs_pem = trainer_options.tls_root_certs_pem =
        control_options.tls_root_certs_pem = pem.str();
  }
  std::vector<std::string> daemon_args = {"--listen", "127.0.0.1:0", "--max-memory",
                                          absl::StrCat(int64_t{16} << 30)};
  daemon_args.insert(daemon_args.end(), server_args.begin(), server_args.end());
  std::unique_ptr<Daemon> daemon = Daemon::Start(binary, daemon_args);
  if (daemon == nullptr) {
    std::fprintf(stderr, "bench transport: cannot start %s\n", binary.c_str());
    return 1;
  }
  RollpackClient control(MakeChannel(daemon->address(), control_options), control_options);
  v1::ModelSpec model;
  model.set_name("Qwen3-30B-A3B");
  model.set_num_layers(48);
  model.set_num_experts(128);
  model.set_topk(8);

  auto runs = [&](const std::string& phase) {
    return std::find(phases.begin(), phases.end(), phase) != phases.end();
  };
  const double tcp = LoopbackTcpGBps(int64_t{4} << 30);
  const double memcpy_gbps = MemcpyGBps(int64_t{256} << 20, 8);

  SyntheticOptions synth;
  synth.num_samples = 64;
  synth.median_length = 4096;
  synth.sigma = 0.9;
  synth.min_length = 1024;
  synth.max_length = 32768;
  synth.mixed_forms = false;
  synth.narrow_when_uniform = true;
  const std::vector<v1::Sample> base = MakeSyntheticRollouts(model, synth);

  std::printf("rollpack bench transport: rollpackd child process, %s rollouts (48 MoE layers, "
              "top-8, uint8), lengths 1k-32k\n\n",
              model.name().c_str());
  std::printf("%-44s %12s\n", "limit", "GB/s");
  std::printf("%-44s %12.2f\n", "loopback TCP, one stream", tcp);
  std::printf("%-44s %12.2f\n", "memcpy (bytes copied)", memcpy_gbps);
  std::string json = absl::StrCat("{\"loopback_tcp_gbps\": ", tcp, ", \"memcpy_gbps\": ", memcpy_gbps,
                                  ", \"stream_window_bytes\": ", trainer_options.stream_window_bytes);
  // gRPC alone, in a process of its own with rollpackd's channel arguments:
  // what the producers' streams could carry if rollpack cost nothing.
  std::unique_ptr<Daemon> sink;
  if (runs("ingest") || runs("fetch")) {
    std::vector<std::string> sink_args = {"bench", "grpc-sink"};
    for (const std::string& arg : server_args) {
      if (arg.rfind("--grpc-arg=", 0) == 0) sink_args.push_back(arg);
    }
    sink = Daemon::Start(self, sink_args);
    if (sink == nullptr) {
      std::fprintf(stderr, "bench transport: cannot start the gRPC sink\n");
      return 1;
    }
  }
  if (runs("ingest")) {
    GrpcCeilingOptions ceiling;
    ceiling.message_bytes = producer_options.batch_bytes;
    ceiling.total_bytes = std::max<int64_t>(
        int64_t{256} << 20, WireBytes(Replicate(base, samples_per_case, "ceiling")));
    for (int streams : {1, producer_options.put_streams}) {
      ceiling.streams = streams;
      absl::StatusOr<double> gbps = MeasureGrpcCeilingGBps(sink->address(), ceiling);
      if (!gbps.ok()) {
        std::fprintf(stderr, "bench transport: %s\n", gbps.status().ToString().c_str());
        return 1;
      }
      std::printf("%-44s %12.2f\n",
                  absl::StrCat("gRPC alone, ", streams, " stream(s), messages dropped").c_str(),
                  *gbps);
      absl::StrAppend(&json, ", \"grpc_", streams, "_stream_gbps\": ", *gbps);
      if (streams == producer_options.put_streams) break;
    }
  }

  std::printf("\n%-50s %10s %10s %10s %12s %12s %9s %9s\n", "ingest", "GB/s", "x TCP",
              "samples/s", "srv CPU s/GB", "prod CPU s/GB", "srv thr", "prod thr");
  int pool_id = 0;
  struct IngestCase {
    int producers, streams;
    // The first ingest into a fresh server also pays for faulting in memory
    // that a long-running sidecar reuses: measured, shown, not compared.
    bool warm_up;
  };
  const int streams = producer_options.put_streams;
  std::vector<IngestCase> ingest_cases = {
      {1, streams, true}, {1, 1, false}, {1, streams, false}, {4, streams, false}};
  if (streams == 1) ingest_cases.erase(ingest_cases.begin() + 2);
  for (const auto [producers, put_streams, warm_up] : ingest_cases) {
    if (!runs("ingest")) break;
    ClientOptions options = producer_options;
    options.put_streams = put_streams;
    const std::string pool = absl::StrCat("ingest-", pool_id++);
    if (!Reported(control.RegisterModel(pool, model), "RegisterModel")) return 1;
    std::vector<std::vector<v1::Sample>> batches;
    for (int p = 0; p < producers; ++p) {
      batches.push_back(Replicate(base, samples_per_case / producers, absl::StrCat(pool, "-", p)));
    }
    const IngestResult r = Ingest(*daemon, pool, batches, options);
    if (r.bytes == 0) {
      std::fprintf(stderr, "bench transport: PutSamples failed (%d producers)\n", producers);
      return 1;
    }
    std::printf("%-50s %10.2f %10.2f %10.0f %12.2f %12.2f %9.2f %9.2f\n",
                absl::StrCat(producers, " producer(s) x ", put_streams, " stream(s), ",
                             samples_per_case, " samples", warm_up ? " (warm-up)" : "")
                    .c_str(),
                r.gbps, r.gbps / tcp, r.samples_per_s, r.server_cpu_s_per_gb,
                r.producer_cpu_s_per_gb, r.server_busiest_thread, r.producer_busiest_thread);
    const std::string key =
        warm_up ? "ingest_warm_up_" : absl::StrCat("ingest_", producers, "p", put_streams, "s_");
    absl::StrAppend(&json, ", \"", key, "gbps\": ", r.gbps, ", \"", key,
                    "samples_per_s\": ", r.samples_per_s, ", \"", key,
                    "server_cpu_s_per_gb\": ", r.server_cpu_s_per_gb, ", \"", key,
                    "producer_cpu_s_per_gb\": ", r.producer_cpu_s_per_gb, ", \"", key,
                    "server_busiest_thread\": ", r.server_busiest_thread, ", \"", key,
                    "producer_busiest_thread\": ", r.producer_busiest_thread);
    // Free the pool's samples: a step over all of them, released.
    v1::CreateStepRequest drop;
    drop.set_step_id(pool);
    drop.set_pool(pool);
    drop.set_num_samples(samples_per_case / producers * producers);
    *drop.mutable_topology() = MakeTopology(1, 1, 1, 1, 1 << 20);
    if (!Reported(control.CreateStep(drop), "CreateStep") ||
        !Reported(control.ReleaseStep(pool), "ReleaseStep")) {
      return 1;
    }
  }

  std::printf("\n%-44s %10s %10s %12s %14s %14s\n", "fetch (all ranks concurrently)", "GB/s",
              "x TCP", "srv CPU s/GB", "ranks CPU s/GB", "first mb, ms");
  int64_t peak_payload = 0;
  // Each phase's peak against its own payload: the fetch pools are near the
  // size of the first-mb pool, and many slow ranks' send buffers in flight
  // raise the fetch phase's peak, where the overall ratio does not say so.
  struct PhasePeak {
    const char* name;
    int64_t rss = 0, payload = 0;
  };
  std::vector<PhasePeak> phase_peaks;
  // The ingest phase's (its pools are released), for the overall peak.
  const int64_t ingest_peak_rss = daemon->PeakRssBytes();
  daemon->ResetPeakRss();
  struct FetchCase {
    int dp, cp, tp, pp;
  };
  for (const FetchCase& c : {FetchCase{1, 1, 1, 1}, FetchCase{8, 1, 1, 1}, FetchCase{8, 2, 2, 1}, FetchCase{8, 2, 2, 2}}) {
    if (!runs("fetch")) break;
    const std::string pool = absl::StrCat("fetch-", pool_id++);
    if (!Reported(control.RegisterModel(pool, model), "RegisterModel")) return 1;
    if (!Reported(control.PutSamples(pool, Replicate(base, samples_per_case, pool)), "PutSamples")) {
      return 1;
    }
    const absl::StatusOr<v1::PoolInfo> stored = control.GetPool(pool);
    if (!Reported(stored, "GetPool")) return 1;
    peak_payload = std::max(peak_payload, stored->stored_bytes());
    const FetchResult r =
        Fetch(*daemon, control, pool, samples_per_case, MakeTopology(c.dp, c.cp, c.tp, c.pp, 32768),
              false, trainer_options);
    if (!r.error.empty()) {
      std::fprintf(stderr, "bench transport: fetch failed: %s\n", r.error.c_str());
      return 1;
    }
    std::printf("%-44s %10.2f %10.2f %12.2f %14.2f %14.1f\n",
                absl::StrCat(r.streams, r.streams == 1 ? " stream" : " streams", " (dp", c.dp,
                             " cp", c.cp, " tp", c.tp, " pp", c.pp, ")").c_str(),
                r.gbps, r.gbps / tcp, r.server_cpu_s_per_gb, r.trainer_cpu_s_per_gb,
                r.first_all_ms);
    absl::StrAppend(&json, ", \"fetch_", r.streams, "_gbps\": ", r.gbps, ", \"fetch_", r.streams,
                    "_server_cpu_s_per_gb\": ", r.server_cpu_s_per_gb, ", \"fetch_", r.streams,
                    "_trainer_cpu_s_per_gb\": ", r.trainer_cpu_s_per_gb);
    if (r.streams == 1 && r.microbatches > 0) {
      // The ceiling of that one stream: gRPC alone sending messages of the
      // same size on one connection, read the same way (raw, one at a
      // time), right after it.
      GrpcCeilingOptions ceiling;
      ceiling.message_bytes = r.bytes / r.microbatches;
      ceiling.total_bytes = std::max<int64_t>(r.bytes, int64_t{256} << 20);
      absl::StatusOr<double> alone = MeasureGrpcSourceGBps(sink->address(), ceiling);
      if (!alone.ok()) {
        std::fprintf(stderr, "bench transport: %s\n", alone.status().ToString().c_str());
        return 1;
      }
      std::printf("%-44s %10.2f %10.2f   (the stream above: %.2fx of it)\n",
                  absl::StrCat("  gRPC alone, 1 server stream, ", ceiling.message_bytes >> 20,
                               " MiB messages")
                      .c_str(),
                  *alone, *alone / tcp, r.gbps / *alone);
      // Like for like with gRPC alone (timed from its call's start).
      std::printf("%-44s %10.2f %10.2f   (%.2fx of gRPC alone)\n",
                  "  the stream above, from its open", r.streams_gbps, r.streams_gbps / tcp,
                  r.streams_gbps / *alone);
      absl::StrAppend(&json, ", \"grpc_source_1_stream_gbps\": ", *alone,
                      ", \"fetch_1_over_grpc_source\": ", r.gbps / *alone,
                      ", \"fetch_1_stream_gbps\": ", r.streams_gbps,
                      ", \"fetch_1_stream_over_grpc_source\": ", r.streams_gbps / *alone);
    }
  }

  if (peak_payload > 0) {
    phase_peaks.push_back({"fetch", daemon->PeakRssBytes(), peak_payload});
    daemon->ResetPeakRss();
  }

  // CreateStep to first micro-batch on 64 ranks for a large step. Short
  // sequences keep the payload in memory modest; planning cost is per sample.
  if (runs("first")) {
    const std::string pool = absl::StrCat("first-", pool_id++);
    if (!Reported(control.RegisterModel(pool, model), "RegisterModel")) return 1;
    SyntheticOptions small = synth;
    small.median_length = 512;
    small.min_length = 64;
    small.max_length = 8192;
    const std::vector<v1::Sample> short_base = MakeSyntheticRollouts(model, small);
    for (int done = 0; done < first_mb_samples; done += 1024) {
      std::vector<v1::Sample> part = Replicate(short_base, std::min(1024, first_mb_samples - done),
                                               absl::StrCat(pool, "-", done));
      if (!Reported(control.PutSamples(pool, part), "PutSamples")) return 1;
    }
    const absl::StatusOr<v1::PoolInfo> stored = control.GetPool(pool);
    if (!Reported(stored, "GetPool")) return 1;
    peak_payload = std::max(peak_payload, stored->stored_bytes());
    phase_peaks.push_back({"first", 0, stored->stored_bytes()});
    const FetchResult r = Fetch(*daemon, control, pool, first_mb_samples,
                                MakeTopology(8, 2, 2, 2, 16384), /*first_only=*/true,
                                trainer_options);
    if (!r.error.empty()) {
      std::fprintf(stderr, "bench transport: fetch failed: %s\n", r.error.c_str());
      return 1;
    }
    std::printf("\n%-44s %10.1f ms (CreateStep %.1f ms; first rank %.1f, median %.1f)\n",
                absl::StrCat("CreateStep -> first mb on all ", r.streams, " ranks, ",
                             first_mb_samples, " samples").c_str(),
                r.first_all_ms, r.create_step_ms, r.first_min_ms, r.first_median_ms);
    absl::StrAppend(&json, ", \"create_to_first_mb_all_ranks_ms\": ", r.first_all_ms,
                    ", \"create_step_ms\": ", r.create_step_ms, ", \"first_mb_min_ms\": ",
                    r.first_min_ms, ", \"first_mb_median_ms\": ", r.first_median_ms,
                    ", \"first_mb_samples\": ", first_mb_samples);
  }
  const int64_t last_phase_rss = daemon->PeakRssBytes();
  int64_t rss = std::max(ingest_peak_rss, last_phase_rss);
  for (PhasePeak& phase : phase_peaks) {
    if (phase.rss == 0) phase.rss = last_phase_rss;  // the first-mb phase's
    rss = std::max(rss, phase.rss);
  }
  if (peak_payload > 0) {  // a fetch phase ran
    std::printf("%-44s %10.2f   (peak RSS %.2f GB / payload held %.2f GB)\n",
                "peak RSS / payload held", static_cast<double>(rss) / peak_payload, rss / 1e9,
                peak_payload / 1e9);
    absl::StrAppend(&json, ", \"peak_rss_bytes\": ", rss, ", \"peak_payload_bytes\": ",
                    peak_payload, ", \"peak_rss_over_payload\": ",
                    static_cast<double>(rss) / peak_payload);
    for (const PhasePeak& phase : phase_peaks) {
      std::printf("%-44s %10.2f   (peak RSS %.2f GB / payload held %.2f GB)\n",
                  absl::StrCat("  ", phase.name, " phase: peak RSS / its payload").c_str(),
                  static_cast<double>(phase.rss) / phase.payload, phase.rss / 1e9,
                  phase.payload / 1e9);
      absl::StrAppend(&json, ", \"", phase.name, "_peak_rss_over_payload\": ",
                      static_cast<double>(phase.rss) / phase.payload);
    }
  }
  absl::StrAppend(&json, "}");
  std::printf("\nJSON: %s\n", json.c_str());
  return 0;
}

}  // namespace rollpack
