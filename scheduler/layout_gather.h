// Turning a rank's row runs (layout.h) into bytes: one implementation for
// tokens, every token field and routing replay, so they can never disagree
// (layout.md sections 4, 5 and 7). Sources are read in place through
// callbacks, so the server can gather straight from its store into the
// outgoing buffer without intermediate copies. Thread-safe (no state).
#ifndef ROLLPACK_SCHEDULER_LAYOUT_GATHER_H_
#define ROLLPACK_SCHEDULER_LAYOUT_GATHER_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "scheduler/layout.h"

namespace rollpack {

// Total rows the runs cover (the sum of their lengths).
int64_t TotalRows(absl::Span<const RowRun> runs);

// Filler expert id j (0 <= j < K) of a padding or missing row at position q
// of the micro-batch's padded stream (section 7): (q*K + j) mod E. The K ids
// of one row are distinct and in [0, E) whenever K <= E.
inline int64_t FillerExpertId(int64_t stream_pos, int j, int topk,
                              int num_experts) {
  return (stream_pos * topk + j) % num_experts;
}

// --- per-token rows: tokens and token fields ---

// Returns the first byte of row 0 of sequence `ordinal` (the j of RowRun):
// n_j rows of `row_bytes` bytes each, contiguous. Only called for ordinals
// that have real rows in the runs; may return nullptr, which is an error.
using RowSourceFn = absl::FunctionRef<const void*(int ordinal)>;

// Gathers the rows of `runs` into `out` (row r of the output at
// out[r*row_bytes]): real rows are copied from the sources, padding rows are
// zero-filled. `row_bytes` is the size of one token's entry (4 for int32
// tokens; 4 * prod(trailing shape) for a float32 field, ...).
// row_bytes 0 (a field with an empty trailing shape) writes nothing.
// INVALID_ARGUMENT naming the sizes when out.size() != TotalRows(runs) *
// row_bytes, the runs do not tile [0, rows) in order, or a source is nullptr.
// Sources are not bounds-checked: the runs must come from a StepLayout built
// with the sources' lengths (a real run reads rows [source_pos,
// source_pos + length) < n_j).
absl::Status GatherRows(absl::Span<const RowRun> runs, size_t row_bytes,
                        RowSourceFn source, absl::Span<uint8_t> out);

// Same with one source pointer per ordinal (sources[j] = row 0 of sequence j).
absl::Status GatherRows(absl::Span<const RowRun> runs, size_t row_bytes,
                        absl::Span<const void* const> sources,
                        absl::Span<uint8_t> out);

// --- routing replay ---

// Stored routed experts of one sequence: `num_rows` rows covering tokens
// [row_offset, row_offset + num_rows), row-major [num_rows,
// payload_layers, K] ids of ReplaySpec::id_bytes bytes each (uint8 or
// uint16, native byte order). Tokens outside the covered rows are missing.
struct ReplaySource {
  const void* experts = nullptr;  // nullptr: every row missing
  int64_t row_offset = 0;
  int64_t num_rows = 0;
  // uint8 [num_rows]: 0 = missing row; nullptr = every covered row valid.
  const uint8_t* valid = nullptr;
};

using ReplaySourceFn = absl::FunctionRef<ReplaySource(int ordinal)>;

struct ReplaySpec {
  int num_experts = 0;  // E >= 1
  int topk = 0;         // K, 1 <= K <= E
  int id_bytes = 1;     // 1 (uint8, E <= 256) or 2 (uint16); input = output
  // Size of the sources' layer axis: |M| (compact, what the store keeps) or
  // N (full).
  int payload_layers = 0;
  // Payload layer index of each output layer, in output order: the stage's
  // PipelineStage::replay_positions for compact sources, or
  // PayloadLayerIndex(...) of each replay layer in general.
  absl::Span<const int> layer_indices;
};

// Gathers replay for the router rows `runs` (RankMicrobatchLayout::
// router_runs): writes `experts` [rows, layer_indices.size(), K] of id_bytes
// each, token-major, and `mask` uint8 [rows]: 1 for a real row whose source
// row is covered and valid, else 0 (padding or missing), in which case every
// layer of the row holds FillerExpertId(q, j, K, E), q = the row's
// stream_pos. With no layers, only `mask` is written.
// INVALID_ARGUMENT naming the values when: E < 1, K outside [1, E], id_bytes
// not 1 or 2, E > 256 with id_bytes 1, a layer index outside
// [0, payload_layers), or the output sizes do not match.
absl::Status GatherReplay(absl::Span<const RowRun> runs, const ReplaySpec& spec,
                          ReplaySourceFn source, absl::Span<uint8_t> experts,
                          absl::Span<uint8_t> mask);

// Same with one source per ordinal.
absl::Status GatherReplay(absl::Span<const RowRun> runs, const ReplaySpec& spec,
                          absl::Span<const ReplaySource> sources,
                          absl::Span<uint8_t> experts, absl::Span<uint8_t> mask);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_LAYOUT_GATHER_H_
