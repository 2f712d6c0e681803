#include "scheduler/ragged_gather.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace rollpack {
namespace {

// The source bounds [first, last) of real run `index`'s values, checked
// against the source: reading them stays inside it.
struct RunBounds {
  int64_t first = 0;
  int64_t last = 0;
};

absl::StatusOr<RunBounds> BoundsOf(const RowRun& run, size_t index, size_t value_bytes,
                                   const RaggedSource& source) {
  const int64_t end = run.source_pos + run.length;
  const int64_t tokens = static_cast<int64_t>(source.offsets.size()) - 1;
  if (run.source_pos < 0 || end > tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gather ragged: run ", index, " (sequence ", run.sequence, ") reads tokens [",
        run.source_pos, ", ", end, "), the source has offsets for ", tokens < 0 ? 0 : tokens));
  }
  const RunBounds bounds{source.offsets[run.source_pos], source.offsets[end]};
  const int64_t held =
      value_bytes == 0 ? 0 : static_cast<int64_t>(source.values_bytes / value_bytes);
  if (bounds.first < 0 || bounds.last < bounds.first || bounds.last > held ||
      (bounds.last > bounds.first && source.values == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather ragged: run ", index, " (sequence ", run.sequence, ") reads values [",
                     bounds.first, ", ", bounds.last, "), the source holds ", held));
  }
  return bounds;
}

void PutOffset(int64_t offset, uint8_t* at) { std::memcpy(at, &offset, sizeof(offset)); }

}  // namespace

absl::StatusOr<int64_t> CountRaggedValues(absl::Span<const RowRun> runs, size_t value_bytes,
                                          RaggedSourceFn source) {
  int64_t count = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].padding) continue;
    ASSIGN_OR_RETURN(const RunBounds bounds,
                     BoundsOf(runs[i], i, value_bytes, source(runs[i].ordinal)));
    count += bounds.last - bounds.first;
  }
  return count;
}

absl::Status GatherRagged(absl::Span<const RowRun> runs, size_t value_bytes, RaggedSourceFn source,
                          absl::Span<uint8_t> values, absl::Span<uint8_t> offsets) {
  int64_t rows = 0;
  for (const RowRun& run : runs) rows += run.length;
  if (offsets.size() != static_cast<size_t>(rows + 1) * sizeof(int64_t)) {
    return absl::InvalidArgumentError(absl::StrCat("gather ragged: offsets have ", offsets.size(),
                                                   " bytes, expected (", rows,
                                                   " rows + 1) * 8 bytes"));
  }
  int64_t row = 0;
  int64_t next = 0;  // values written so far: the next row's first offset
  PutOffset(0, offsets.data());
  for (size_t i = 0; i < runs.size(); ++i) {
    const RowRun& run = runs[i];
    if (run.output_row != row || run.length < 1) {
      return absl::InvalidArgumentError(absl::StrCat("gather ragged: run ", i, " (output_row ",
                                                     run.output_row, ", length ", run.length,
                                                     ") does not continue the runs at row ", row));
    }
    uint8_t* row_offsets = offsets.data() + (row + 1) * sizeof(int64_t);
    if (run.padding) {
      for (int64_t r = 0; r < run.length; ++r) PutOffset(next, row_offsets + r * sizeof(int64_t));
      row += run.length;
      continue;
    }
    const RaggedSource src = source(run.ordinal);
    ASSIGN_OR_RETURN(const RunBounds bounds, BoundsOf(run, i, value_bytes, src));
    const size_t bytes = static_cast<size_t>(bounds.last - bounds.first) * value_bytes;
    const size_t written = static_cast<size_t>(next) * value_bytes;
    if (written + bytes > values.size()) {
      return absl::InvalidArgumentError(absl::StrCat("gather ragged: values have ", values.size(),
                                                     " bytes, run ", i, " needs ",
                                                     written + bytes));
    }
    if (bytes > 0) {
      std::memcpy(values.data() + written,
                  static_cast<const uint8_t*>(src.values) + bounds.first * value_bytes, bytes);
    }
    // Rebased: the run's first list starts where the previous row's ended.
    const int64_t shift = next - bounds.first;
    for (int64_t r = 0; r < run.length; ++r) {
      PutOffset(src.offsets[run.source_pos + r + 1] + shift, row_offsets + r * sizeof(int64_t));
    }
    next += bounds.last - bounds.first;
    row += run.length;
  }
  if (static_cast<size_t>(next) * value_bytes != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("gather ragged: values have ", values.size(),
                                                   " bytes, the rows hold ", next, " values of ",
                                                   value_bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace rollpack
