#include "scheduler/packer.h"

#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace rollpack {
namespace internal {
namespace {

// How many of the least loaded bins a placement looks at before it falls
// back to the bins with the most room. Fixed, so plans never depend on time.
constexpr int kScanLimit = 48;
// Repair looks at this many of the roomiest bins.
constexpr int kRepairBins = 24;
// Fill ratio (padded volume / capacity of the steps) above which packing

}  // namespace

bool Packer::Place(int i) {
  const auto& by_load = ByLoad();
  int scanned = 0;
  for (auto it = by_load.begin(); it != by_load.end() && scanned < kScanLimit;
       ++it, ++scanned) {
    if (Fits(i, bins_[it->second])) {
      Add(i, it->second);
      return true;
    }
  }
  const auto& by_resid = ByResidual();
  scanned = 0;
  for (auto it = by_resid.rbegin();
       it != by_resid.rend() && scanned < kScanLimit; ++it, ++scanned) {
    if (Fits(i, bins_[it->second])) {
      Add(i, it->second);
      return true;
    }
  }
  return Repair(i);
}

// Tail of the sequence order: the fullest bin that still fits sequence i,
// so that the last short sequences close the gaps instead of levelling them.
bool Packer::PlaceBestFit(int i) {
  const int64_t p = Padded(i, opt_.unit_width);
  const auto& by_resid = ByResidual();
  int scanned = 0;
  for (auto it = by_resid.lower_bound({p, -1});
       it != by_resid.end() && scanned < kScanLimit; ++it, ++scanned) {
    if (Fits(i, bins_[it->second])) {
      Add(i, it->second);
      return true;
    }
  }
  return Place(i);
}

// Makes room for sequence i, which fits in no bin: moves a sequence y out of
// a roomy bin A into bin B, or swaps y with a shorter z of B, so that A then
// has room for i. Sequences arrive longest first, so a swap is usually what
// works.
bool Packer::Repair(int i) {
  std::vector<int> roomy;
  const auto& by_resid = ByResidual();
  for (auto it = by_resid.rbegin();
       it != by_resid.rend() && static_cast<int>(roomy.size()) < kRepairBins;
       ++it) {
    roomy.push_back(it->second);
  }
  // Only lengths matter below: the first item of each length stands for
  // the rest (the same move or swap is found, EqualizeSteps explains).
  std::vector<std::vector<int>> distinct(roomy.size());
  for (size_t k = 0; k < roomy.size(); ++k) distinct[k] = FirstOfEachLength(bins_[roomy[k]].items);
  for (size_t ka = 0; ka < roomy.size(); ++ka) {
    const int a = roomy[ka];
    const int wa = bins_[a].width;
    const int64_t need = Padded(i, wa) - Residual(bins_[a]);
    for (size_t kb = 0; kb < roomy.size(); ++kb) {
      const int b = roomy[kb];
      if (b == a) continue;
      const int wb = bins_[b].width;
      const int64_t room_b = Residual(bins_[b]);
      for (int y : distinct[ka]) {
        if (opt_.min_width[y] > wb) continue;
        const int64_t ya = Padded(y, wa), yb = Padded(y, wb);
        if (ya >= need && yb <= room_b) {  // move y from A to B
          Remove(y, a);
          Add(y, b);
          Add(i, a);
          return true;
        }
        for (int z : distinct[kb]) {
          if (opt_.min_width[z] > wa) continue;
          const int64_t za = Padded(z, wa), zb = Padded(z, wb);
          if (ya - za >= need && yb - zb <= room_b) {  // swap y and z
            Remove(y, a);
            Remove(z, b);
            Add(z, a);
            Add(y, b);
            Add(i, a);
            return true;
          }
        }
      }
    }
  }
  return false;
}

absl::Status Packer::FillEmptyBins() {
  for (int e = 0; e < static_cast<int>(bins_.size()); ++e) {
    if (!bins_[e].items.empty()) continue;
    // Donor: the bin with the most sequences; it gives its shortest one.
    int donor = -1;
    for (int b = 0; b < static_cast<int>(bins_.size()); ++b) {
      if (bins_[b].items.size() < 2) continue;
      if (donor < 0 || bins_[b].items.size() > bins_[donor].items.size()) {
        donor = b;
      }
    }
    if (donor < 0) {
      return absl::FailedPreconditionError("too few sequences for the groups");
    }
    int best = -1;
    for (int y : bins_[donor].items) {
      if (opt_.min_width[y] > bins_[e].width || !Fits(y, bins_[e])) continue;
      if (best < 0 || std::make_pair(len_[y], y) < std::make_pair(len_[best], best)) {
        best = y;
      }
    }
    if (best < 0) {
      return absl::FailedPreconditionError("too few sequences for the groups");
    }
    Remove(best, donor);
    Add(best, e);
  }
  return absl::OkStatus();
}

// Groups bins of similar per-rank load into the same step, so that a step's
// slowest rank is close to its average: bins sorted by load, each step takes
// the heaviest remaining bin whose width still leaves its ranks tileable.
Plan Packer::Emit() const {
  Plan plan;
  plan.num_dpcp_ranks = r_;
  plan.microbatches.resize(n_mb_);
  for (int s = 0; s < n_mb_; ++s) {
    std::vector<int> bins = steps_[s];
    std::sort(bins.begin(), bins.end(),
              [&](int x, int y) { return pos_[x] < pos_[y]; });
    for (int b : bins) {
      const Bin& bin = bins_[b];
      PlanGroup g;
      g.first_rank = pos_[b];
      g.cp_size = bin.width;
      g.sequences = bin.items;
      std::sort(g.sequences.begin(), g.sequences.end());
      int64_t tokens = 0;
      double work = 0;
      for (int i : g.sequences) {
        const int64_t p = Padded(i, bin.width);
        g.padded_lengths.push_back(p);
        tokens += p;
        work += Cost(p);
      }
      g.tokens_per_rank = tokens / bin.width;
      g.work_per_rank = work / bin.width;
      plan.microbatches[s].groups.push_back(std::move(g));
    }
  }
  return plan;
}

absl::StatusOr<Plan> Packer::Run() {
  const int n = static_cast<int>(len_.size());
  const int unit = opt_.unit_width;
  const int64_t slots = static_cast<int64_t>(n_mb_) * r_;  // rank slots

  // Average work per rank slot, at each sequence's smallest group.
  double total_c = 0, total_a = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t p = Padded(i, opt_.min_width[i]);
    total_c += Cost(p);
    total_a += Attn(p);
  }
  tau_c_ = std::max(total_c / slots, 1e-300);
  tau_a_ = std::max(total_a / slots, 1e-300);

  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Longest first, ties by arrival order: one sort of packed 64-bit keys.
  const int64_t max_len = n > 0 ? *std::max_element(len_.begin(), len_.end()) : 0;
  if (max_len < (int64_t{1} << 32) && n < (int64_t{1} << 31)) {
    std::vector<uint64_t> keys(n);
    for (int i = 0; i < n; ++i) {
      keys[i] = (static_cast<uint64_t>(0xffffffffu - static_cast<uint64_t>(len_[i])) << 32) |
                static_cast<uint32_t>(i);
    }
    std::sort(keys.begin(), keys.end());
    for (int i = 0; i < n; ++i) order[i] = static_cast<int>(keys[i] & 0xffffffffu);
  } else {
    std::sort(order.begin(), order.end(), [&](int x, int y) {
      return len_[x] != len_[y] ? len_[x] > len_[y] : x < y;
    });
  }

