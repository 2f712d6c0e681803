// Scheduler benchmark: a plain program (not a timed test) that plans the
// issue's cases on ../shared/bench/*.txt and prints a table and JSON.
//
//   plan_bench BENCH_DIR [--repeats N] [--case SUBSTRING]
//
// Quality numbers use the statistics of `rollpack plan` (tok, attn, flops).
// Rows labelled "reimpl." are this program's own re-implementations of simple
// published baselines, not the peers' code.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "scheduler/lengths_file.h"
#include "scheduler/plan_report.h"
#include "scheduler/plan.h"
#include "scheduler/plan_validation.h"
#include "scheduler/planner.h"
#include "scheduler/topology.h"

namespace rollpack {
namespace {

struct Case {
  std::string name;
  std::string file;  // empty: synthetic
  int dp, cp;
  int64_t t;
  SchedulerKind kind;
  int synthetic_n = 0;
};

struct Row {
  std::string case_name, method;
  int n_mb = 0, bound = 0;
  double imb_flops = 0, imb_attn = 0, sync_attn = 0, sync_flops = 0, peak = 0;
  double ms = 0;
  bool valid = false;
};

// Lognormal(median 3000, sigma 0.9) clipped to [100, 32768], fixed seed.
std::vector<int64_t> Synthetic(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> out(n);
  for (int i = 0; i < n; ++i) {
    // Box-Muller from two uniform doubles (portable across libstdc++).
    const double u1 = (static_cast<double>(rng() >> 11) + 0.5) / 9007199254740992.0;
    const double u2 = (static_cast<double>(rng() >> 11) + 0.5) / 9007199254740992.0;
    const double z = std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
    const double l = std::exp(std::log(3000.0) + 0.9 * z);
    out[i] = std::clamp<int64_t>(std::llround(l), 100, 32768);
  }
  return out;
}

Row Measure(const std::string& case_name, const std::string& method,
            const Plan& plan, absl::Span<const int64_t> lengths,
            const Topology& t, double ms, bool valid) {
  const PlanReport r = ReportPlan(plan, lengths, t);
  Row row;
  row.case_name = case_name;
  row.method = method;
  row.n_mb = r.tok.num_microbatches;
  row.bound = r.tok.min_microbatches;
  row.imb_flops = r.flops.rank_imbalance;
  row.imb_attn = r.attn.rank_imbalance;
  row.sync_attn = r.attn.sync;
  row.sync_flops = r.flops.sync;
  row.peak = r.tok.peak;
  row.ms = ms;
  row.valid = valid;
  return row;
}

// Baseline (reimpl.): next-fit in loader order into groups of cp*T padded
// tokens, groups dealt to the dp replicas round-robin, micro-batch count =
// the largest replica's (Megatron-style dp_balanced, as described in the
// issue). Replicas with fewer groups get empty trailing micro-batches.
Plan NextFitLoaderOrder(absl::Span<const int64_t> lengths, const Topology& t) {
  std::vector<PlanGroup> bins;
  const int64_t cap = int64_t{t.cp} * t.max_tokens_per_rank;
  PlanGroup cur;
  int64_t used = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t p = PaddedLength(t, lengths[i], t.cp);
    if (used + p > cap && !cur.sequences.empty()) {
      bins.push_back(cur);
      cur = PlanGroup();
      used = 0;
    }
    cur.sequences.push_back(static_cast<int>(i));
    cur.padded_lengths.push_back(p);
    used += p;
  }
  if (!cur.sequences.empty()) bins.push_back(cur);
  Plan plan;
  plan.num_dpcp_ranks = t.dp * t.cp;
  const int n_mb = static_cast<int>((bins.size() + t.dp - 1) / t.dp);
  plan.microbatches.resize(n_mb);
  for (int m = 0; m < n_mb; ++m) {
    for (int d = 0; d < t.dp; ++d) {
      const size_t b = static_cast<size_t>(m) * t.dp + d;
      PlanGroup g = b < bins.size() ? bins[b] : PlanGroup();
      g.first_rank = d * t.cp;
      g.cp_size = t.cp;
      plan.microbatches[m].groups.push_back(g);
    }
  }
  return plan;
}

// Baseline (reimpl.): first-fit decreasing into groups of cp*T padded
// tokens, then groups to replicas by LPT on L^2 work (Karmarkar-Karp-like
// greedy), each replica's groups in creation order.
Plan FfdLpt(absl::Span<const int64_t> lengths, const Topology& t) {
  std::vector<int> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return lengths[a] > lengths[b]; });
  const int64_t cap = int64_t{t.cp} * t.max_tokens_per_rank;
  std::vector<PlanGroup> bins;
  std::vector<int64_t> used;
  for (int i : order) {
    const int64_t p = PaddedLength(t, lengths[i], t.cp);
    size_t b = 0;
    while (b < bins.size() && used[b] + p > cap) ++b;
    if (b == bins.size()) {
      bins.emplace_back();
      used.push_back(0);
    }
    bins[b].sequences.push_back(i);
    bins[b].padded_lengths.push_back(p);
    used[b] += p;
  }
  std::vector<double> work(bins.size(), 0);
  for (size_t b = 0; b < bins.size(); ++b) {
    for (int64_t p : bins[b].padded_lengths) work[b] += double(p) * p;
  }
  std::vector<int> border(bins.size());
  std::iota(border.begin(), border.end(), 0);
  std::stable_sort(border.begin(), border.end(),
                   [&](int a, int b) { return work[a] > work[b]; });
  std::vector<std::vector<int>> per_replica(t.dp);
  std::vector<double> total(t.dp, 0);
  for (int b : border) {
    const int d = std::min_element(total.begin(), total.end()) - total.begin();
    per_replica[d].push_back(b);
    total[d] += work[b];
  }
  size_t n_mb = 0;
  for (auto& r : per_replica) {
    std::sort(r.begin(), r.end());
    n_mb = std::max(n_mb, r.size());
  }
  Plan plan;
  plan.num_dpcp_ranks = t.dp * t.cp;
  plan.microbatches.resize(n_mb);
  for (size_t m = 0; m < n_mb; ++m) {
    for (int d = 0; d < t.dp; ++d) {
      PlanGroup g = m < per_replica[d].size() ? bins[per_replica[d][m]] : PlanGroup();
      g.first_rank = d * t.cp;
      g.cp_size = t.cp;
      plan.microbatches[m].groups.push_back(g);
    }
  }
  return plan;
}

