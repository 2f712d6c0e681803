#include "cli/plan_command.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace rollpack {
namespace plan_cli {
namespace {

constexpr char kUsage[] =
    "usage: rollpack plan --lengths FILE --dp D --cp C [--tp T]\n"
    "         [--sequence-parallel | --no-sequence-parallel]\n"
    "         --max-tokens-per-rank N [--scheduler static_cp|dynamic_cp]\n"
    "         [--min-cp M] [--pad-multiple P] [--pp P] [--vpp V]\n"
    "         [--microbatch-group-size G] [--json] [--svg FILE]\n";

double Tok(int64_t l) { return static_cast<double>(l); }
double Attn(int64_t l) { return static_cast<double>(l) * l; }
double Flops(int64_t l) { return 24576.0 * l + static_cast<double>(l) * l; }

}  // namespace

absl::StatusOr<std::vector<int64_t>> ReadLengthsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::vector<int64_t> lengths;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    absl::string_view v = absl::StripAsciiWhitespace(line);
    if (v.empty() || v[0] == '#') continue;
    int64_t n = 0;
    if (!absl::SimpleAtoi(v, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": not an integer: '", v, "'"));
    }
    lengths.push_back(n);
  }
  return lengths;
}

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

}  // namespace plan_cli

int RunPlanCommand(int argc, char** argv) {
  using plan_cli::kUsage;
  std::string lengths_path, svg_path;
  bool json = false;
  Topology t;
  t.dp = 0;
  t.cp = 0;
  int64_t mgs = 0, min_cp = 0, pad_multiple = 0, vpp = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto next = [&](std::string* out) {
      if (has_value) {
        *out = value;
        return true;
      }
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    auto next_int = [&](int64_t* out) {
      std::string v;
      return next(&v) && absl::SimpleAtoi(v, out);
    };
    int64_t n = 0;
    bool ok = true;
    if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (arg == "--lengths") {
      ok = next(&lengths_path);
    } else if (arg == "--svg") {
      ok = next(&svg_path);
    } else if (arg == "--json") {
      json = true;
    } else if (arg == "--sequence-parallel") {
      t.sequence_parallel = !has_value || value == "true" || value == "1";
    } else if (arg == "--no-sequence-parallel") {
      t.sequence_parallel = false;
    } else if (arg == "--scheduler") {
      std::string v;
      ok = next(&v);
      if (v == "static_cp" || v == "static") {
        t.scheduler = SchedulerKind::kStaticCp;
      } else if (v == "dynamic_cp" || v == "dynamic") {
        t.scheduler = SchedulerKind::kDynamicCp;
      } else {
        std::cerr << "rollpack plan: unknown --scheduler '" << v << "'\n";
        return 2;
      }
    } else if (arg == "--dp" && (ok = next_int(&n))) {
      t.dp = static_cast<int>(n);
    } else if (arg == "--cp" && (ok = next_int(&n))) {
      t.cp = static_cast<int>(n);
    } else if (arg == "--tp" && (ok = next_int(&n))) {
      t.tp = static_cast<int>(n);
    } else if (arg == "--pp" && (ok = next_int(&n))) {
      t.pp = static_cast<int>(n);
    } else if (arg == "--vpp") {
      ok = next_int(&vpp);
    } else if (arg == "--max-tokens-per-rank") {
      ok = next_int(&t.max_tokens_per_rank);
    } else if (arg == "--min-cp") {
      ok = next_int(&min_cp);
    } else if (arg == "--pad-multiple") {
      ok = next_int(&pad_multiple);
    } else if (arg == "--microbatch-group-size") {
      ok = next_int(&mgs);
    } else if (arg == "--dp" || arg == "--cp" || arg == "--tp" || arg == "--pp") {
      ok = false;
    } else {
      std::cerr << "rollpack plan: unknown flag '" << argv[i] << "'\n" << kUsage;
      return 2;
    }
    if (!ok) {
      std::cerr << "rollpack plan: " << arg << " needs a valid value\n" << kUsage;
      return 2;
    }
  }
  if (lengths_path.empty() || t.max_tokens_per_rank <= 0) {
    std::cerr << "rollpack plan: --lengths and --max-tokens-per-rank are required\n"
              << kUsage;
    return 2;
  }
  // Wire defaults (layout.md section 1): 0 means 1, mgs 0 means pp with vpp.
  if (t.dp < 0 || t.cp < 0 || t.tp < 0 || t.pp < 0 || vpp < 0 || min_cp < 0 ||
      pad_multiple < 0 || mgs < 0) {
    std::cerr << "rollpack plan: sizes must not be negative\n";
    return 2;
  }
  t.dp = std::max(t.dp, 1);
  t.cp = std::max(t.cp, 1);
  t.tp = std::max(t.tp, 1);
  t.pp = std::max(t.pp, 1);
  t.vpp = static_cast<int>(std::max<int64_t>(vpp, 1));
  t.min_cp = static_cast<int>(std::max<int64_t>(min_cp, 1));
  t.pad_multiple = static_cast<int>(std::max<int64_t>(pad_multiple, 1));
  t.microbatch_group_size =
      mgs > 0 ? static_cast<int>(mgs) : (t.vpp > 1 ? t.pp : 1);

  absl::StatusOr<std::vector<int64_t>> lengths =
      plan_cli::ReadLengthsFile(lengths_path);
  if (!lengths.ok()) {
    std::cerr << "rollpack plan: " << lengths.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<Plan> plan = ComputePlan(*lengths, t);
  if (!plan.ok()) {
    std::cerr << "rollpack plan: " << plan.status() << "\n";
    return 1;
  }
  if (absl::Status s = ValidatePlan(*plan, *lengths, t); !s.ok()) {
    std::cerr << "rollpack plan: internal error, invalid plan: " << s << "\n";
    return 1;
  }
  const plan_cli::PlanReport report = plan_cli::ReportPlan(*plan, *lengths, t);
  if (json) {
    std::cout << plan_cli::PlanToJson(*plan, *lengths, t, report);
  } else {
    std::cout << plan_cli::FormatReport(report);
  }
  if (!svg_path.empty()) {
    std::ofstream svg(svg_path);
    svg << plan_cli::PlanToSvg(*plan, t);
    if (!svg) {
      std::cerr << "rollpack plan: cannot write " << svg_path << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace rollpack
