// Ragged per-token fields over a rank's token rows (layout.md section 13):
// row r of the output gets the list of the token at that position of the
// padded stream (a padding position: the empty list), and the lists are
// written as CSR, their values concatenated in row order and int64 offsets
// rebased to start at 0. The same runs as tokens and token fields
// (layout_gather.h), so a ragged field can never disagree with them; sources
// are read in place through a callback. Thread-safe (no state).
#ifndef ROLLPACK_SCHEDULER_RAGGED_GATHER_H_
#define ROLLPACK_SCHEDULER_RAGGED_GATHER_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/layout.h"

namespace rollpack {

// One sequence's ragged field: token t's list is values [offsets[t],
// offsets[t + 1]) of `values`.
struct RaggedSource {
  // n + 1 entries, from 0, never decreasing (the store's invariant).
  absl::Span<const int64_t> offsets;
  // The values, `value_bytes` each; `values_bytes` of them are held.
  const void* values = nullptr;
  size_t values_bytes = 0;
};

// The field of sequence `ordinal` (the j of RowRun). Only called for
// ordinals with real rows in the runs.
using RaggedSourceFn = absl::FunctionRef<RaggedSource(int ordinal)>;

// Values the rows of `runs` hold: for each real run, offsets[source_pos +
// length] - offsets[source_pos] of its source; padding runs hold none.
// INVALID_ARGUMENT naming the run, its sequence and the bounds when a real
// run reads past the source's offsets, its bounds decrease, or its last
// bound passes the values the source holds: what GatherRagged then reads is
// inside the source.
absl::StatusOr<int64_t> CountRaggedValues(absl::Span<const RowRun> runs, size_t value_bytes,
                                          RaggedSourceFn source);

// Writes the rows of `runs` (which tile [0, rows) in order) as CSR: `values`
// (CountRaggedValues * value_bytes bytes, the rows' lists one after the
// other) and `offsets` ((rows + 1) int64, little endian, unaligned allowed:
// offsets[0] = 0, offsets[r + 1] - offsets[r] = row r's list length).
// INVALID_ARGUMENT naming the sizes when the outputs do not have exactly
// those sizes, the runs do not tile the rows, or CountRaggedValues would
// refuse a run.
absl::Status GatherRagged(absl::Span<const RowRun> runs, size_t value_bytes, RaggedSourceFn source,
                          absl::Span<uint8_t> values, absl::Span<uint8_t> offsets);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_RAGGED_GATHER_H_
