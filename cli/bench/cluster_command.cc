#include "cli/bench/cluster_command.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "cli/bench/cluster_fetch.h"
#include "cli/bench/support.h"
#include "cli/flags.h"
#include "client/cpp/client.h"
#include "client/cpp/delivery_mode.h"
#include "client/cpp/trainer_stream.h"
#include "proto/wire/deterministic_bytes.h"
#include "server/cluster/cluster.h"
#include "server/cluster/cluster_steps.h"
#include "server/cluster/etcd_client.h"
#include "server/server.h"
#include "testing/etcd_process.h"
#include "testing/synthetic_rollouts.h"

namespace rollpack {
namespace {

struct ClusterBenchConfig {
  int members = 8;
  int samples = 65536;
  int rounds = 3;
  double median_length = 256;
  int64_t max_length = 2048;
  int dp = 16;
  int cp = 4;
  int64_t max_tokens_per_rank = 16384;
  int fetch_threads = 8;
};

// Every rank's micro-batches through `address`, as deterministic bytes.
absl::StatusOr<std::vector<std::vector<std::string>>> FetchAll(
    const std::string& address, const std::string& step_id, const v1::Topology& topology,
    int threads) {
  const std::vector<v1::RankCoords> ranks = AllRanks(topology);
  std::vector<std::vector<std::string>> out(ranks.size());
  std::vector<absl::Status> errors(ranks.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  auto channel = MakeChannel(address);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < ranks.size(); i = next++) {
        // Proxied, as docs/cluster.md's table measures it: the member
        // dialled pulls what it does not hold (the default, kAuto, would
        // pull directly from the owners; --mode fetch compares the two).
        TrainerStreamOptions options;
        options.delivery = Delivery::kProxy;
        TrainerStream stream(channel, step_id, ranks[i], options);
        while (true) {
          absl::StatusOr<std::optional<v1::Microbatch>> mb = stream.Next();
          if (!mb.ok()) {
            errors[i] = mb.status();
            break;
          }
          if (!mb->has_value()) break;
          out[i].push_back(DeterministicBytes(**mb));
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
  for (const absl::Status& s : errors) {
    if (!s.ok()) return s;
  }
  return out;
}

absl::Status PutSpread(const std::vector<std::unique_ptr<RollpackServer>>& members,
                       const std::vector<v1::Sample>& samples, int holders) {
  constexpr size_t kBatch = 512;
  std::vector<absl::Status> errors(holders);
  std::vector<std::thread> threads;
  for (int m = 0; m < holders; ++m) {
    threads.emplace_back([&, m] {
      RollpackClient client(MakeChannel(members[m]->address()));
      std::vector<v1::Sample> batch;
      for (size_t i = m; i < samples.size(); i += holders) {
        batch.push_back(samples[i]);
        if (batch.size() == kBatch || i + holders >= samples.size()) {
          absl::StatusOr<v1::PutSamplesResponse> put = client.PutSamples("pool", batch);
          if (!put.ok()) {
            errors[m] = put.status();
            return;
          }
          batch.clear();
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : errors) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

int RunBenchClusterCommand(int argc, char** argv) {
  // --mode fetch has flags of its own (bench_cluster_fetch.h).
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--mode=fetch" || (arg == "--mode" && i + 1 < argc &&
                                  absl::string_view(argv[i + 1]) == "fetch")) {
      return RunBenchClusterFetchCommand(argc, argv);
    }
  }
  ClusterBenchConfig config;
  std::string mode = "plan";
  FlagSet flags("rollpack bench cluster",
                "CreateStep over samples spread on M cluster members (an etcd and the members "
                "on 127.0.0.1, in this process) against the same plan on one rollpackd, the "
                "bytes moved to plan, and fetching every rank through a member that holds none "
                "of the samples. Needs /usr/bin/etcd (Debian etcd-server).");
  flags.String("mode", &mode,
               "plan: this benchmark; fetch: direct pulls against proxy delivery (issue 19), "
               "see `rollpack bench cluster --mode fetch --help`.");
  flags.Int("members", &config.members, "Members holding samples (M); one more holds none.")
      .Min(1);
  flags.Int("samples", &config.samples, "Samples in the step (S), spread round-robin.").Min(1);
  flags.Int("rounds", &config.rounds, "Rounds (put, create on both, fetch once, release).")
      .Min(1);
  flags.Double("median-length", &config.median_length, "Median rollout length, tokens.");
  flags.Int64("max-length", &config.max_length, "Longest rollout, tokens.").Min(1);
  flags.Int("dp", &config.dp, "Data-parallel ranks of the step.").Min(1);
  flags.Int("cp", &config.cp, "Context-parallel ranks of the step (dynamic CP).").Min(1);
  flags.Int64("max-tokens-per-rank", &config.max_tokens_per_rank, "Per-rank token budget.")
      .Min(1);
  flags.Int("fetch-threads", &config.fetch_threads, "Trainer streams at a time.").Min(1);
  if (ParseResult r = flags.Parse(argc, argv); r.should_exit()) return r.exit_code();
  if (mode != "plan") {
    return flags.UsageError(absl::StrCat("--mode \"", mode, "\": want plan or fetch"));
  }

  absl::StatusOr<std::unique_ptr<EtcdProcess>> etcd = EtcdProcess::Start();
  if (!etcd.ok()) {
    std::fprintf(stderr, "rollpack bench cluster: %s\n", etcd.status().ToString().c_str());
    return 1;
  }
  std::vector<std::unique_ptr<RollpackServer>> members;
  for (int m = 0; m <= config.members; ++m) {
    ServerOptions options;
    options.max_memory_bytes = int64_t{8} << 30;
    options.cluster_etcd = {(*etcd)->client_url()};
    options.cluster_name = "bench";
    absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
    if (!server.ok()) {
      std::fprintf(stderr, "rollpack bench cluster: member %d: %s\n", m,
                   server.status().ToString().c_str());
      return 1;
    }
    members.push_back(*std::move(server));
  }
  ServerOptions single_options;
  single_options.max_memory_bytes = int64_t{8} << 30;
  absl::StatusOr<std::unique_ptr<RollpackServer>> single = RollpackServer::Start(single_options);
  if (!single.ok()) {
    std::fprintf(stderr, "rollpack bench cluster: %s\n", single.status().ToString().c_str());
    return 1;
  }
  RollpackClient single_client(MakeChannel((*single)->address()));
  RollpackClient coordinator(MakeChannel(members[0]->address()));
  if (!single_client.RegisterModel("pool", BenchModel()).ok() ||
      !coordinator.RegisterModel("pool", BenchModel()).ok()) {
    std::fprintf(stderr, "rollpack bench cluster: RegisterModel failed\n");
    return 1;
  }
  SyntheticOptions synthetic;
  synthetic.num_samples = config.samples;
  synthetic.median_length = config.median_length;
  synthetic.max_length = config.max_length;
  synthetic.mixed_forms = false;
  const std::vector<v1::Sample> samples = MakeSyntheticRollouts(BenchModel(), synthetic);
  v1::Topology topology;
  topology.set_dp(config.dp);
  topology.set_cp(config.cp);
  topology.set_max_tokens_per_rank(config.max_tokens_per_rank);
  topology.set_scheduler(v1::DYNAMIC_CP);

  std::vector<double> single_ms, cluster_ms, single_fetch_s, cluster_fetch_s;
  int64_t planning_bytes = 0, record_bytes = 0, pulled_bytes = 0, fetched_bytes = 0;
  bool identical = true;
  ClusterSteps* planner = members[0]->cluster_steps();
  ClusterSteps* empty = members[config.members]->cluster_steps();
  for (int round = 0; round < config.rounds; ++round) {
    absl::Status put = PutSpread(members, samples, config.members);
    if (put.ok()) {
      put = single_client.PutSamples("pool", samples).status();
    }
    if (!put.ok()) {
      std::fprintf(stderr, "rollpack bench cluster: PutSamples: %s\n", put.ToString().c_str());
      return 1;
    }
    const std::string step_id = absl::StrCat("bench-", round);
    v1::CreateStepRequest request;
    request.set_step_id(step_id);
    request.set_pool("pool");
    // Explicit ids in one order, so both plan the same sequence of samples
    // (num_samples takes the oldest first, and arrival orders differ).
    for (const v1::Sample& sample : samples) request.add_sample_ids(sample.sample_id());
    *request.mutable_topology() = topology;
    // Alternate which goes first: the machine's state drifts.
    const int64_t planned_before = planner->planning_bytes();
    for (int k = 0; k < 2; ++k) {
      const bool cluster_turn = (k + round) % 2 == 0;
      const absl::Time start = absl::Now();
      absl::StatusOr<v1::StepInfo> info =
          cluster_turn ? coordinator.CreateStep(request) : single_client.CreateStep(request);
      const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
      if (!info.ok()) {
        std::fprintf(stderr, "rollpack bench cluster: CreateStep (%s): %s\n",
                     cluster_turn ? "cluster" : "single", info.status().ToString().c_str());
        return 1;
      }
      (cluster_turn ? cluster_ms : single_ms).push_back(ms);
    }
    planning_bytes = planner->planning_bytes() - planned_before;
    absl::StatusOr<std::unique_ptr<EtcdClient>> reader =
        EtcdClient::Create({{(*etcd)->client_url()}});
    if (reader.ok()) {
      absl::StatusOr<std::optional<std::string>> record =
          (*reader)->Get(members[0]->cluster()->Key("steps", step_id));
      if (record.ok() && record->has_value()) record_bytes = static_cast<int64_t>((*record)->size());
    }
    const int64_t pulled_before = empty->pulled_bytes();
    absl::Time start = absl::Now();
    absl::StatusOr<std::vector<std::vector<std::string>>> want =
        FetchAll((*single)->address(), step_id, topology, config.fetch_threads);
    single_fetch_s.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    start = absl::Now();
    absl::StatusOr<std::vector<std::vector<std::string>>> got = FetchAll(
        members[config.members]->address(), step_id, topology, config.fetch_threads);
    cluster_fetch_s.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    if (!want.ok() || !got.ok()) {
      std::fprintf(stderr, "rollpack bench cluster: fetch: %s\n",
                   (!want.ok() ? want.status() : got.status()).ToString().c_str());
      return 1;
    }
    identical = identical && *want == *got;
    pulled_bytes = empty->pulled_bytes() - pulled_before;
    fetched_bytes = 0;
    for (const auto& rank : *got) {
      for (const std::string& mb : rank) fetched_bytes += static_cast<int64_t>(mb.size());
    }
    if (!coordinator.ReleaseStep(step_id).ok() || !single_client.ReleaseStep(step_id).ok()) {
      std::fprintf(stderr, "rollpack bench cluster: ReleaseStep failed\n");
      return 1;
    }
  }

  // The common case, num_samples (the oldest free samples cluster-wide):
  // no ids go to the members, each lists at most S of its oldest.
  std::vector<double> oldest_ms;
  int64_t oldest_planning_bytes = 0;
  for (int round = 0; round < config.rounds; ++round) {
    if (absl::Status put = PutSpread(members, samples, config.members); !put.ok()) {
      std::fprintf(stderr, "rollpack bench cluster: PutSamples: %s\n", put.ToString().c_str());
      return 1;
    }
    v1::CreateStepRequest request;
    request.set_step_id(absl::StrCat("oldest-", round));
    request.set_pool("pool");
    request.set_num_samples(config.samples);
    *request.mutable_topology() = topology;
    const int64_t planned_before = planner->planning_bytes();
    const absl::Time start = absl::Now();
    absl::StatusOr<v1::StepInfo> info = coordinator.CreateStep(request);
    oldest_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    oldest_planning_bytes = planner->planning_bytes() - planned_before;
    if (!info.ok() || !coordinator.ReleaseStep(request.step_id()).ok()) {
      std::fprintf(stderr, "rollpack bench cluster: CreateStep (oldest): %s\n",
                   info.status().ToString().c_str());
      return 1;
    }
  }

  const double single_create = Median(single_ms), cluster_create = Median(cluster_ms);
  const double per_sample = static_cast<double>(planning_bytes) / config.samples;
  std::printf("rollpack bench cluster: %d samples (median %.0f tokens) spread on %d members, "
              "dp=%d cp=%d, %d rounds (medians)\n\n",
              config.samples, config.median_length, config.members, config.dp, config.cp,
              config.rounds);
  std::printf("%-44s %14s\n", "measure", "value");
  std::printf("%-44s %14.1f\n", "CreateStep sample_ids, single server (ms)", single_create);
  std::printf("%-44s %14.1f\n", "CreateStep sample_ids, cluster (ms)", cluster_create);
  std::printf("%-44s %14.2f\n", "  cluster / single", cluster_create / single_create);
  std::printf("%-44s %14lld\n", "  bytes received/sent to plan (ids, holds)",
              static_cast<long long>(planning_bytes));
  std::printf("%-44s %14.1f\n", "  per sample", per_sample);
  std::printf("%-44s %14.1f\n", "CreateStep num_samples, cluster (ms)", Median(oldest_ms));
  std::printf("%-44s %14.2f\n", "  cluster / single sample_ids", Median(oldest_ms) / single_create);
  std::printf("%-44s %14.1f\n", "  bytes to plan per sample",
              static_cast<double>(oldest_planning_bytes) / config.samples);
  std::printf("%-44s %14lld\n", "etcd step record (bytes)", static_cast<long long>(record_bytes));
  std::printf("%-44s %14.2f\n", "fetch all ranks, single server (s)", Median(single_fetch_s));
  std::printf("%-44s %14.2f\n", "fetch all ranks, member holding none (s)",
              Median(cluster_fetch_s));
  std::printf("%-44s %14lld\n", "  bytes served", static_cast<long long>(fetched_bytes));
  std::printf("%-44s %14lld\n", "  bytes it pulled from owners", static_cast<long long>(pulled_bytes));
  std::printf("%-44s %14s\n", "every rank's bytes equal the single server's",
              identical ? "yes" : "NO");
  std::printf(
      "\nJSON:\n%s\n",
      absl::StrFormat(
          "{\"members\": %d, \"samples\": %d, \"rounds\": %d, \"create_single_ms\": %.2f, "
          "\"create_cluster_ms\": %.2f, \"create_ratio\": %.3f, \"planning_bytes\": %d, "
          "\"planning_bytes_per_sample\": %.2f, \"create_oldest_cluster_ms\": %.2f, "
          "\"oldest_planning_bytes_per_sample\": %.2f, \"step_record_bytes\": %d, "
          "\"fetch_single_s\": %.3f, \"fetch_cluster_s\": %.3f, \"fetched_bytes\": %d, "
          "\"pulled_bytes\": %d, \"identical\": %s}",
          config.members, config.samples, config.rounds, single_create, cluster_create,
          cluster_create / single_create, planning_bytes, per_sample, Median(oldest_ms),
          static_cast<double>(oldest_planning_bytes) / config.samples, record_bytes,
          Median(single_fetch_s), Median(cluster_fetch_s), fetched_bytes, pulled_bytes,
          identical ? "true" : "false")
          .c_str());
  return identical ? 0 : 1;
}

}  // namespace rollpack
