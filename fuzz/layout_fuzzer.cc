// Layout reassembly: for a valid plan, every rank's description of every
// micro-batch is reassembled and checked against the plan. Oracle: the CP
// ranks of a group cover every padded position of every sequence exactly
// once; runs tile each rank's stream; padding flags match n_j; the tp ranks'
// router rows tile the CP-local stream; every sequence is in one group.
#include <algorithm>

#include "fuzz/fuzz_common.h"
#include "scheduler/layout.h"
#include "scheduler/plan.h"
#include "scheduler/planner.h"

using namespace rollpack;

namespace {

void CheckTiling(const std::vector<RowRun>& runs, int64_t total) {
  int64_t row = 0;
  for (const RowRun& r : runs) {
    FUZZ_CHECK(r.length >= 1);
    FUZZ_CHECK(r.output_row == row);
    row += r.length;
  }
  FUZZ_CHECK(row == total);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const Topology topology = FuzzTopology(&in);
  const ModelSpec model = FuzzModel(&in);
  const std::vector<int64_t> lengths = FuzzLengths(&in);
  if (!ValidateTopologySizes(topology).ok()) return 0;
  if (!PipelineLayers::Create(model, topology).ok()) return 0;
  absl::StatusOr<Plan> plan = ComputePlan(lengths, topology);
  if (!plan.ok()) return 0;
  absl::StatusOr<StepLayout> layout = StepLayout::Create(*plan, lengths, topology, model);
  if (!layout.ok()) std::fprintf(stderr, "%s\n", layout.status().ToString().c_str());
  FUZZ_CHECK(layout.ok());
  FUZZ_CHECK(layout->num_microbatches() == static_cast<int>(plan->microbatches.size()));

  std::vector<int> seen(lengths.size(), 0);
  RankMicrobatchLayout rank;
  for (int m = 0; m < layout->num_microbatches(); ++m) {
    for (const GroupLayout& group : layout->groups(m)) {
      for (int s : group.sequences) seen[s]++;
      // coverage[j][pos]: how many CP ranks hold padded position pos of sequence j.
      std::vector<std::vector<uint8_t>> coverage(group.sequences.size());
      for (size_t j = 0; j < group.sequences.size(); ++j) {
        FUZZ_CHECK(group.lengths[j] == lengths[group.sequences[j]]);
        coverage[j].assign(group.padded_lengths[j], 0);
      }
      for (int r = 0; r < group.cp_size; ++r) {
        const int id = group.first_rank + r;
        RankCoords coords{id / topology.cp, id % topology.cp, 0, 0};
        absl::Status s = layout->Describe(coords, m, &rank);
        FUZZ_CHECK(s.ok());
        FUZZ_CHECK(rank.group == &group && rank.local_cp_rank == r);
        FUZZ_CHECK(rank.local_tokens == group.tokens_per_rank);
        CheckTiling(rank.token_runs, rank.local_tokens);
        for (const RowRun& run : rank.token_runs) {
          FUZZ_CHECK(run.ordinal >= 0 && run.ordinal < static_cast<int>(group.sequences.size()));
          FUZZ_CHECK(run.sequence == group.sequences[run.ordinal]);
          const int64_t n = group.lengths[run.ordinal];
          FUZZ_CHECK(run.source_pos + run.length <= group.padded_lengths[run.ordinal]);
          FUZZ_CHECK(run.padding == (run.source_pos >= n));
          FUZZ_CHECK(run.padding || run.source_pos + run.length <= n);
          FUZZ_CHECK(run.stream_pos == group.cu_seqlens_padded[run.ordinal] + run.source_pos);
          for (int64_t p = run.source_pos; p < run.source_pos + run.length; ++p) coverage[run.ordinal][p]++;
        }
        // With sequence parallelism the tp ranks' router rows tile the
        // CP-local stream in order; without it every tp rank routes all of it.
        const bool split = topology.sequence_parallel_size() > 1;
        int64_t next = 0;
        for (int t = 0; t < topology.tp; ++t) {
          coords.tp = t;
          FUZZ_CHECK(layout->Describe(coords, m, &rank).ok());
          CheckTiling(rank.router_runs, rank.router_rows);
          if (split) {
            FUZZ_CHECK(rank.router_row_begin == next);
            next += rank.router_rows;
          } else {
            FUZZ_CHECK(rank.router_row_begin == 0 && rank.router_rows == group.tokens_per_rank);
          }
        }
        if (split) FUZZ_CHECK(next == group.tokens_per_rank);
      }
      for (const auto& c : coverage) {
        FUZZ_CHECK(std::all_of(c.begin(), c.end(), [](uint8_t x) { return x == 1; }));
      }
    }
  }
  FUZZ_CHECK(std::all_of(seen.begin(), seen.end(), [](int x) { return x == 1; }));
  return 0;
}