// Whether the baselines above pack for `kind`: they form fixed groups of cp
// ranks, so there is nothing of theirs to set beside a dynamic CP plan.
bool HasBaselines(SchedulerKind kind) {
  switch (kind) {
    case SchedulerKind::kStaticCp:
      return true;
    case SchedulerKind::kDynamicCp:
      return false;
  }
  return false;
}

long MaxRssKb() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

}  // namespace
}  // namespace rollpack

int main(int argc, char** argv) {
  using namespace rollpack;
  if (argc < 2) {
    std::cerr << "usage: plan_bench BENCH_DIR [--repeats N] [--case SUBSTRING]\n";
    return 2;
  }
  const std::string dir = argv[1];
  int repeats = 5;
  std::string only;
  for (int i = 2; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--repeats") repeats = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--case") only = argv[i + 1];
  }
  const std::vector<Case> cases = {
      {"static dp8 cp2 T16k lognormal", "lognormal_8k.txt", 8, 2, 16384, SchedulerKind::kStaticCp},
      {"dynamic dp8 cp2 T16k lognormal", "lognormal_8k.txt", 8, 2, 16384, SchedulerKind::kDynamicCp},
      {"dynamic dp32 cp1 T32k lognormal", "lognormal_8k.txt", 32, 1, 32768, SchedulerKind::kDynamicCp},
      {"static dp8 cp2 T16k rltrunc", "rltrunc_8k.txt", 8, 2, 16384, SchedulerKind::kStaticCp},
      {"dynamic dp8 cp2 T16k rltrunc", "rltrunc_8k.txt", 8, 2, 16384, SchedulerKind::kDynamicCp},
      {"dynamic dp32 cp1 T32k rltrunc", "rltrunc_8k.txt", 32, 1, 32768, SchedulerKind::kDynamicCp},
      {"scale static 64k dp512 cp2 T16k", "", 512, 2, 16384, SchedulerKind::kStaticCp, 65536},
      {"scale dynamic 64k dp512 cp2 T16k", "", 512, 2, 16384, SchedulerKind::kDynamicCp, 65536},
  };
  std::vector<Row> rows;
  bool all_valid = true;
  long scale_rss_kb = 0;
  for (const Case& c : cases) {
    if (!only.empty() && c.name.find(only) == std::string::npos) continue;
    std::vector<int64_t> lengths;
    if (c.file.empty()) {
      lengths = Synthetic(c.synthetic_n, 20261121);
    } else {
      absl::StatusOr<std::vector<int64_t>> l =
          ReadLengthsFile(dir + "/" + c.file);
      if (!l.ok()) {
        std::cerr << l.status() << "\n";
        return 1;
      }
      lengths = *std::move(l);
    }
    Topology t;
    t.dp = c.dp;
    t.cp = c.cp;
    t.max_tokens_per_rank = c.t;
    t.scheduler = c.kind;
    const long rss_before = MaxRssKb();
    std::vector<double> times;
    absl::StatusOr<Plan> plan;
    for (int k = 0; k < std::max(repeats, 1); ++k) {
      plan = ComputePlan(lengths, t);
      if (!plan.ok()) break;
      times.push_back(plan->stats.plan_ms);
    }
    if (!plan.ok()) {
      std::cerr << c.name << ": " << plan.status() << "\n";
      return 1;
    }
    if (c.file.empty()) scale_rss_kb = std::max(scale_rss_kb, MaxRssKb() - rss_before);
    std::sort(times.begin(), times.end());
    const bool valid = ValidatePlan(*plan, lengths, t).ok();
    all_valid = all_valid && valid;
    rows.push_back(Measure(c.name, "rollpack", *plan, lengths, t,
                           times[times.size() / 2], valid));
    if (HasBaselines(c.kind) && !c.file.empty()) {
      auto time_it = [&](auto fn) {
        const auto s = std::chrono::steady_clock::now();
        Plan p = fn(lengths, t);
        const double ms = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - s).count();
        return std::make_pair(std::move(p), ms);
      };
      auto [nf, nf_ms] = time_it(NextFitLoaderOrder);
      rows.push_back(Measure(c.name, "next-fit loader order (reimpl.)", nf,
                             lengths, t, nf_ms, false));
      auto [ffd, ffd_ms] = time_it(FfdLpt);
      rows.push_back(Measure(c.name, "FFD + LPT (reimpl.)", ffd, lengths, t,
                             ffd_ms, false));
    }
  }
  std::printf("%-34s %-32s %5s %5s %9s %9s %9s %9s %6s %9s %5s\n", "case",
              "method", "n_mb", "bound", "imb_flops", "imb_attn", "sync_attn",
              "sync_flop", "peak", "plan_ms", "valid");
  for (const Row& r : rows) {
    std::printf("%-34s %-32s %5d %5d %9.4f %9.4f %9.4f %9.4f %6.3f %9.2f %5s\n",
                r.case_name.c_str(), r.method.c_str(), r.n_mb, r.bound,
                r.imb_flops, r.imb_attn, r.sync_attn, r.sync_flops, r.peak,
                r.ms, r.method == "rollpack" ? (r.valid ? "yes" : "NO") : "-");
  }
  std::printf("scale cases: peak RSS growth %.1f MB (process max RSS %.1f MB)\n",
              scale_rss_kb / 1024.0, MaxRssKb() / 1024.0);
  std::string json = "{\"rows\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    absl::StrAppendFormat(
        &json,
        "%s{\"case\":\"%s\",\"method\":\"%s\",\"n_mb\":%d,\"n_mb_bound\":%d,"
        "\"rank_imb_flops\":%.6f,\"rank_imb_attn\":%.6f,\"sync_attn\":%.6f,"
        "\"sync_flops\":%.6f,\"peak\":%.6f,\"plan_ms\":%.3f}",
        i ? "," : "", r.case_name, r.method, r.n_mb, r.bound, r.imb_flops,
        r.imb_attn, r.sync_attn, r.sync_flops, r.peak, r.ms);
  }
  absl::StrAppendFormat(&json, "],\"scale_rss_growth_mb\":%.1f,\"max_rss_mb\":%.1f}",
                        scale_rss_kb / 1024.0, MaxRssKb() / 1024.0);
  std::printf("%s\n", json.c_str());
  return all_valid ? 0 : 1;
}
