#include "scheduler/layout.h"

#include <algorithm>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace rollpack {
namespace {

bool IsPowerOfTwo(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

// Appends the run [start, start + len) of padded sequence `ordinal`, split at
// its real length so every run is all real or all padding.
void EmitRuns(const GroupLayout& g, int ordinal, int64_t start, int64_t len,
              int64_t* row, std::vector<RowRun>* out) {
  const int64_t n = g.lengths[ordinal];
  const int64_t base = g.cu_seqlens_padded[ordinal];
  const int sequence = g.sequences[ordinal];
  const int64_t end = start + len;
  if (start < n) {
    const int64_t real_end = std::min(end, n);
    out->push_back(RowRun{ordinal, sequence, start, real_end - start, false,
                          base + start, *row});
    *row += real_end - start;
    start = real_end;
  }
  if (start < end) {
    out->push_back(
        RowRun{ordinal, sequence, start, end - start, true, base + start, *row});
    *row += end - start;
  }
}

}  // namespace

void AppendZigzagRuns(const GroupLayout& g, int local_cp_rank,
                      std::vector<RowRun>* out) {
  out->clear();
  const int64_t c = g.cp_size;
  const int64_t r = local_cp_rank;
  int64_t row = 0;
  for (int j = 0; j < static_cast<int>(g.sequences.size()); ++j) {
    const int64_t p = g.padded_lengths[j];
    if (c == 1) {
      EmitRuns(g, j, 0, p, &row, out);
      continue;
    }
    const int64_t h = p / (2 * c);
    const int64_t a = r * h;
    const int64_t b = (2 * c - 1 - r) * h;
    if (a + h == b) {  // the middle rank: both chunks are adjacent
      EmitRuns(g, j, a, 2 * h, &row, out);
    } else {
      EmitRuns(g, j, a, h, &row, out);
      EmitRuns(g, j, b, h, &row, out);
    }
  }
}

void SliceRuns(absl::Span<const RowRun> runs, int64_t begin, int64_t count,
               std::vector<RowRun>* out) {
  out->clear();
  const int64_t end = begin + count;
  // First run that ends after `begin`.
  auto it = std::upper_bound(
      runs.begin(), runs.end(), begin,
      [](int64_t row, const RowRun& run) { return row < run.output_row + run.length; });
  for (; it != runs.end() && it->output_row < end; ++it) {
    const int64_t lo = std::max(begin, it->output_row);
    const int64_t hi = std::min(end, it->output_row + it->length);
    if (hi <= lo) continue;
    const int64_t skip = lo - it->output_row;
    RowRun run = *it;
    run.source_pos += skip;
    run.stream_pos += skip;
    run.length = hi - lo;
    run.output_row = lo - begin;
    out->push_back(run);
  }
}

absl::StatusOr<StepLayout> StepLayout::Create(const Plan& plan,
                                              absl::Span<const int64_t> lengths,
                                              const Topology& t,
                                              const ModelSpec& model) {
  RETURN_IF_ERROR(ValidateTopologySizes(t));
  auto pipeline = PipelineLayers::Create(model, t);
  if (!pipeline.ok()) return pipeline.status();

  StepLayout out;
  out.topology_ = t;
  out.model_ = model;
  out.pipeline_ = *std::move(pipeline);
  out.lengths_.assign(lengths.begin(), lengths.end());
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layout: sequence ", i, " has length ", lengths[i], ", must be >= 1"));
    }
  }

  const int ranks = t.num_dpcp_ranks();
  if (plan.num_dpcp_ranks != ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan: num_dpcp_ranks is ", plan.num_dpcp_ranks,
                     ", topology has dp*cp = ", ranks));
  }
  const int num_mb = static_cast<int>(plan.microbatches.size());
  if (num_mb < 1 || num_mb % t.microbatch_group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "plan: ", num_mb, " micro-batches, must be a positive multiple of "
        "microbatch_group_size ", t.microbatch_group_size));
  }
  out.num_microbatches_ = num_mb;
  const int max_group = MaxCpGroupSize(t);
  std::vector<char> used(lengths.size(), 0);
  out.group_begin_.reserve(num_mb + 1);
  for (int m = 0; m < num_mb; ++m) {
    out.group_begin_.push_back(static_cast<int>(out.groups_.size()));
    const std::vector<PlanGroup>& groups = plan.microbatches[m].groups;
    int next_rank = 0;
    for (int gi = 0; gi < static_cast<int>(groups.size()); ++gi) {
      const PlanGroup& pg = groups[gi];
      const std::string where =
          absl::StrCat("plan: micro-batch ", m, " group ", gi, ": ");
      const int c = pg.cp_size;
      switch (t.scheduler) {
        case SchedulerKind::kStaticCp:
          if (c != t.cp) {
            return absl::InvalidArgumentError(absl::StrCat(
                where, "cp_size is ", c, ", static CP needs cp = ", t.cp));
          }
          break;
        case SchedulerKind::kDynamicCp:
          if (!IsPowerOfTwo(c) || c < t.min_cp || c > max_group) {
            return absl::InvalidArgumentError(absl::StrCat(
                where, "cp_size is ", c, ", must be a power of two in [min_cp = ",
                t.min_cp, ", ", max_group, "]"));
          }
          break;
      }
      if (pg.first_rank != next_rank || pg.first_rank % c != 0 ||
          pg.first_rank + c > ranks) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "first_rank is ", pg.first_rank, " (cp_size ", c,
            "), expected ", next_rank,
            "; groups must tile [0, dp*cp = ", ranks,
            ") in order, each starting at a multiple of its size"));
      }
      next_rank += c;
      if (pg.sequences.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(where, "has no sequence"));
      }
      if (pg.padded_lengths.size() != pg.sequences.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, pg.sequences.size(), " sequences but ",
            pg.padded_lengths.size(), " padded_lengths"));
      }
      GroupLayout g;
      g.microbatch = m;
      g.group_index = gi;
      g.first_rank = pg.first_rank;
      g.cp_size = c;
      g.sequences = pg.sequences;
      g.padded_lengths = pg.padded_lengths;
      g.lengths.reserve(pg.sequences.size());
      g.cu_seqlens.reserve(pg.sequences.size() + 1);
      g.cu_seqlens_padded.reserve(pg.sequences.size() + 1);
      g.cu_seqlens.push_back(0);
      g.cu_seqlens_padded.push_back(0);
      int64_t total = 0, total_padded = 0, max_padded = 0;
      for (size_t k = 0; k < pg.sequences.size(); ++k) {
        const int i = pg.sequences[k];
        if (i < 0 || i >= static_cast<int>(lengths.size())) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, "sequence index ", i, " is outside [0, ", lengths.size(), ")"));
        }
        if (used[i]) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, "sequence ", i, " appears more than once in the step"));
        }
        used[i] = 1;
        const int64_t expected = PaddedLength(t, lengths[i], c);
        if (pg.padded_lengths[k] != expected) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, "padded length of sequence ", i, " (length ", lengths[i],
              ") is ", pg.padded_lengths[k], ", expected ", expected,
              " on a CP group of ", c));
        }
        total += lengths[i];
        total_padded += expected;
        max_padded = std::max(max_padded, expected);
        if (total_padded > std::numeric_limits<int32_t>::max()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, "padded tokens exceed int32 cu_seqlens_padded (",
              total_padded, ")"));
        }
        g.lengths.push_back(lengths[i]);
        g.cu_seqlens.push_back(static_cast<int32_t>(total));
        g.cu_seqlens_padded.push_back(static_cast<int32_t>(total_padded));
      }
      g.max_seqlen = static_cast<int32_t>(max_padded);
      g.tokens_per_rank = total_padded / c;
      if (total_padded % c != 0 || pg.tokens_per_rank != g.tokens_per_rank) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "tokens_per_rank is ", pg.tokens_per_rank, ", expected ",
            total_padded, " / ", c));
      }
      if (g.tokens_per_rank > t.max_tokens_per_rank) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, g.tokens_per_rank,
            " padded tokens per rank exceed max_tokens_per_rank ",
            t.max_tokens_per_rank));
      }
      g.work_per_rank = pg.work_per_rank;
      out.groups_.push_back(std::move(g));
    }
    if (next_rank != ranks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan: micro-batch ", m, "'s groups cover ranks [0, ", next_rank,
          "), must cover [0, dp*cp = ", ranks, ")"));
    }
  }
  out.group_begin_.push_back(static_cast<int>(out.groups_.size()));
  for (size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("plan: sequence ", i, " is in no micro-batch"));
    }
  }
  return out;
}

