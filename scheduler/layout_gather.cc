#include "scheduler/layout_gather.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace rollpack {
namespace {

// Checks that the runs tile [0, TotalRows) in order, so writes through
// output_row stay inside the output.
absl::Status CheckRuns(absl::Span<const RowRun> runs) {
  int64_t row = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].output_row != row || runs[i].length < 1 ||
        runs[i].source_pos < 0 || runs[i].stream_pos < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gather: run ", i, " (output_row ", runs[i].output_row, ", length ",
          runs[i].length, ") does not continue the runs at row ", row));
    }
    row += runs[i].length;
  }
  return absl::OkStatus();
}

// Writes the filler ids of stream position q into `layers` layers of K ids.
template <typename Id>
void WriteFiller(int64_t q, int layers, int k, int e, uint8_t* dst) {
  Id ids[1];
  const int64_t base = (q % e) * k % e;  // (q*K) mod E without overflow
  for (int j = 0; j < k; ++j) {
    int64_t id = base + j;
    id %= e;
    ids[0] = static_cast<Id>(id);
    std::memcpy(dst + j * sizeof(Id), ids, sizeof(Id));
  }
  const size_t row = static_cast<size_t>(k) * sizeof(Id);
  for (int l = 1; l < layers; ++l) std::memcpy(dst + l * row, dst, row);
}

// Output layers [output, output + count) are payload layers [payload,
// payload + count).
struct LayerSpan {
  int output = 0;
  int payload = 0;
  size_t count = 0;
};

std::vector<LayerSpan> ContiguousLayerSpans(absl::Span<const int> layer_indices) {
  std::vector<LayerSpan> spans;
  for (int l = 0; l < static_cast<int>(layer_indices.size()); ++l) {
    if (!spans.empty() &&
        spans.back().payload + static_cast<int>(spans.back().count) == layer_indices[l]) {
      ++spans.back().count;
    } else {
      spans.push_back({l, layer_indices[l], 1});
    }
  }
  return spans;
}

}  // namespace

int64_t TotalRows(absl::Span<const RowRun> runs) {
  int64_t rows = 0;
  for (const RowRun& run : runs) rows += run.length;
  return rows;
}

absl::Status GatherRows(absl::Span<const RowRun> runs, size_t row_bytes,
                        RowSourceFn source, absl::Span<uint8_t> out) {
  RETURN_IF_ERROR(CheckRuns(runs));
  const int64_t rows = TotalRows(runs);
  if (out.size() != static_cast<size_t>(rows) * row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gather: output has ", out.size(), " bytes, expected ", rows,
        " rows * ", row_bytes, " bytes"));
  }
  if (row_bytes == 0) return absl::OkStatus();  // e.g. a [n, 0] field
  for (const RowRun& run : runs) {
    uint8_t* dst = out.data() + run.output_row * row_bytes;
    const size_t bytes = static_cast<size_t>(run.length) * row_bytes;
    if (run.padding) {
      std::memset(dst, 0, bytes);
      continue;
    }
    const void* src = source(run.ordinal);
    if (src == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gather: no source for sequence ordinal ", run.ordinal, " (sequence ",
          run.sequence, ")"));
    }
    std::memcpy(dst,
                static_cast<const uint8_t*>(src) + run.source_pos * row_bytes,
                bytes);
  }
  return absl::OkStatus();
}

absl::Status GatherRows(absl::Span<const RowRun> runs, size_t row_bytes,
                        absl::Span<const void* const> sources,
                        absl::Span<uint8_t> out) {
  return GatherRows(
      runs, row_bytes,
      [&](int ordinal) -> const void* {
        if (ordinal < 0 || static_cast<size_t>(ordinal) >= sources.size()) {
          return nullptr;
        }
        return sources[ordinal];
      },
      out);
}

