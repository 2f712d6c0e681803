#include "server/store/recompute_routing.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace rollpack {
namespace {

std::string IdsText(absl::Span<const int64_t> ids) {
  return absl::StrCat("[", absl::StrJoin(ids, ", "), "]");
}

// Sorts an entry's K ids into `sorted` (insertion sort: K is small).
void SortIds(const UploadedEntry& e, std::vector<int64_t>& sorted) {
  const int64_t k = static_cast<int64_t>(sorted.size());
  for (int64_t j = 0; j < k; ++j) {
    const int64_t v = e.ids[j];
    int64_t i = j;
    for (; i > 0 && sorted[i - 1] > v; --i) sorted[i] = sorted[i - 1];
    sorted[i] = v;
  }
}

}  // namespace

absl::Status RecomputeRoutingStage::CheckIds(const Step& step, const RankMicrobatchLayout& rank,
                                             const UploadedRouting& upload) {
  const int64_t topk = step.model.topk;
  const int64_t num_experts = step.model.num_experts;
  const std::vector<int> layer_ids = StoredRoutingLayerIds(step.layout.pipeline());
  std::vector<int64_t> sorted(static_cast<size_t>(topk));
  return ForEachUploadedEntry(rank, upload, [&](const UploadedEntry& e) -> absl::Status {
    SortIds(e, sorted);
    if (sorted[0] >= 0 && sorted[topk - 1] < num_experts &&
        std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) {
      return absl::OkStatus();
    }
    const std::string where = absl::StrCat("sample \"", step.sample_ids[e.sequence], "\" token ",
                                           e.token, " layer ", layer_ids[e.stored_layer]);
    if (sorted[0] < 0 || sorted[topk - 1] >= num_experts) {
      return absl::InvalidArgumentError(absl::StrCat(
          "recorded routing of ", where, " has expert id ",
          sorted[0] < 0 ? sorted[0] : sorted[topk - 1], ", outside [0, ", num_experts, ")"));
    }
    const int64_t repeated = *std::adjacent_find(sorted.begin(), sorted.end());
    return absl::InvalidArgumentError(absl::StrCat("recorded routing of ", where,
                                                   " repeats expert id ", repeated, ": ",
                                                   IdsText(e.ids)));
  });
}

RecomputeRoutingStage::RecomputeRoutingStage(std::shared_ptr<const Step> step,
                                             std::shared_ptr<const std::vector<int32_t>> owner,
                                             int self)
    : step_(std::move(step)),
      owner_(std::move(owner)),
      self_(self),
      topk_(step_->model.topk),
      num_experts_(step_->model.num_experts),
      id_bytes_(step_->model.stored_id_bytes()),
      layer_ids_(StoredRoutingLayerIds(step_->layout.pipeline())) {
  const int64_t layers = static_cast<int64_t>(layer_ids_.size());
  const absl::Span<const int64_t> lengths = step_->layout.lengths();
  ids_.resize(lengths.size());
  placed_.resize(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (!Owns(i)) continue;
    ids_[i].assign(static_cast<size_t>(lengths[i] * layers * topk_ * id_bytes_), '\0');
    placed_[i].assign(static_cast<size_t>(lengths[i] * layers), 0);
    memory_bytes_ += static_cast<int64_t>(ids_[i].size() + placed_[i].size());
    missing_ += lengths[i] * layers;
  }
}

absl::StatusOr<RoutingUploadResult> RecomputeRoutingStage::Place(const RankCoords& coords,
                                                                 int microbatch,
                                                                 const UploadedRouting& upload) {
  ASSIGN_OR_RETURN(RankMicrobatchLayout rank, step_->layout.Describe(coords, microbatch));
  if (owner_ != nullptr) {
    UploadedRouting share = upload;
    share.owner = *owner_;
    share.owner_self = self_;
    return PlaceChecked(rank, share);
  }
  return PlaceChecked(rank, upload);
}