  // Width each sequence opens a group at (unit: it joins a shared group).
  auto choose_widths = [&](bool widen) {
    std::vector<int> width(n);
    for (int i = 0; i < n; ++i) {
      int w = opt_.min_width[i];
      while (widen && w < opt_.max_width) {
        const int64_t p = Padded(i, w);
        if ((Cost(p) / tau_c_ + Attn(p) / tau_a_) / w <= 2.0) break;
        w *= 2;
      }
      width[i] = w;
    }
    return width;
  };
  std::vector<int> width = choose_widths(opt_.allow_widening);
  auto wide_slots = [&](const std::vector<int>& wd) {
    int64_t used = 0;
    for (int i = 0; i < n; ++i) {
      if (wd[i] > unit) used += wd[i];
    }
    return used;
  };
  if (wide_slots(width) > slots && opt_.allow_widening) {
    width = choose_widths(false);
  }
  const int64_t used = wide_slots(width);
  if (used > slots) {
    return absl::ResourceExhaustedError("long sequences need more steps");
  }

  int num_wide = 0;
  for (int i : order) {
    if (width[i] > unit) {
      Bin b;
      b.width = width[i];
      bins_.push_back(b);
      ++num_wide;
    }
  }
  // Empty groups for everything else; merged into wider ones when there are
  // too few sequences for one group per slot.
  std::vector<int64_t> empty_count(NumWidthClasses(), 0);
  empty_count[0] = (slots - used) / unit;
  const int64_t available = n - num_wide;
  auto total_empty = [&] {
    return std::accumulate(empty_count.begin(), empty_count.end(), int64_t{0});
  };
  for (int k = 0; k + 1 < static_cast<int>(empty_count.size()) &&
                           total_empty() > available;
       ++k) {
    const int64_t excess = total_empty() - available;
    const int64_t merges = std::min(empty_count[k] / 2, excess);
    empty_count[k] -= 2 * merges;
    empty_count[k + 1] += merges;
  }
  if (total_empty() > available) {
    const int64_t min_groups =
        opt_.unit_width == opt_.max_width
            ? r_ / opt_.unit_width
            : PopCount(r_ / opt_.unit_width);
    return absl::FailedPreconditionError(absl::StrCat(
        "too few sequences: ", n, " sequences cannot give every rank a "
        "non-empty micro-batch in each of ", n_mb_, " micro-batch steps; "
        "need at least ", min_groups * n_mb_));
  }
  for (int k = static_cast<int>(empty_count.size()) - 1; k >= 0; --k) {
    for (int64_t j = 0; j < empty_count[k]; ++j) {
      Bin b;
      b.width = ClassWidth(k);
      bins_.push_back(b);
    }
  }

