#include "scheduler/plan_report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "scheduler/plan_stats.h"

namespace rollpack {
namespace {

double Tok(int64_t l) { return static_cast<double>(l); }
double Attn(int64_t l) { return static_cast<double>(l) * l; }
double Flops(int64_t l) { return 24576.0 * l + static_cast<double>(l) * l; }

}  // namespace

PlanReport ReportPlan(const Plan& plan, absl::Span<const int64_t> lengths,
                      const Topology& topology) {
  PlanReport r;
  r.tok = ComputePlanStats(plan, lengths, topology, Tok);
  r.attn = ComputePlanStats(plan, lengths, topology, Attn);
  r.flops = ComputePlanStats(plan, lengths, topology, Flops);
  return r;
}

std::string FormatReport(const PlanReport& r) {
  std::string out;
  absl::StrAppendFormat(&out, "%-22s %12s\n", "plan_ms", absl::StrFormat("%.2f", r.tok.plan_ms));
  absl::StrAppendFormat(&out, "%-22s %12d (lower bound %d)\n", "n_mb",
                        r.tok.num_microbatches, r.tok.min_microbatches);
  absl::StrAppendFormat(&out, "%-22s %12.4f\n", "peak", r.tok.peak);
  absl::StrAppendFormat(&out, "%-22s %11.3f%%\n", "padding",
                        100.0 * r.tok.padding_overhead);
  absl::StrAppendFormat(&out, "%-22s %12s %12s %12s\n", "", "tok", "attn", "flops");
  absl::StrAppendFormat(&out, "%-22s %12.4f %12.4f %12.4f\n", "rank_imb",
                        r.tok.rank_imbalance, r.attn.rank_imbalance,
                        r.flops.rank_imbalance);
  absl::StrAppendFormat(&out, "%-22s %12.4f %12.4f %12.4f\n", "sync", r.tok.sync,
                        r.attn.sync, r.flops.sync);
  return out;
}

std::string PlanToJson(const Plan& plan, absl::Span<const int64_t> lengths,
                       const Topology& topology, const PlanReport& report) {
  const int r = plan.num_dpcp_ranks;
  std::vector<int64_t> padded(lengths.size(), 0);
  std::string groups = "[";
  std::string cp_groups = "[";
  for (size_t m = 0; m < plan.microbatches.size(); ++m) {
    std::vector<std::vector<int>> per_rank(r);
    std::vector<std::string> gs;
    for (const PlanGroup& g : plan.microbatches[m].groups) {
      gs.push_back(absl::StrCat("[", g.first_rank, ",", g.cp_size, "]"));
      for (size_t k = 0; k < g.sequences.size(); ++k) {
        padded[g.sequences[k]] = g.padded_lengths[k];
        for (int q = g.first_rank; q < g.first_rank + g.cp_size && q < r; ++q) {
          per_rank[q].push_back(g.sequences[k]);
        }
      }
    }
    if (m > 0) {
      groups += ",";
      cp_groups += ",";
    }
    groups += "[";
    for (int q = 0; q < r; ++q) {
      if (q > 0) groups += ",";
      absl::StrAppend(&groups, "[", absl::StrJoin(per_rank[q], ","), "]");
    }
    groups += "]";
    absl::StrAppend(&cp_groups, "[", absl::StrJoin(gs, ","), "]");
  }
  groups += "]";
  cp_groups += "]";
  auto stats = [](const PlanStats& s) {
    return absl::StrFormat(R"({"rank_imb":%.6f,"sync":%.6f})", s.rank_imbalance,
                           s.sync);
  };
  return absl::StrCat(
      "{", absl::StrFormat(R"("plan_ms":%.3f,)", report.tok.plan_ms),
      R"("scheduler":")",
      topology.scheduler == SchedulerKind::kStaticCp ? "static_cp" : "dynamic_cp",
      R"(",)", R"("dp":)", topology.dp, R"(,"cp":)", topology.cp,
      R"(,"max_tokens_per_rank":)", topology.max_tokens_per_rank,
      R"(,"num_samples":)", lengths.size(), R"(,"n_mb":)",
      report.tok.num_microbatches, R"(,"n_mb_lower_bound":)",
      report.tok.min_microbatches,
      absl::StrFormat(R"(,"peak":%.6f,"padding_overhead":%.6f)",
                      report.tok.peak, report.tok.padding_overhead),
      R"(,"tok":)", stats(report.tok), R"(,"attn":)", stats(report.attn),
      R"(,"flops":)", stats(report.flops), R"(,"padded_lengths":[)",
      absl::StrJoin(padded, ","), R"(],"cp_groups":)", cp_groups,
      R"(,"groups":)", groups, "}\n");
}

std::string PlanToSvg(const Plan& plan, const Topology& topology) {
  const int r = plan.num_dpcp_ranks;
  const int n_mb = static_cast<int>(plan.microbatches.size());
  const int cw = std::max(2, std::min(24, 1600 / std::max(n_mb, 1)));
  const int ch = std::max(2, std::min(24, 800 / std::max(r, 1)));
  double max_work = 0;
  for (const PlanMicrobatch& mb : plan.microbatches) {
    for (const PlanGroup& g : mb.groups) {
      double w = 0;
      for (int64_t p : g.padded_lengths) w += Attn(p);
      max_work = std::max(max_work, w / g.cp_size);
    }
  }
  const int left = 60, top = 30;
  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\">\n"
      "<text x=\"4\" y=\"18\" font-size=\"12\">ranks (rows, DPxCP order) x "
      "micro-batches (columns); colour = attention work per rank, darker = "
      "more</text>\n",
      left + n_mb * cw + 10, top + r * ch + 10);
  for (int q = 0; q < r; q += std::max(1, r / 16)) {
    absl::StrAppendFormat(&out,
                          "<text x=\"4\" y=\"%d\" font-size=\"10\">%d</text>\n",
                          top + q * ch + ch, q);
  }
  for (int m = 0; m < n_mb; ++m) {
    for (const PlanGroup& g : plan.microbatches[m].groups) {
      double w = 0;
      for (int64_t p : g.padded_lengths) w += Attn(p);
      w /= g.cp_size;
      const double f = max_work > 0 ? w / max_work : 0;
      const int shade = static_cast<int>(235 - 200 * f);
      absl::StrAppendFormat(
          &out,
          "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
          "fill=\"rgb(%d,%d,255)\" stroke=\"white\" stroke-width=\"0.5\">"
          "<title>mb %d ranks %d..%d: %d seqs, %d tokens/rank</title></rect>\n",
          left + m * cw, top + g.first_rank * ch, cw, g.cp_size * ch, shade,
          shade, m, g.first_rank, g.first_rank + g.cp_size - 1,
          g.sequences.size(), g.tokens_per_rank);
    }
  }
  out += "</svg>\n";
  return out;
}

}  // namespace rollpack
