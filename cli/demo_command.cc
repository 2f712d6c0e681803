#include "cli/demo_command.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/flags.h"
#include "client/cpp/client.h"
#include "testing/reference_layout.h"
#include "testing/synthetic_rollouts.h"
#include "client/cpp/trainer_stream.h"
#include "server/server.h"
#include "server/store/convert.h"

namespace rollpack {
namespace {

struct DemoConfig {
  std::string server;  // empty: embedded server on 127.0.0.1:0
  int num_samples = 384;
  int dp = 4, cp = 2, tp = 2, pp = 2;
  int64_t max_tokens_per_rank = 8192;
  bool dynamic_cp = false;
  uint64_t seed = 2026;
};

struct RankResult {
  v1::RankCoords rank;
  int microbatches = 0;
  int64_t bytes = 0;
  int64_t max_tokens = 0;
  double work = 0;
  absl::Status status;
};

v1::ModelSpec Qwen3MoeLikeModel() {
  v1::ModelSpec model;
  model.set_name("Qwen3-30B-A3B");
  model.set_num_layers(48);
  model.set_num_experts(128);
  model.set_topk(8);
  return model;
}

}  // namespace

int RunDemoCommand(int argc, char** argv) {
  DemoConfig config;
  FlagSet flags("rollpack demo",
                "End-to-end run of a training step on an embedded rollpackd (or --server): "
                "ingests synthetic Qwen3-30B-A3B-like rollouts, plans a dp4 cp2 tp2 pp2 step, "
                "fetches every rank's micro-batches concurrently and checks each against an "
                "independent reference. Exits 0 only if every rank's bytes match.");
  flags.String("server", &config.server,
               "HOST:PORT of a running rollpackd; empty: an embedded server on 127.0.0.1.");
  flags.Int("samples", &config.num_samples, "Synthetic rollouts to ingest.").Min(1);
  flags.Uint64("seed", &config.seed, "Seed of the synthetic rollouts; also names the pool.");
  flags.Bool("dynamic-cp", &config.dynamic_cp, "Plan with the dynamic CP scheduler.");
  if (ParseResult r = flags.Parse(argc, argv); r.should_exit()) return r.exit_code();

  std::unique_ptr<RollpackServer> embedded;
  std::string address = config.server;
  if (address.empty()) {
    absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start({});
    if (!server.ok()) {
      std::fprintf(stderr, "demo: %s\n", server.status().ToString().c_str());
      return 1;
    }
    embedded = *std::move(server);
    address = embedded->address();
  }
  RollpackClient client(MakeChannel(address));
  const v1::ModelSpec model = Qwen3MoeLikeModel();
  const std::string pool = absl::StrCat("demo-", config.seed);
  std::printf("rollpack demo: server %s%s, model %s (%d layers, %d experts, top-%d)\n",
              address.c_str(), embedded ? " (embedded)" : "", model.name().c_str(),
              model.num_layers(), model.num_experts(), model.topk());
  if (absl::StatusOr<bool> r = client.RegisterModel(pool, model); !r.ok()) {
    std::fprintf(stderr, "demo: RegisterModel: %s\n", r.status().ToString().c_str());
    return 1;
  }

  SyntheticOptions synth;
  synth.num_samples = config.num_samples;
  synth.seed = config.seed;
  synth.max_length = 2 * config.max_tokens_per_rank;
  const std::vector<v1::Sample> samples = MakeSyntheticRollouts(model, synth);
  int64_t payload_bytes = 0, num_tokens = 0;
  for (const v1::Sample& s : samples) {
    payload_bytes += static_cast<int64_t>(s.ByteSizeLong());
    num_tokens += s.tokens().shape(0);
  }
  absl::Time t0 = absl::Now();
  absl::StatusOr<v1::PutSamplesResponse> put = client.PutSamples(pool, samples);
  const double put_s = absl::ToDoubleSeconds(absl::Now() - t0);
  if (!put.ok()) {
    std::fprintf(stderr, "demo: PutSamples: %s\n", put.status().ToString().c_str());
    return 1;
  }
  std::printf("ingest: %lld samples, %lld tokens, %.1f MB on the wire in %.3f s (%.0f MB/s), "
              "%.1f MB stored\n",
              static_cast<long long>(put->accepted()), static_cast<long long>(num_tokens),
              payload_bytes / 1e6, put_s, payload_bytes / 1e6 / put_s, put->stored_bytes() / 1e6);

  v1::CreateStepRequest create;
  create.set_step_id(absl::StrCat("step-", config.seed));
  create.set_pool(pool);
  create.set_num_samples(config.num_samples);
  v1::Topology* topo = create.mutable_topology();
  topo->set_dp(config.dp);
  topo->set_cp(config.cp);
  topo->set_tp(config.tp);
  topo->set_pp(config.pp);
  topo->set_sequence_parallel(true);
  topo->set_max_tokens_per_rank(config.max_tokens_per_rank);
  const SchedulerKind scheduler =
      config.dynamic_cp ? SchedulerKind::kDynamicCp : SchedulerKind::kStaticCp;
  topo->set_scheduler(ToProto(scheduler));
  absl::StatusOr<v1::StepInfo> step = client.CreateStep(create);
  if (!step.ok()) {
    std::fprintf(stderr, "demo: CreateStep: %s\n", step.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<v1::Plan> plan = client.GetPlan(create.step_id());
  if (!plan.ok()) {
    std::fprintf(stderr, "demo: GetPlan: %s\n", plan.status().ToString().c_str());
    return 1;
  }
  const v1::PlanStats& stats = step->stats();
  std::printf("plan: dp=%d cp=%d tp=%d pp=%d T=%lld %s: %d micro-batches (bound %d), "
              "rank_imb %.4f, sync %.4f, peak %.3f, padding %.2f%%, %.2f ms\n",
              config.dp, config.cp, config.tp, config.pp,
              static_cast<long long>(config.max_tokens_per_rank),
              std::string(TraitsOf(scheduler).name).c_str(), stats.num_microbatches(),
              stats.min_microbatches(), stats.rank_imbalance(), stats.sync(), stats.peak(),
              100 * stats.padding_overhead(), stats.plan_ms());

  std::map<std::string, const v1::Sample*> by_id;
  for (const v1::Sample& s : samples) by_id[s.sample_id()] = &s;
  std::vector<RankResult> results;
  for (int d = 0; d < config.dp; ++d)
    for (int c = 0; c < config.cp; ++c)
      for (int t = 0; t < config.tp; ++t)
        for (int p = 0; p < config.pp; ++p) {
          RankResult r;
          r.rank.set_dp(d);
          r.rank.set_cp(c);
          r.rank.set_tp(t);
          r.rank.set_pp(p);
          results.push_back(r);
        }

  t0 = absl::Now();
  std::vector<std::thread> threads;
  for (RankResult& r : results) {
    threads.emplace_back([&, &r = r] {
      TrainerStream stream(client.channel(), create.step_id(), r.rank);
      while (true) {
        absl::StatusOr<std::optional<v1::Microbatch>> next = stream.Next();
        if (!next.ok()) {
          r.status = next.status();
          return;
        }
        if (!next->has_value()) return;
        const v1::Microbatch& mb = **next;
        r.bytes += static_cast<int64_t>(mb.ByteSizeLong());
        r.work += mb.workload();
        r.max_tokens = std::max<int64_t>(r.max_tokens, mb.cu_seqlens_padded().shape(0) > 0
                                                           ? (*reinterpret_cast<const int32_t*>(
                                                                  mb.cu_seqlens_padded().data().data() +
                                                                  mb.cu_seqlens_padded().data().size() - 4)) /
                                                                 mb.local_cp_size()
                                                           : 0);
        absl::StatusOr<ExpectedMicrobatch> want =
            ReferenceMicrobatch(*plan, model, by_id, r.rank, mb.index());
        absl::Status check = want.ok() ? CheckMicrobatch(mb, *want, plan->topology(), r.rank,
                                                         model, /*all_fields=*/false)
                                       : want.status();
        if (!check.ok() && r.status.ok()) r.status = check;
        ++r.microbatches;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double fetch_s = absl::ToDoubleSeconds(absl::Now() - t0);

  int failures = 0;
  int64_t total_bytes = 0;
  std::printf("\n%-16s %6s %10s %12s %12s  %s\n", "rank(dp,cp,tp,pp)", "mbs", "max_tok", "bytes",
              "work", "check");
  for (const RankResult& r : results) {
    total_bytes += r.bytes;
    const bool ok = r.status.ok() && r.microbatches == stats.num_microbatches();
    failures += ok ? 0 : 1;
    std::printf("(%d,%d,%d,%d)%8s %6d %10lld %12lld %12.4g  %s\n", r.rank.dp(), r.rank.cp(),
                r.rank.tp(), r.rank.pp(), "", r.microbatches, static_cast<long long>(r.max_tokens),
                static_cast<long long>(r.bytes), r.work,
                ok ? "ok" : (r.status.ok() ? "wrong count" : std::string(r.status.message()).c_str()));
  }
  std::printf("\nfetch: %zu ranks concurrently, %.1f MB in %.3f s (%.0f MB/s, verification "
              "included)\n",
              results.size(), total_bytes / 1e6, fetch_s, total_bytes / 1e6 / fetch_s);

  absl::StatusOr<v1::ReleaseStepResponse> released = client.ReleaseStep(create.step_id());
  if (!released.ok()) {
    std::fprintf(stderr, "demo: ReleaseStep: %s\n", released.status().ToString().c_str());
    return 1;
  }
  std::printf("release: %d samples, %.1f MB freed\n", released->released_samples(),
              released->freed_bytes() / 1e6);
  if (embedded) embedded->Shutdown();
  if (failures > 0) {
    std::printf("demo: FAILED on %d of %zu ranks\n", failures, results.size());
    return 1;
  }
  std::printf("demo: all %zu ranks received exactly their bytes\n", results.size());
  return 0;
}

}  // namespace rollpack