absl::StatusOr<RoutingUploadResult> RecomputeRoutingStage::PlaceChecked(
    const RankMicrobatchLayout& rank, const UploadedRouting& upload) {
  RETURN_IF_ERROR(CheckUploadShape(rank, topk_, upload));
  const int64_t layers = static_cast<int64_t>(layer_ids_.size());
  const auto where = [&](const UploadedEntry& e) {
    return absl::StrCat("sample \"", step_->sample_ids[e.sequence], "\" token ", e.token,
                        " layer ", layer_ids_[e.stored_layer]);
  };
  const auto stored_id = [&](const std::string& ids, int64_t at) -> int64_t {
    const auto* p = reinterpret_cast<const uint8_t*>(ids.data()) + at * id_bytes_;
    return id_bytes_ == 1 ? p[0] : p[0] | (p[1] << 8);
  };

  // Entries are kept with their K ids in ascending order: routers' top-k is
  // unordered (Megatron's is unsorted on CUDA without grad), so copies of
  // one entry are compared as sets and the stored bytes do not depend on
  // which copy came first. Sorted, the range and distinctness checks are
  // two comparisons and one pass.
  std::vector<int64_t> sorted(static_cast<size_t>(topk_));
  const auto sort_ids = [&](const UploadedEntry& e) { SortIds(e, sorted); };

  // Pass 1, without the lock (uploads of other ranks go on).
  RETURN_IF_ERROR(CheckIds(*step_, rank, upload));

  absl::MutexLock lock(&mu_);
  // Pass 2: entries placed before must hold the same sets. Changes nothing.
  RETURN_IF_ERROR(ForEachUploadedEntry(rank, upload, [&](const UploadedEntry& e) -> absl::Status {
    const int64_t entry = e.token * layers + e.stored_layer;
    if (placed_[e.sequence][entry] == 0) return absl::OkStatus();
    sort_ids(e);
    const std::string& ids = ids_[e.sequence];
    for (int64_t j = 0; j < topk_; ++j) {
      if (stored_id(ids, entry * topk_ + j) != sorted[j]) {
        std::vector<int64_t> before(static_cast<size_t>(topk_));
        for (int64_t q = 0; q < topk_; ++q) before[q] = stored_id(ids, entry * topk_ + q);
        return absl::FailedPreconditionError(absl::StrCat(
            "recorded routing of ", where(e), " is ", IdsText(e.ids),
            " but an earlier upload placed ", IdsText(before), " (as sets)",
            " (ranks that see the same row must record the same experts)"));
      }
    }
    return absl::OkStatus();
  }));

  // Pass 3: place. Ids fit the stored width (< E <= 65536).
  RoutingUploadResult result;
  int64_t row_new = 0;
  int64_t row_layers = 0;
  RETURN_IF_ERROR(ForEachUploadedEntry(rank, upload, [&](const UploadedEntry& e) -> absl::Status {
    const int64_t entry = e.token * layers + e.stored_layer;
    uint8_t& placed = placed_[e.sequence][entry];
    if (placed == 0) {
      auto* out = reinterpret_cast<uint8_t*>(ids_[e.sequence].data()) + entry * topk_ * id_bytes_;
      sort_ids(e);
      for (int64_t j = 0; j < topk_; ++j) {
        out[j * id_bytes_] = static_cast<uint8_t>(sorted[j]);
        if (id_bytes_ == 2) out[j * id_bytes_ + 1] = static_cast<uint8_t>(sorted[j] >> 8);
      }
      placed = 1;
      --missing_;
      ++row_new;
    }
    // The last layer of a row closes it: count it as repeated when none of
    // its entries was new. (A rank with no replay layer places nothing.)
    if (++row_layers == upload.layers) {
      ++result.rows;
      if (row_new == 0) ++result.repeated_rows;
      row_new = 0;
      row_layers = 0;
    }
    return absl::OkStatus();
  }));
  result.missing_entries = missing_;
  return result;
}

absl::StatusOr<std::vector<std::string>> RecomputeRoutingStage::Routing() const {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckCompleteLocked());
  return ids_;
}

absl::Status RecomputeRoutingStage::CheckComplete() const {
  absl::MutexLock lock(&mu_);
  return CheckCompleteLocked();
}

absl::Status RecomputeRoutingStage::CheckCompleteLocked() const {
  if (missing_ > 0) {
    const int64_t layers = static_cast<int64_t>(layer_ids_.size());
    for (size_t i = 0; i < placed_.size(); ++i) {
      const auto it = std::find(placed_[i].begin(), placed_[i].end(), 0);
      if (it == placed_[i].end()) continue;
      const int64_t entry = it - placed_[i].begin();
      return absl::FailedPreconditionError(absl::StrCat(
          "recorded routing of step \"", step_->step_id, "\" is incomplete: sample \"",
          step_->sample_ids[i], "\" token ", entry / layers, " layer ",
          layer_ids_[entry % layers], " was not uploaded (", missing_,
          " (token, layer) entries missing; every rank uploads every micro-batch it received)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace rollpack
