#include "scheduler/layout_scatter.h"

#include <cstring>
#include <vector>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"

namespace rollpack {
namespace {

// Widens k little-endian ids (ndarray.proto's byte order) of type T.
template <typename T>
void LoadIds(const uint8_t* p, int64_t k, int64_t* out) {
  for (int64_t j = 0; j < k; ++j) {
#ifdef ABSL_IS_LITTLE_ENDIAN
    T v;
    std::memcpy(&v, p + j * sizeof(T), sizeof(T));
    out[j] = static_cast<int64_t>(v);
#else
    uint64_t v = 0;
    for (int b = static_cast<int>(sizeof(T)) - 1; b >= 0; --b) v = (v << 8) | p[j * sizeof(T) + b];
    out[j] = static_cast<int64_t>(static_cast<T>(v));
#endif
  }
}

using LoadFn = void (*)(const uint8_t*, int64_t, int64_t*);

LoadFn LoaderFor(int element_bytes, bool is_signed) {
  switch (element_bytes) {
    case 1:
      return is_signed ? LoadIds<int8_t> : LoadIds<uint8_t>;
    case 2:
      return is_signed ? LoadIds<int16_t> : LoadIds<uint16_t>;
    case 4:
      return is_signed ? LoadIds<int32_t> : LoadIds<uint32_t>;
    default:
      // uint64 ids past 2^63 read as negative: refused as out of range.
      return LoadIds<int64_t>;
  }
}

// Whether the upload carries `run`'s rows.
bool Carries(const UploadedRouting& upload, const RowRun& run) {
  if (run.padding) return false;
  return upload.owner.empty() || upload.owner[run.sequence] == upload.owner_self;
}

}  // namespace

absl::Status CheckUploadShape(const RankMicrobatchLayout& rank, int topk,
                              const UploadedRouting& upload) {
  const int64_t layers = static_cast<int64_t>(rank.replay_layers.size());
  if (upload.rows != rank.router_rows || upload.layers != layers || upload.topk != topk) {
    return absl::InvalidArgumentError(absl::StrCat(
        "recorded routing has shape [", upload.rows, ", ", upload.layers, ", ", upload.topk,
        "], this rank's replay_experts of micro-batch ", rank.microbatch, " is [",
        rank.router_rows, ", ", layers, ", ", topk, "] (router rows, replay layers, topk)"));
  }
  if (upload.element_bytes != 1 && upload.element_bytes != 2 && upload.element_bytes != 4 &&
      upload.element_bytes != 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "recorded routing has ", upload.element_bytes, "-byte ids; expected 1, 2, 4 or 8"));
  }
  const int64_t carried =
      upload.owner.empty() ? upload.rows : OwnedRouterRows(rank, upload.owner, upload.owner_self);
  const int64_t expected = carried * upload.layers * upload.topk * upload.element_bytes;
  if (upload.size_bytes != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("recorded routing has ", upload.size_bytes, " bytes of data, its shape and ",
                     upload.element_bytes, "-byte dtype need ", expected));
  }
  return absl::OkStatus();
}

absl::Status ForEachUploadedEntry(const RankMicrobatchLayout& rank,
                                  const UploadedRouting& upload,
                                  UploadedEntryVisitor visit) {
  const int64_t k = upload.topk;
  const int64_t row_bytes = upload.layers * k * upload.element_bytes;
  const LoadFn load = LoaderFor(upload.element_bytes, upload.is_signed);
  std::vector<int64_t> ids(static_cast<size_t>(k));
  UploadedEntry entry;
  int64_t carried = 0;  // rows of a share before this run
  for (const RowRun& run : rank.router_runs) {
    if (!Carries(upload, run)) continue;
    entry.sequence = run.sequence;
    const int64_t first = upload.owner.empty() ? run.output_row : carried;
    carried += run.length;
    for (int64_t r = 0; r < run.length; ++r) {
      const uint8_t* row = upload.data + (first + r) * row_bytes;
      entry.token = run.source_pos + r;
      for (int64_t l = 0; l < upload.layers; ++l) {
        load(row + l * k * upload.element_bytes, k, ids.data());
        entry.replay_layer = static_cast<int>(l);
        entry.stored_layer = rank.replay_positions[l];
        entry.ids = ids;
        if (absl::Status s = visit(entry); !s.ok()) return s;
      }
    }
  }
  return absl::OkStatus();
}

std::vector<int> StoredRoutingLayerIds(const PipelineLayers& pipeline) {
  std::vector<int> ids;
  for (const PipelineStage& stage : pipeline.stages()) {
    for (size_t i = 0; i < stage.replay_positions.size(); ++i) {
      const int position = stage.replay_positions[i];
      if (position >= static_cast<int>(ids.size())) ids.resize(position + 1, -1);
      ids[position] = stage.replay_layers[i];
    }
  }
  return ids;
}

int64_t OwnedRouterRows(const RankMicrobatchLayout& rank, absl::Span<const int32_t> owner,
                        int self) {
  int64_t rows = 0;
  for (const RowRun& run : rank.router_runs) {
    if (!run.padding && owner[run.sequence] == self) rows += run.length;
  }
  return rows;
}

void SplitUploadByOwner(const RankMicrobatchLayout& rank, const UploadedRouting& upload,
                        absl::Span<const int32_t> owner, int num_owners,
                        std::vector<std::string>* shares) {
  const int64_t row_bytes = upload.layers * upload.topk * upload.element_bytes;
  shares->assign(static_cast<size_t>(num_owners), std::string());
  for (int o = 0; o < num_owners; ++o) {
    (*shares)[o].reserve(static_cast<size_t>(OwnedRouterRows(rank, owner, o) * row_bytes));
  }
  for (const RowRun& run : rank.router_runs) {
    if (run.padding) continue;
    (*shares)[owner[run.sequence]].append(
        reinterpret_cast<const char*>(upload.data + run.output_row * row_bytes),
        static_cast<size_t>(run.length * row_bytes));
  }
}

int64_t RealRouterRows(const RankMicrobatchLayout& rank) {
  int64_t rows = 0;
  for (const RowRun& run : rank.router_runs) {
    if (!run.padding) rows += run.length;
  }
  return rows;
}

}  // namespace rollpack