absl::Span<const GroupLayout> StepLayout::groups(int microbatch) const {
  return absl::MakeConstSpan(groups_.data() + group_begin_[microbatch],
                             group_begin_[microbatch + 1] - group_begin_[microbatch]);
}

absl::Status StepLayout::ValidateCoords(const RankCoords& c) const {
  for (auto [name, value, size] :
       {std::tuple<const char*, int, int>{"dp", c.dp, topology_.dp},
        {"cp", c.cp, topology_.cp},
        {"tp", c.tp, topology_.tp},
        {"pp", c.pp, topology_.pp}}) {
    if (value < 0 || value >= size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", name, " coordinate ", value, " is outside [0, ", name, " = ",
          size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<const GroupLayout*> StepLayout::GroupOf(int microbatch,
                                                       int dpcp_rank) const {
  if (microbatch < 0 || microbatch >= num_microbatches_) {
    return absl::OutOfRangeError(absl::StrCat(
        "micro-batch index ", microbatch, " is outside [0, ", num_microbatches_, ")"));
  }
  if (dpcp_rank < 0 || dpcp_rank >= topology_.num_dpcp_ranks()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DPxCP rank ", dpcp_rank, " is outside [0, dp*cp = ",
        topology_.num_dpcp_ranks(), ")"));
  }
  absl::Span<const GroupLayout> gs = groups(microbatch);
  // Last group whose first_rank <= dpcp_rank.
  auto it = std::upper_bound(
      gs.begin(), gs.end(), dpcp_rank,
      [](int rank, const GroupLayout& g) { return rank < g.first_rank; });
  return &*(it - 1);
}

absl::Status StepLayout::Describe(const RankCoords& coords, int microbatch,
                                  RankMicrobatchLayout* out) const {
  RETURN_IF_ERROR(ValidateCoords(coords));
  const int rank = coords.dp * topology_.cp + coords.cp;
  auto group = GroupOf(microbatch, rank);
  if (!group.ok()) return group.status();
  const GroupLayout& g = **group;
  out->coords = coords;
  out->microbatch = microbatch;
  out->num_microbatches = num_microbatches_;
  out->group = &g;
  out->local_cp_size = g.cp_size;
  out->local_cp_rank = rank - g.first_rank;
  out->local_tokens = g.tokens_per_rank;
  AppendZigzagRuns(g, out->local_cp_rank, &out->token_runs);
  const int s = topology_.sequence_parallel_size();
  if (s > 1) {
    const int64_t per = g.tokens_per_rank / s;
    out->router_row_begin = coords.tp * per;
    out->router_rows = per;
    SliceRuns(out->token_runs, out->router_row_begin, per, &out->router_runs);
  } else {
    out->router_row_begin = 0;
    out->router_rows = g.tokens_per_rank;
    out->router_runs.assign(out->token_runs.begin(), out->token_runs.end());
  }
  const PipelineStage& stage = pipeline_.stage(coords.pp);
  out->replay_layers = stage.replay_layers;
  out->replay_positions = stage.replay_positions;
  out->first_pipeline_stage = coords.pp == 0;
  out->last_pipeline_stage = coords.pp == topology_.pp - 1;
  return absl::OkStatus();
}

absl::StatusOr<RankMicrobatchLayout> StepLayout::Describe(
    const RankCoords& coords, int microbatch) const {
  RankMicrobatchLayout out;
  RETURN_IF_ERROR(Describe(coords, microbatch, &out));
  return out;
}

}  // namespace rollpack