  // Volume still to place at unit width; below the tail threshold the
  // placement switches from least-loaded to best fit.
  int64_t remaining = 0;
  for (int i = 0; i < n; ++i) {
    if (width[i] <= unit) remaining += Padded(i, unit);
  }
  const double tail_volume = tail_fraction_ * static_cast<double>(slots) * cap_;
  int next_wide = 0;
  for (int i : order) {
    if (width[i] > unit) {
      Add(i, next_wide++);
      continue;
    }
    const bool tail = static_cast<double>(remaining) <= tail_volume;
    remaining -= Padded(i, unit);
    if (!(tail ? PlaceBestFit(i) : Place(i))) {
      return absl::ResourceExhaustedError("sequences do not fit");
    }
  }
  if (absl::Status s = FillEmptyBins(); !s.ok()) {
    const int64_t min_groups =
        opt_.unit_width == opt_.max_width ? r_ / opt_.unit_width
                                          : PopCount(r_ / opt_.unit_width);
    return absl::FailedPreconditionError(absl::StrCat(
        "too few sequences: ", n, " sequences cannot fill every group of ",
        n_mb_, " micro-batch steps; need at least ", min_groups * n_mb_));
  }
  load_indexed_ = false;
  resid_indexed_ = false;
  by_load_.clear();
  by_resid_.clear();
  RETURN_IF_ERROR(ComposeSteps());
  EqualizeSteps();
  AssignPositions();
  BalanceRanks();
  return Emit();
}
}  // namespace internal
}  // namespace rollpack
