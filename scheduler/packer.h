// The packer behind both CP schedulers (packing.h): sequences into bins,
// bins into steps, steps levelled and ranks balanced. Internal to the
// scheduler library.
#ifndef ROLLPACK_SCHEDULER_PACKER_H_
#define ROLLPACK_SCHEDULER_PACKER_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/pack_options.h"
#include "scheduler/plan.h"
#include "scheduler/topology.h"

namespace rollpack {
namespace internal {

inline int Log2(int x) {
  int k = 0;
  while ((1 << (k + 1)) <= x) ++k;
  return k;
}

inline int PopCount(int x) {
  int n = 0;
  for (; x != 0; x &= x - 1) ++n;
  return n;
}

struct Bin {
  int width = 1;
  int64_t tokens = 0;  // padded tokens of the whole group
  double cost = 0;     // cost-model work of the whole group
  double attn = 0;     // L^2 work of the whole group
  std::vector<int> items;
};

// One packing attempt at a fixed micro-batch count; a Packer is used once.
class Packer {
 public:
  Packer(absl::Span<const int64_t> lengths, const Topology& topology,
         const PackOptions& options, int num_microbatches,
         double tail_fraction)
      : tail_fraction_(tail_fraction),
        len_(lengths),
        t_(topology),
        opt_(options),
        n_mb_(num_microbatches),
        r_(topology.num_dpcp_ranks()),
        cap_(topology.max_tokens_per_rank) {
    for (int k = 0; k < NumWidthClasses(); ++k) {
      align_.push_back(SequenceAlignment(t_, ClassWidth(k)));
    }
    const int64_t a = align_[0];
    padded_unit_.resize(len_.size());
    for (size_t i = 0; i < len_.size(); ++i) padded_unit_[i] = CeilTo(len_[i], a);
  }

  absl::StatusOr<Plan> Run();

 private:
  // A group's width is unit_width << k, k = 0, 1, ... (its width class):
  // a static CP group's is cp, of any size (3 is 3, not 2); dynamic CP's
  // are powers of two from min_cp.
  int WidthClass(int w) const { return Log2(w / std::max(opt_.unit_width, 1)); }
  int ClassWidth(int k) const { return std::max(opt_.unit_width, 1) << k; }
  int NumWidthClasses() const {
    return WidthClass(std::max(opt_.max_width, std::max(opt_.unit_width, 1))) + 1;
  }
  int64_t Padded(int i, int w) const {
    if (w == opt_.unit_width) return padded_unit_[i];
    return CeilTo(len_[i], align_[WidthClass(w)]);
  }
  double Cost(int64_t p) const { return t_.cost(p); }
  static double Attn(int64_t p) { return static_cast<double>(p) * p; }
  double Load(const Bin& b) const {
    return (b.cost / tau_c_ + b.attn / tau_a_) / b.width;
  }
  // The larger of the two normalised components: what a step's slowest rank
  // is judged by.
  double PeakLoad(const Bin& b) const {
    return (t_.cost.quadratic > 0 ? b.attn / tau_a_ : b.cost / tau_c_) / b.width;
  }
  int64_t Residual(const Bin& b) const { return b.width * cap_ - b.tokens; }
  bool Fits(int i, const Bin& b) const {
    return b.tokens + Padded(i, b.width) <= b.width * cap_;
  }

  // The two orders are built when first needed and kept from then on, so
  // the levelling phase pays for one of them only.
  void Index(int b) {
    if (load_indexed_) by_load_.emplace(Load(bins_[b]), b);
    if (resid_indexed_) by_resid_.emplace(Residual(bins_[b]), b);
  }
  void Unindex(int b) {
    if (load_indexed_) by_load_.erase({Load(bins_[b]), b});
    if (resid_indexed_) by_resid_.erase({Residual(bins_[b]), b});
  }
  const absl::btree_set<std::pair<double, int>>& ByLoad() {
    if (!load_indexed_) {
      load_indexed_ = true;
      for (int b = 0; b < static_cast<int>(bins_.size()); ++b) {
        by_load_.emplace(Load(bins_[b]), b);
      }
    }
    return by_load_;
  }
  const absl::btree_set<std::pair<int64_t, int>>& ByResidual() {
    if (!resid_indexed_) {
      resid_indexed_ = true;
      for (int b = 0; b < static_cast<int>(bins_.size()); ++b) {
        by_resid_.emplace(Residual(bins_[b]), b);
      }
    }
    return by_resid_;
  }
  void Add(int i, int b) {
    Unindex(b);
    Bin& bin = bins_[b];
    const int64_t p = Padded(i, bin.width);
    bin.tokens += p;
    bin.cost += Cost(p);
    bin.attn += Attn(p);
    bin.items.push_back(i);
    Index(b);
  }
  void Remove(int i, int b) {
    Unindex(b);
    Bin& bin = bins_[b];
    const int64_t p = Padded(i, bin.width);
    bin.tokens -= p;
    bin.cost -= Cost(p);
    bin.attn -= Attn(p);
    bin.items.erase(std::find(bin.items.begin(), bin.items.end(), i));
    Index(b);
  }

  bool Place(int i);
  bool PlaceBestFit(int i);
  bool Repair(int i);
  absl::Status FillEmptyBins();
  absl::Status ComposeSteps();
  void EqualizeSteps();
  // `items` with only the first of each length kept, in order.
  std::vector<int> FirstOfEachLength(const std::vector<int>& items) const;
  void AssignPositions();
  void BalanceRanks();
  Plan Emit() const;

  const double tail_fraction_;
  absl::Span<const int64_t> len_;
  const Topology& t_;
  const PackOptions& opt_;
  const int n_mb_;
  const int r_;
  const int64_t cap_;
  std::vector<int64_t> align_;
  std::vector<int64_t> padded_unit_;  // each sequence padded at unit width
  double tau_c_ = 1, tau_a_ = 1;
  std::vector<Bin> bins_;
  bool load_indexed_ = false;
  bool resid_indexed_ = false;
  absl::btree_set<std::pair<double, int>> by_load_;
  absl::btree_set<std::pair<int64_t, int>> by_resid_;
  // steps_[s]: the bins of step s; pos_[b]: first rank of bin b.
  std::vector<std::vector<int>> steps_;
  std::vector<int> pos_;
  std::vector<int> step_of_;
};

}  // namespace internal
}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_PACKER_H_
