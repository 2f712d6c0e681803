#include "scheduler/plan_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "scheduler/plan_stats.h"
#include "scheduler/scheduler_kind.h"

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
      TraitsOf(topology.scheduler).name,
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

namespace {

// 1234567 -> "1.23M": scale labels stay short.
std::string ShortNumber(double v) {
  const char* suffix[] = {"", "k", "M", "G", "T", "P"};
  int i = 0;
  while (std::abs(v) >= 1000 && i < 5) {
    v /= 1000;
    ++i;
  }
  return absl::StrFormat("%.3g%s", v, suffix[i]);
}

// Light (little work) to dark blue (the most), as the cells are drawn.
std::string Shade(double fraction) {
  const int shade = static_cast<int>(235 - 200 * std::clamp(fraction, 0.0, 1.0));
  return absl::StrFormat("rgb(%d,%d,255)", shade, shade);
}

// A tick every 1, 2, 5, 10, 20, 50, ... so that [0, n) has at most about
// `max_ticks` labels.
int TickStep(int n, int max_ticks) {
  for (int base = 1;; base *= 10) {
    for (int m : {1, 2, 5}) {
      if (static_cast<int64_t>(base) * m * max_ticks >= n) return base * m;
    }
  }
}

}  // namespace

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
  // Grid at (left, top); axis labels left of and below it; the legend (a
  // colour bar with its scale) under the x axis.
  const int left = 70, top = 40;
  const int grid_w = n_mb * cw, grid_h = r * ch;
  const int legend_top = top + grid_h + 48;
  const int width = std::max(left + grid_w + 20, 560);
  const int height = legend_top + 52;
  std::string out = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"sans-serif\">\n"
      "<text x=\"4\" y=\"16\" font-size=\"13\">Plan: %d micro-batches on %d DPxCP ranks "
      "(dp %d, cp %d, %s); each cell is a rank's share of one micro-batch</text>\n",
      width, height, n_mb, r, topology.dp, topology.cp,
      std::string(TraitsOf(topology.scheduler).title));
  // Frame, so ranks left idle in a micro-batch (no cell) read as such.
  absl::StrAppendFormat(&out,
                        "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#f4f4f4\" "
                        "stroke=\"#888\" stroke-width=\"1\"/>\n",
                        left, top, grid_w, grid_h);
  // y axis: rank ticks and title.
  const int rank_step = TickStep(r, 16);
  for (int q = 0; q < r; q += rank_step) {
    absl::StrAppendFormat(&out,
                          "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"end\">%d</text>\n",
                          left - 4, top + q * ch + std::min(ch, 10), q);
  }
  absl::StrAppendFormat(&out,
                        "<text x=\"14\" y=\"%d\" font-size=\"11\" "
                        "transform=\"rotate(-90 14 %d)\" text-anchor=\"middle\">DPxCP rank</text>\n",
                        top + grid_h / 2, top + grid_h / 2);
  // x axis: micro-batch ticks and title.
  const int mb_step = TickStep(n_mb, std::max(1, grid_w / 40));
  for (int m = 0; m < n_mb; m += mb_step) {
    absl::StrAppendFormat(&out,
                          "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">%d</text>\n",
                          left + m * cw + cw / 2, top + grid_h + 14, m);
  }
  absl::StrAppendFormat(&out,
                        "<text x=\"%d\" y=\"%d\" font-size=\"11\" text-anchor=\"middle\">"
                        "micro-batch</text>\n",
                        left + grid_w / 2, top + grid_h + 30);
  for (int m = 0; m < n_mb; ++m) {
    for (const PlanGroup& g : plan.microbatches[m].groups) {
      double w = 0;
      for (int64_t p : g.padded_lengths) w += Attn(p);
      w /= g.cp_size;
      absl::StrAppendFormat(
          &out,
          "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
          "fill=\"%s\" stroke=\"white\" stroke-width=\"0.5\">"
          "<title>mb %d ranks %d..%d: %d seqs, %d tokens/rank, attention work %s</title></rect>\n",
          left + m * cw, top + g.first_rank * ch, cw, g.cp_size * ch,
          Shade(max_work > 0 ? w / max_work : 0), m, g.first_rank,
          g.first_rank + g.cp_size - 1, g.sequences.size(), g.tokens_per_rank, ShortNumber(w));
    }
  }
  // Legend: the colour scale from no work to the plan's most, in units of
  // attention work (sum of padded length squared over the CP group's ranks).
  constexpr int kBarWidth = 240, kBarHeight = 12, kSteps = 24;
  absl::StrAppendFormat(&out,
                        "<text x=\"%d\" y=\"%d\" font-size=\"11\">attention work per rank "
                        "(sum of padded length&#178; / cp):</text>\n",
                        left, legend_top - 4);
  for (int i = 0; i < kSteps; ++i) {
    absl::StrAppendFormat(&out,
                          "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\"/>\n",
                          left + i * kBarWidth / kSteps, legend_top, kBarWidth / kSteps + 1,
                          kBarHeight, Shade((i + 0.5) / kSteps));
  }
  absl::StrAppendFormat(&out,
                        "<text x=\"%d\" y=\"%d\" font-size=\"10\">0</text>\n"
                        "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"middle\">%s</text>\n"
                        "<text x=\"%d\" y=\"%d\" font-size=\"10\" text-anchor=\"end\">%s</text>\n"
                        "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#f4f4f4\" "
                        "stroke=\"#888\"/>\n"
                        "<text x=\"%d\" y=\"%d\" font-size=\"10\">idle rank</text>\n",
                        left, legend_top + kBarHeight + 12, left + kBarWidth / 2,
                        legend_top + kBarHeight + 12, ShortNumber(max_work / 2), left + kBarWidth,
                        legend_top + kBarHeight + 12, ShortNumber(max_work),
                        left + kBarWidth + 30, legend_top, kBarHeight, kBarHeight,
                        left + kBarWidth + 30 + kBarHeight + 4, legend_top + kBarHeight - 2);
  out += "</svg>\n";
  return out;
}

}  // namespace rollpack
