#include "cli/bench/step_scaling.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cli/bench/support.h"
#include "client/cpp/client.h"
#include "proto/wire/deterministic_bytes.h"
#include "server/server.h"

namespace rollpack {
namespace {

// The same ids every round (a released step's samples are gone), so every
// round's plan is the same bytes.
std::vector<v1::Sample> OneTokenSamples(int64_t n) {
  std::vector<v1::Sample> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    out[static_cast<size_t>(i)] =
        OneTokenSample(absl::StrCat("s", i), static_cast<int32_t>(i % 32000));
  }
  return out;
}

// FNV-1a of the plan as GetPlan sends it, less the step id and the time
// planning took: equal digests, the same plan byte for byte (between
// rounds, and between two builds run side by side).
uint64_t PlanDigest(v1::Plan plan) {
  plan.clear_step_id();
  plan.mutable_stats()->clear_plan_ms();
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : DeterministicBytes(plan)) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

struct Row {
  int64_t samples = 0;
  std::vector<double> create_ms, plan_ms, release_ms, ingest_s;
  int num_microbatches = 0;
  bool took_all = true;
  uint64_t digest = 0;
  bool same_plan = true;
};

void Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "rollpack bench lifecycle --scaling: %s: %s\n", what.c_str(),
               status.ToString().c_str());
}

}  // namespace

int RunStepScaling(const StepScalingConfig& config) {
  ServerOptions options;
  options.max_memory_bytes = int64_t{16} << 30;
  options.max_samples_per_step = 0;  // the point is steps of any size
  options.data_dir = config.data_dir;
  absl::StatusOr<std::unique_ptr<RollpackServer>> server = RollpackServer::Start(options);
  if (!server.ok()) {
    Fail("start", server.status());
    return 1;
  }
  RollpackClient client((*server)->address());
  v1::Topology topology;
  topology.set_dp(config.dp);
  topology.set_cp(config.cp);
  topology.set_max_tokens_per_rank(config.max_tokens_per_rank);
  topology.set_scheduler(config.dynamic_cp ? v1::DYNAMIC_CP : v1::STATIC_CP);

  std::vector<Row> rows;
  bool ok = true;
  for (int64_t n : config.samples) {
    Row row;
    row.samples = n;
    const std::string pool = absl::StrCat("scaling-", n);
    if (absl::Status s = client.RegisterModel(pool, BenchDenseModel()).status(); !s.ok()) {
      Fail("RegisterModel", s);
      return 1;
    }
    for (int round = 0; round < config.rounds; ++round) {
      {
        // Built and sent per round, so only one round's requests are held.
        const std::vector<v1::Sample> samples = OneTokenSamples(n);
        const absl::Time start = absl::Now();
        if (absl::Status s = client.PutSamples(pool, samples).status(); !s.ok()) {
          Fail(absl::StrCat("PutSamples of ", n), s);
          return 1;
        }
        row.ingest_s.push_back(absl::ToDoubleSeconds(absl::Now() - start));
      }
      v1::CreateStepRequest request;
      request.set_step_id(absl::StrCat(pool, "-", round));
      request.set_pool(pool);
      request.set_num_samples(static_cast<int32_t>(n));
      *request.mutable_topology() = topology;
      absl::Time start = absl::Now();
      absl::StatusOr<v1::StepInfo> info = client.CreateStep(request);
      row.create_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
      if (!info.ok()) {
        Fail(absl::StrCat("CreateStep of ", n), info.status());
        return 1;
      }
      row.plan_ms.push_back(info->stats().plan_ms());
      row.num_microbatches = info->num_microbatches();
      if (info->num_samples() != n) row.took_all = false;
      absl::StatusOr<v1::Plan> plan = client.GetPlan(request.step_id());
      if (!plan.ok()) {
        Fail("GetPlan", plan.status());
        return 1;
      }
      const uint64_t digest = PlanDigest(*std::move(plan));
      if (round > 0 && digest != row.digest) row.same_plan = false;
      row.digest = digest;
      start = absl::Now();
      if (absl::Status s = client.ReleaseStep(request.step_id()).status(); !s.ok()) {
        Fail("ReleaseStep", s);
        return 1;
      }
      row.release_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
    ok = ok && row.took_all && row.same_plan;
    rows.push_back(std::move(row));
  }
  (*server)->Shutdown();

  std::printf("rollpack bench lifecycle --scaling: one-token samples, one step of all of them, "
              "%s CP dp %d cp %d, max_tokens_per_rank %lld, %s, %d round(s) (medians)\n\n",
              config.dynamic_cp ? "dynamic" : "static", config.dp, config.cp,
              static_cast<long long>(config.max_tokens_per_rank),
              config.data_dir.empty() ? "in memory" : "durable", config.rounds);
  // "ns / (n log2 n)" stays flat when CreateStep grows n log n; "growth"
  // is the time ratio to the previous row over its size ratio (1 = linear).
  std::printf("%10s %8s %14s %10s %12s %10s %16s %8s  %s\n", "samples", "mbs", "CreateStep ms",
              "plan ms", "release ms", "ingest s", "ns / (n log2 n)", "growth", "plan digest");
  std::vector<std::string> json;
  double previous_ms = 0;
  int64_t previous_n = 0;
  for (const Row& row : rows) {
    const double create = Median(row.create_ms);
    const double n = static_cast<double>(row.samples);
    const double per = create * 1e6 / (n * std::max(1.0, std::log2(n)));
    const double growth =
        previous_n > 0 ? (create / previous_ms) / (n / static_cast<double>(previous_n)) : 0;
    const std::string digest = absl::StrFormat("%016x", row.digest);
    std::printf("%10lld %8d %14.1f %10.1f %12.1f %10.2f %16.2f %8s  %s%s\n",
                static_cast<long long>(row.samples), row.num_microbatches, create,
                Median(row.plan_ms), Median(row.release_ms), Median(row.ingest_s), per,
                previous_n > 0 ? absl::StrFormat("%.2f", growth).c_str() : "-", digest.c_str(),
                row.same_plan ? "" : " (rounds differ)");
    json.push_back(absl::StrFormat(
        "{\"samples\": %d, \"microbatches\": %d, \"create_step_ms\": %.2f, \"plan_ms\": %.2f, "
        "\"release_ms\": %.2f, \"ingest_s\": %.3f, \"ns_per_n_log2_n\": %.3f, "
        "\"plan_digest\": \"%s\", \"same_plan_every_round\": %s}",
        row.samples, row.num_microbatches, create, Median(row.plan_ms), Median(row.release_ms),
        Median(row.ingest_s), per, digest, row.same_plan ? "true" : "false"));
    previous_ms = create;
    previous_n = row.samples;
  }
  std::printf("%-48s %s\n", "every step took all its samples, the same plan", ok ? "yes" : "NO");
  std::printf("\nJSON:\n{\"bench\": \"lifecycle_scaling\", \"scheduler\": \"%s\", \"dp\": %d, "
              "\"cp\": %d, \"max_tokens_per_rank\": %lld, \"durable\": %s, \"rounds\": %d, "
              "\"rows\": [%s], \"ok\": %s}\n",
              config.dynamic_cp ? "dynamic_cp" : "static_cp", config.dp, config.cp,
              static_cast<long long>(config.max_tokens_per_rank),
              config.data_dir.empty() ? "false" : "true", config.rounds,
              absl::StrJoin(json, ", ").c_str(), ok ? "true" : "false");
  return ok ? 0 : 1;
}

}  // namespace rollpack
