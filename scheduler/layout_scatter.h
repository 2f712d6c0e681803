// The inverse of a rank's layout (layout.md section 11, R2): where each row
// of routing a rank uploads for one micro-batch came from, so it can be put
// back into its sample. Walks the same RowRuns the gather functions of
// layout_gather.h read with, so delivery and its inverse cannot disagree.
// Pure C++: no gRPC, no protobuf, no CUDA. Thread-safe (no state).
#ifndef ROLLPACK_SCHEDULER_LAYOUT_SCATTER_H_
#define ROLLPACK_SCHEDULER_LAYOUT_SCATTER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "scheduler/layout.h"
#include "scheduler/pipeline_layers.h"

namespace rollpack {

// One rank's upload for one micro-batch: [rows, layers, K] integer ids,
// row-major, little endian, read in place.
struct UploadedRouting {
  const uint8_t* data = nullptr;
  int64_t size_bytes = 0;
  int element_bytes = 0;  // 1, 2, 4 or 8
  bool is_signed = false;
  int64_t rows = 0;
  int64_t layers = 0;
  int64_t topk = 0;
  // Set: `data` holds only the real-token rows of the sequences `owner`
  // gives to `owner_self`, in the order of the rank's row runs (one
  // member's share of a rank's upload in a cluster: docs/cluster.md);
  // `rows` stays the rank's router rows.
  absl::Span<const int32_t> owner;
  int owner_self = -1;
};

// One (token, layer) entry of an upload that belongs to a real token.
struct UploadedEntry {
  // The step's sequence (RowRun::sequence) and the token within it, < n_j.
  int sequence = 0;
  int64_t token = 0;
  // Index of the layer in the store's compact layout (replay_positions).
  int stored_layer = 0;
  // Index of the layer in the rank's replay_layers (the upload's layer axis).
  int replay_layer = 0;
  // The K uploaded ids, widened (not yet range-checked).
  absl::Span<const int64_t> ids;
};

// INVALID_ARGUMENT naming the numbers unless `upload` has exactly the shape
// of `rank`'s replay_experts ([router_rows, |replay_layers|, topk]), a
// supported element size and size_bytes = rows * layers * topk * element
// (with an owner: rows of the owned sequences only).
absl::Status CheckUploadShape(const RankMicrobatchLayout& rank, int topk,
                              const UploadedRouting& upload);

// Calls `visit` for every entry of `upload` on a real token, in upload
// order (row-major), and skips padding rows. Stops at the first error
// `visit` returns and returns it. Requires CheckUploadShape to pass.
using UploadedEntryVisitor = absl::FunctionRef<absl::Status(const UploadedEntry& entry)>;
absl::Status ForEachUploadedEntry(const RankMicrobatchLayout& rank,
                                  const UploadedRouting& upload,
                                  UploadedEntryVisitor visit);

// Real-token rows of the rank's router rows (the rows an upload places).
int64_t RealRouterRows(const RankMicrobatchLayout& rank);

// Real-token rows of the sequences `owner` gives to `self`.
int64_t OwnedRouterRows(const RankMicrobatchLayout& rank, absl::Span<const int32_t> owner,
                        int self);

// Splits a whole upload (no owner set) by owner: (*shares)[o] holds the
// real-token rows of owner o's sequences in the upload's dtype, as the
// UploadedRouting with owner = `owner`, owner_self = o reads them; empty for
// an owner with no rows. Requires CheckUploadShape to pass.
void SplitUploadByOwner(const RankMicrobatchLayout& rank, const UploadedRouting& upload,
                        absl::Span<const int32_t> owner, int num_owners,
                        std::vector<std::string>* shares);

// The global layer id of each layer of the store's compact routing layout
// ([n, stored layers, K]: M, then the MTP layers with mtp_routing), from the
// positions the pipeline's stages replay.
std::vector<int> StoredRoutingLayerIds(const PipelineLayers& pipeline);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_LAYOUT_SCATTER_H_
