#include "scheduler/packing.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "absl/container/btree_set.h"
#include <utility>

#include "absl/strings/str_cat.h"

namespace rollpack {
namespace internal {
namespace {

// How many of the least loaded bins a placement looks at before it falls
// back to the bins with the most room. Fixed, so plans never depend on time.
constexpr int kScanLimit = 48;
// Repair looks at this many of the roomiest bins.
constexpr int kRepairBins = 24;
// Fill ratio (padded volume / capacity of the steps) above which packing
// starts with the best-fit tail.
constexpr double kTightFill = 0.998;

int Log2(int x) {
  int k = 0;
  while ((1 << (k + 1)) <= x) ++k;
  return k;
}

int PopCount(int x) {
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
    for (int w = 1; w <= std::max(opt_.max_width, 1); w *= 2) {
      align_.push_back(SequenceAlignment(t_, w));
    }
    const int64_t a = align_[Log2(opt_.unit_width)];
    padded_unit_.resize(len_.size());
    for (size_t i = 0; i < len_.size(); ++i) padded_unit_[i] = CeilTo(len_[i], a);
  }

  absl::StatusOr<Plan> Run();

 private:
  int64_t Padded(int i, int w) const {
    if (w == opt_.unit_width) return padded_unit_[i];
    return CeilTo(len_[i], align_[Log2(w)]);
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
  for (int a : roomy) {
    const int wa = bins_[a].width;
    const int64_t need = Padded(i, wa) - Residual(bins_[a]);
    for (int b : roomy) {
      if (b == a) continue;
      const int wb = bins_[b].width;
      const int64_t room_b = Residual(bins_[b]);
      for (int y : bins_[a].items) {
        if (opt_.min_width[y] > wb) continue;
        const int64_t ya = Padded(y, wa), yb = Padded(y, wb);
        if (ya >= need && yb <= room_b) {  // move y from A to B
          Remove(y, a);
          Add(y, b);
          Add(i, a);
          return true;
        }
        for (int z : bins_[b].items) {
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
absl::Status Packer::ComposeSteps() {
  const int nb = static_cast<int>(bins_.size());
  std::vector<int> order(nb);
  std::iota(order.begin(), order.end(), 0);
  std::vector<double> load(nb);
  for (int b = 0; b < nb; ++b) load[b] = PeakLoad(bins_[b]);
  std::sort(order.begin(), order.end(), [&](int x, int y) {
    if (load[x] != load[y]) return load[x] > load[y];
    return x < y;
  });
  const int nw = Log2(std::max(opt_.max_width, 1)) + 1;
  std::vector<std::vector<int>> by_width(nw);
  for (int b : order) by_width[Log2(bins_[b].width)].push_back(b);
  std::vector<size_t> head(nw, 0);
  std::vector<int64_t> count(nw, 0);
  for (int k = 0; k < nw; ++k) count[k] = by_width[k].size();

  auto achievable = [&](int64_t rem) {
    for (int k = nw - 1; k >= 0 && rem > 0; --k) {
      const int64_t w = int64_t{1} << k;
      rem -= std::min(count[k], rem / w) * w;
    }
    return rem == 0;
  };

  steps_.assign(n_mb_, {});
  step_of_.assign(nb, -1);
  for (int s = 0; s < n_mb_; ++s) {
    int64_t rem = r_;
    while (rem > 0) {
      int pick = -1;
      for (int k = 0; k < nw; ++k) {
        const int w = 1 << k;
        if (head[k] >= by_width[k].size() || w > rem) continue;
        const int b = by_width[k][head[k]];
        if (pick >= 0 && (load[b] < load[pick] ||
                          (load[b] == load[pick] && b > pick))) {
          continue;
        }
        --count[k];
        const bool ok = achievable(rem - w);
        ++count[k];
        if (ok) pick = b;
      }
      if (pick < 0) {
        return absl::ResourceExhaustedError("groups do not tile the steps");
      }
      const int k = Log2(bins_[pick].width);
      ++head[k];
      --count[k];
      rem -= bins_[pick].width;
      steps_[s].push_back(pick);
      step_of_[pick] = s;
    }
  }
  for (int k = 0; k < nw; ++k) {
    if (head[k] != by_width[k].size()) {
      return absl::ResourceExhaustedError("groups do not tile the steps");
    }
  }
  return absl::OkStatus();
}

// Bounded local search within each step: moves or swaps one sequence
// between the step's most loaded group and one of its least loaded ones
// while that lowers the step's maximum per-rank load. The budget is a fixed
// number of attempts per group, so plans stay deterministic.
void Packer::EqualizeSteps() {
  constexpr int kPartners = 3;
  for (int s = 0; s < n_mb_; ++s) {
    std::vector<int>& bins = steps_[s];
    if (bins.size() < 2) continue;
    const int max_iter = 2 * static_cast<int>(bins.size()) + 8;
    absl::btree_set<std::pair<double, int>> order;
    for (int b : bins) order.emplace(PeakLoad(bins_[b]), b);
    for (int iter = 0; iter < max_iter; ++iter) {
      bins.clear();
      auto it = order.begin();
      for (int k = 0; k < kPartners && it != order.end(); ++k, ++it) {
        bins.push_back(it->second);
      }
      const int hi = order.rbegin()->second;
      if (std::find(bins.begin(), bins.end(), hi) != bins.end()) {
        bins.erase(std::find(bins.begin(), bins.end(), hi));
      }
      bins.push_back(hi);
      const Bin& bh = bins_[hi];
      const double l_hi = PeakLoad(bh);
      double best = l_hi * (1 - 1e-9);
      int best_lo = -1, best_x = -1, best_y = -1;  // y == -1: move x
      for (int k = 0; k < kPartners && k + 1 < static_cast<int>(bins.size()); ++k) {
        const int lo = bins[k];
        const Bin& bl = bins_[lo];
        const int wh = bh.width, wl = bl.width;
        auto load_of = [&](const Bin& b, int64_t dt, double dc, double da) {
          (void)dt;
          return (t_.cost.quadratic > 0 ? (b.attn + da) / tau_a_
                                        : (b.cost + dc) / tau_c_) /
                 b.width;
        };
        for (int x : bh.items) {
          if (opt_.min_width[x] > wl) continue;
          const int64_t xh = Padded(x, wh), xl = Padded(x, wl);
          const double xch = Cost(xh), xah = Attn(xh), xcl = Cost(xl), xal = Attn(xl);
          if (bh.items.size() > 1 && bl.tokens + xl <= wl * cap_) {
            const double m = std::max(load_of(bh, -xh, -xch, -xah),
                                      load_of(bl, xl, xcl, xal));
            if (m < best) {
              best = m;
              best_lo = lo;
              best_x = x;
              best_y = -1;
            }
          }
          for (int y : bl.items) {
            if (opt_.min_width[y] > wh || len_[y] >= len_[x]) continue;
            const int64_t yh = Padded(y, wh), yl = Padded(y, wl);
            if (bh.tokens - xh + yh > wh * cap_ || bl.tokens - yl + xl > wl * cap_) {
              continue;
            }
            const double m = std::max(
                load_of(bh, 0, Cost(yh) - xch, Attn(yh) - xah),
                load_of(bl, 0, xcl - Cost(yl), xal - Attn(yl)));
            if (m < best) {
              best = m;
              best_lo = lo;
              best_x = x;
              best_y = y;
            }
          }
        }
        if (best_lo >= 0) break;
      }
      if (best_lo < 0) break;
      order.erase({PeakLoad(bins_[hi]), hi});
      order.erase({PeakLoad(bins_[best_lo]), best_lo});
      Remove(best_x, hi);
      Add(best_x, best_lo);
      if (best_y >= 0) {
        Remove(best_y, best_lo);
        Add(best_y, hi);
      }
      order.emplace(PeakLoad(bins_[hi]), hi);
      order.emplace(PeakLoad(bins_[best_lo]), best_lo);
    }
    bins.clear();
    for (const auto& e : order) bins.push_back(e.second);
  }
}

// Places each step's groups on aligned rank blocks, heaviest steps first,
// each group on the free block whose ranks have the least work so far.
void Packer::AssignPositions() {
  pos_.assign(bins_.size(), -1);
  std::vector<double> step_max(n_mb_, 0);
  for (int s = 0; s < n_mb_; ++s) {
    for (int b : steps_[s]) step_max[s] = std::max(step_max[s], Load(bins_[b]));
  }
  std::vector<int> step_order(n_mb_);
  std::iota(step_order.begin(), step_order.end(), 0);
  std::stable_sort(step_order.begin(), step_order.end(),
                   [&](int x, int y) { return step_max[x] > step_max[y]; });
  std::vector<double> total(r_, 0);
  std::vector<char> used(r_);
  for (int s : step_order) {
    std::vector<int> bins = steps_[s];
    std::stable_sort(bins.begin(), bins.end(), [&](int x, int y) {
      if (bins_[x].width != bins_[y].width) return bins_[x].width > bins_[y].width;
      return Load(bins_[x]) > Load(bins_[y]);
    });
    std::fill(used.begin(), used.end(), 0);
    // Widths descending; within a width, the heaviest group takes the free
    // aligned block whose ranks have the least work so far. Blocks of one
    // width are disjoint, so this is a sort of both lists.
    std::vector<std::pair<double, int>> blocks;
    for (size_t lo = 0; lo < bins.size();) {
      const int w = bins_[bins[lo]].width;
      size_t hi = lo;
      while (hi < bins.size() && bins_[bins[hi]].width == w) ++hi;
      blocks.clear();
      for (int start = 0; start + w <= r_; start += w) {
        bool free = true;
        double score = 0;
        for (int r = start; r < start + w; ++r) {
          if (used[r]) {
            free = false;
            break;
          }
          score += total[r];
        }
        if (free) blocks.emplace_back(score, start);
      }
      std::sort(blocks.begin(), blocks.end());
      // Descending power-of-two widths always leave enough aligned blocks.
      for (size_t k = lo; k < hi; ++k) {
        const int b = bins[k];
        const int start = blocks[k - lo].second;
        pos_[b] = start;
        const double l = Load(bins_[b]);
        for (int r = start; r < start + w; ++r) {
          used[r] = 1;
          total[r] += l;
        }
      }
      lo = hi;
    }
  }
}

// Bounded local search on the rank totals: swap two equal-width groups of
// one step between the most and the least loaded rank. Swaps within a step
// leave every step's maximum unchanged.
void Packer::BalanceRanks() {
  std::vector<int> owner(static_cast<size_t>(n_mb_) * r_, -1);
  std::vector<double> load(bins_.size());
  std::vector<double> total(r_, 0);
  for (int b = 0; b < static_cast<int>(bins_.size()); ++b) {
    load[b] = Load(bins_[b]);
    for (int r = pos_[b]; r < pos_[b] + bins_[b].width; ++r) {
      owner[static_cast<size_t>(step_of_[b]) * r_ + r] = b;
      total[r] += load[b];
    }
  }
  const int max_iterations = 4 * r_ + 64;
  for (int iter = 0; iter < max_iterations; ++iter) {
    const int hi = std::max_element(total.begin(), total.end()) - total.begin();
    const int lo = std::min_element(total.begin(), total.end()) - total.begin();
    if (total[hi] <= total[lo]) break;
    int best_step = -1;
    double best_max = total[hi];
    for (int s = 0; s < n_mb_; ++s) {
      const int bh = owner[static_cast<size_t>(s) * r_ + hi];
      const int bl = owner[static_cast<size_t>(s) * r_ + lo];
      if (bh == bl || bins_[bh].width != bins_[bl].width || load[bh] <= load[bl]) {
        continue;
      }
      const double d = load[bh] - load[bl];
      double new_max = 0;
      for (int r = pos_[bh]; r < pos_[bh] + bins_[bh].width; ++r) {
        new_max = std::max(new_max, total[r] - d);
      }
      for (int r = pos_[bl]; r < pos_[bl] + bins_[bl].width; ++r) {
        new_max = std::max(new_max, total[r] + d);
      }
      if (new_max < best_max) {
        best_max = new_max;
        best_step = s;
      }
    }
    if (best_step < 0) break;
    const int bh = owner[static_cast<size_t>(best_step) * r_ + hi];
    const int bl = owner[static_cast<size_t>(best_step) * r_ + lo];
    const double d = load[bh] - load[bl];
    const int w = bins_[bh].width;
    for (int k = 0; k < w; ++k) {
      total[pos_[bh] + k] -= d;
      total[pos_[bl] + k] += d;
      owner[static_cast<size_t>(best_step) * r_ + pos_[bh] + k] = bl;
      owner[static_cast<size_t>(best_step) * r_ + pos_[bl] + k] = bh;
    }
    std::swap(pos_[bh], pos_[bl]);
  }
}

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
  std::vector<int64_t> empty_count(Log2(std::max(opt_.max_width, 1)) + 1, 0);
  empty_count[Log2(unit)] = (slots - used) / unit;
  const int64_t available = n - num_wide;
  auto total_empty = [&] {
    return std::accumulate(empty_count.begin(), empty_count.end(), int64_t{0});
  };
  for (int k = Log2(unit); k + 1 < static_cast<int>(empty_count.size()) &&
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
      b.width = 1 << k;
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
  if (absl::Status s = ComposeSteps(); !s.ok()) return s;
  EqualizeSteps();
  AssignPositions();
  BalanceRanks();
  return Emit();
}

}  // namespace

int64_t LargestLengthThatFits(const Topology& topology, int cp_size) {
  const int64_t a = SequenceAlignment(topology, cp_size);
  return (int64_t{cp_size} * topology.max_tokens_per_rank) / a * a;
}

absl::Status ComputeMinWidths(absl::Span<const int64_t> lengths,
                              const Topology& topology, int max_width,
                              std::vector<int>* min_width) {
  // MinCpGroupSizeFor with the alignments computed once.
  const bool dynamic = topology.scheduler == SchedulerKind::kDynamicCp;
  const int first = dynamic ? topology.min_cp : topology.cp;
  const int last = dynamic ? MaxCpGroupSize(topology) : topology.cp;
  std::vector<std::pair<int, int64_t>> widths;  // (c, alignment)
  for (int c = first; c <= last; c *= 2) {
    widths.emplace_back(c, SequenceAlignment(topology, c));
  }
  min_width->assign(lengths.size(), 0);
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", i, " has length ", lengths[i], ", must be >= 1"));
    }
    int c = 0;
    for (const auto& [w, a] : widths) {
      if (CeilTo(lengths[i], a) / w <= topology.max_tokens_per_rank) {
        c = w;
        break;
      }
    }
    if (c == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", i, " has length ", lengths[i],
          " which fits on no allowed CP group (largest group ", max_width,
          " ranks, max_tokens_per_rank ", topology.max_tokens_per_rank,
          "); the largest length that fits is ",
          LargestLengthThatFits(topology, max_width)));
    }
    (*min_width)[i] = c;
  }
  return absl::OkStatus();
}

namespace {

int64_t PaddedVolume(absl::Span<const int64_t> lengths, const Topology& topology,
                     absl::Span<const int> min_width) {
  std::vector<int64_t> align;
  int64_t total = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int k = Log2(std::max(min_width[i], 1));
    if (static_cast<int>(align.size()) <= k) align.resize(k + 1, 0);
    if (align[k] == 0) align[k] = SequenceAlignment(topology, 1 << k);
    total += CeilTo(lengths[i], align[k]);
  }
  return total;
}

}  // namespace

int MicrobatchLowerBound(absl::Span<const int64_t> lengths,
                         const Topology& topology,
                         absl::Span<const int> min_width) {
  const int64_t total = PaddedVolume(lengths, topology, min_width);
  const int64_t per_step =
      int64_t{topology.num_dpcp_ranks()} * topology.max_tokens_per_rank;
  return static_cast<int>((total + per_step - 1) / per_step);
}

absl::StatusOr<Plan> PackIntoMicrobatches(absl::Span<const int64_t> lengths,
                                          const Topology& topology,
                                          const PackOptions& options,
                                          int num_microbatches) {
  // Nearly full steps leave too little slack for levelling all the way
  // down; close the gaps with best fit over the last 5% of the volume first.
  const int64_t volume = PaddedVolume(lengths, topology, options.min_width);
  const double fill = static_cast<double>(volume) /
                      (static_cast<double>(num_microbatches) *
                       topology.num_dpcp_ranks() * topology.max_tokens_per_rank);
  const std::vector<double> tails = fill > kTightFill
                                        ? std::vector<double>{0.05, 0.0, 0.1, 0.2}
                                        : std::vector<double>{0.0, 0.05, 0.1, 0.2};
  absl::Status last;
  for (double tail : tails) {
    Packer packer(lengths, topology, options, num_microbatches, tail);
    absl::StatusOr<Plan> plan = packer.Run();
    if (plan.ok() || !absl::IsResourceExhausted(plan.status())) return plan;
    last = plan.status();
  }
  return last;
}

absl::StatusOr<Plan> PackWithFewestMicrobatches(
    absl::Span<const int64_t> lengths, const Topology& topology,
    const PackOptions& options) {
  const int g = topology.microbatch_group_size;
  const int bound = MicrobatchLowerBound(lengths, topology, options.min_width);
  int n_mb = std::max(bound, 1);
  n_mb = (n_mb + g - 1) / g * g;
  absl::Status last = absl::OkStatus();
  const int n = static_cast<int>(lengths.size());
  for (; n_mb <= std::max(n, g); n_mb += g) {
    absl::StatusOr<Plan> plan =
        PackIntoMicrobatches(lengths, topology, options, n_mb);
    if (plan.ok()) {
      plan->stats.min_microbatches = bound;
      return plan;
    }
    if (!absl::IsResourceExhausted(plan.status())) return plan.status();
    last = plan.status();
  }
  const int groups = options.unit_width == options.max_width
                         ? topology.num_dpcp_ranks() / options.unit_width
                         : PopCount(topology.num_dpcp_ranks() / options.unit_width);
  return absl::FailedPreconditionError(absl::StrCat(
      "too few sequences: ", n, " sequences cannot be packed into ",
      "micro-batches that give every rank a non-empty one (", last.message(),
      "); need at least ", int64_t{groups} * std::max(bound, g)));
}

}  // namespace internal
}  // namespace rollpack
