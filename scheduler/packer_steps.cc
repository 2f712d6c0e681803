// Packer phases after placement: bins into steps, steps levelled, positions
// and rank balance.
#include <algorithm>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "scheduler/packer.h"

namespace rollpack {
namespace internal {

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
  const int nw = NumWidthClasses();
  std::vector<std::vector<int>> by_width(nw);
  for (int b : order) by_width[WidthClass(bins_[b].width)].push_back(b);
  std::vector<size_t> head(nw, 0);
  std::vector<int64_t> count(nw, 0);
  for (int k = 0; k < nw; ++k) count[k] = by_width[k].size();

  auto achievable = [&](int64_t rem) {
    for (int k = nw - 1; k >= 0 && rem > 0; --k) {
      const int64_t w = ClassWidth(k);
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
        const int w = ClassWidth(k);
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
      const int k = WidthClass(bins_[pick].width);
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

std::vector<int> Packer::FirstOfEachLength(const std::vector<int>& items) const {
  // Small bins (long sequences) rarely repeat a length: not worth a set.
  if (items.size() <= 32) return items;
  std::vector<int> out;
  absl::flat_hash_set<int64_t> seen;
  for (int i : items) {
    if (seen.insert(len_[i]).second) out.push_back(i);
  }
  return out;
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
      // Every quantity below depends on a sequence's length alone, so the
      // first item of each length stands for all of that length: the same
      // move or swap is found (ties go to the first, as before), in time
      // linear in the bins rather than the product of their sizes (10^6
      // one-token samples were quadratic here).
      const std::vector<int> from_hi = FirstOfEachLength(bh.items);
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
        const std::vector<int> from_lo = FirstOfEachLength(bl.items);
        for (int x : from_hi) {
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
          for (int y : from_lo) {
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
      // Descending power-of-two widths (dynamic CP) always leave enough
      // aligned blocks; static CP has one width, cp, and dp blocks of it.
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

}  // namespace internal
}  // namespace rollpack