absl::Status GatherReplay(absl::Span<const RowRun> runs, const ReplaySpec& spec,
                          ReplaySourceFn source, absl::Span<uint8_t> experts,
                          absl::Span<uint8_t> mask) {
  const int e = spec.num_experts;
  const int k = spec.topk;
  const int ib = spec.id_bytes;
  if (e < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gather replay: num_experts is ", e, ", must be >= 1 (dense models "
        "have no replay)"));
  }
  if (k < 1 || k > e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gather replay: topk is ", k, ", must be in [1, num_experts = ", e, "]"));
  }
  if (ib != 1 && ib != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather replay: id_bytes is ", ib, ", must be 1 or 2"));
  }
  if (ib == 1 && e > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gather replay: id_bytes 1 cannot hold ids of num_experts ", e));
  }
  const int num_layers = static_cast<int>(spec.layer_indices.size());
  for (int l = 0; l < num_layers; ++l) {
    const int idx = spec.layer_indices[l];
    if (idx < 0 || idx >= spec.payload_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gather replay: layer_indices[", l, "] is ", idx,
          ", outside [0, payload_layers = ", spec.payload_layers, ")"));
    }
  }
  RETURN_IF_ERROR(CheckRuns(runs));
  const int64_t rows = TotalRows(runs);
  const size_t id_row = static_cast<size_t>(k) * ib;       // one (row, layer)
  const size_t out_row = id_row * num_layers;              // one output row
  const size_t src_row = id_row * spec.payload_layers;     // one source row
  if (experts.size() != static_cast<size_t>(rows) * out_row ||
      mask.size() != static_cast<size_t>(rows)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gather replay: outputs have ", experts.size(), " and ", mask.size(),
        " bytes, expected ", rows, " rows * ", num_layers, " layers * ", k,
        " * ", ib, " bytes and ", rows, " mask bytes"));
  }
  // Consecutive payload layers are copied together: a pipeline stage owns a
  // contiguous layer range, so a row is usually one memcpy, and with every
  // layer (pp = 1) a whole stretch of valid rows is.
  const std::vector<LayerSpan> spans = ContiguousLayerSpans(spec.layer_indices);
  const bool whole_rows = spans.size() == 1 && out_row == src_row;
  for (const RowRun& run : runs) {
    ReplaySource src;
    if (!run.padding) src = source(run.ordinal);
    const uint8_t* src_experts = static_cast<const uint8_t*>(src.experts);
    int64_t i = 0;
    while (i < run.length) {
      const int64_t out_index = run.output_row + i;
      uint8_t* dst = experts.data() + out_index * out_row;
      const int64_t t = run.source_pos + i - src.row_offset;
      const bool valid = src_experts != nullptr && t >= 0 && t < src.num_rows &&
                         (src.valid == nullptr || src.valid[t] != 0);
      if (!valid) {
        mask[out_index] = 0;
        if (num_layers > 0) {
          if (ib == 1) {
            WriteFiller<uint8_t>(run.stream_pos + i, num_layers, k, e, dst);
          } else {
            WriteFiller<uint16_t>(run.stream_pos + i, num_layers, k, e, dst);
          }
        }
        ++i;
        continue;
      }
      // The stretch of valid rows starting here, within the run and source.
      int64_t n = 1;
      const int64_t limit = std::min(run.length - i, src.num_rows - t);
      while (n < limit && (src.valid == nullptr || src.valid[t + n] != 0)) ++n;
      std::memset(mask.data() + out_index, 1, static_cast<size_t>(n));
      const uint8_t* row = src_experts + t * src_row;
      if (whole_rows) {
        std::memcpy(dst, row, static_cast<size_t>(n) * out_row);
      } else {
        for (int64_t r = 0; r < n; ++r) {
          for (const LayerSpan& span : spans) {
            std::memcpy(dst + r * out_row + span.output * id_row,
                        row + r * src_row + span.payload * id_row, span.count * id_row);
          }
        }
      }
      i += n;
    }
  }
  return absl::OkStatus();
}

absl::Status GatherReplay(absl::Span<const RowRun> runs, const ReplaySpec& spec,
                          absl::Span<const ReplaySource> sources,
                          absl::Span<uint8_t> experts, absl::Span<uint8_t> mask) {
  return GatherReplay(
      runs, spec,
      [&](int ordinal) -> ReplaySource {
        if (ordinal < 0 || static_cast<size_t>(ordinal) >= sources.size()) {
          return ReplaySource{};
        }
        return sources[ordinal];
      },
      experts, mask);
}

}  // namespace rollpack
