// CPU agreement, also the reference the GPU test checks the CUDA kernel
// against: a partial sort with the id tie-break and sorted-set comparisons,
// nothing shared with the warp-level GPU version.
#include "kernels/agreement.h"

#include <algorithm>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cpu_helpers.h"

namespace rollpack::kernels {

using internal::LoadIdx;
using internal::LoadLogit;

double FractionDiffer(const AgreementStats& s) {
  return s.rows_counted > 0 ? double(s.rows_differ) / double(s.rows_counted) : 0.0;
}
double MeanOverlap(const AgreementStats& s, int k) {
  return s.rows_counted > 0 && k > 0
             ? double(s.overlap_sum) / (double(s.rows_counted) * double(k))
             : 0.0;
}

KernelStatus ValidateAgreementLogits(const AgreementLogitsArgs& a) {
  if (a.rows < 0 || a.layers < 0)
    return KernelStatus::InvalidArgument("rows and layers must be >= 0");
  if (a.experts < 1 || a.experts > kMaxExperts)
    return KernelStatus::InvalidArgument("E must be in [1, 1024], got " +
                                         std::to_string(a.experts));
  if (auto s = internal::CheckK(a.k); !s.ok()) return s;
  if (a.k > a.experts) return KernelStatus::InvalidArgument("K > E");
  if (a.logits_type != FloatType::kF32 && a.logits_type != FloatType::kBF16)
    return KernelStatus::InvalidArgument("logits must be fp32 or bf16");
  if (a.rows > 0 && a.layers > 0 && a.logits == nullptr)
    return KernelStatus::InvalidArgument("null logits");
  if (a.logits_layer_stride != -1 && a.logits_layer_stride < a.rows * a.experts)
    return KernelStatus::InvalidArgument("logits_layer_stride < rows * E");
  return internal::CheckView(a.replay, "replay", a.rows, a.k, true);
}

KernelStatus ValidateAgreementIds(const AgreementIdsArgs& a) {
  if (a.rows < 0 || a.layers < 0)
    return KernelStatus::InvalidArgument("rows and layers must be >= 0");
  if (auto s = internal::CheckK(a.k); !s.ok()) return s;
  if (auto s = internal::CheckView(a.live, "live", a.rows, a.k, true); !s.ok()) return s;
  return internal::CheckView(a.replay, "replay", a.rows, a.k, true);
}

namespace cpu {

namespace {

// |set(a) & set(b)| and set(a) == set(b), K small.
void CompareSets(const int64_t* live, const int64_t* rep, int k, bool* differ,
                 int64_t* overlap) {
  std::vector<int64_t> sl(live, live + k), sr(rep, rep + k);
  std::sort(sl.begin(), sl.end());
  sl.erase(std::unique(sl.begin(), sl.end()), sl.end());
  std::sort(sr.begin(), sr.end());
  sr.erase(std::unique(sr.begin(), sr.end()), sr.end());
  std::vector<int64_t> inter;
  std::set_intersection(sl.begin(), sl.end(), sr.begin(), sr.end(),
                        std::back_inserter(inter));
  *differ = sl != sr;
  *overlap = int64_t(inter.size());
}

}  // namespace

KernelStatus AgreementFromLogits(const AgreementLogitsArgs& a, AgreementStats* stats) {
  if (auto s = ValidateAgreementLogits(a); !s.ok()) return s;
  if (a.layers > 0 && stats == nullptr) return KernelStatus::InvalidArgument("null stats");
  const int e_n = a.experts;
  const int64_t lls = a.logits_layer_stride == -1 ? a.rows * e_n : a.logits_layer_stride;
  std::vector<int> order(e_n);
  std::vector<float> v(e_n);
  std::vector<int64_t> live(a.k), rep(a.k);
  for (int64_t l = 0; l < a.layers; ++l) {
    AgreementStats st;
    for (int64_t r = 0; r < a.rows; ++r) {
      if (a.mask && a.mask[r] == 0) continue;
      for (int e = 0; e < e_n; ++e)
        v[e] = float(LoadLogit(a.logits, a.logits_type, l * lls + r * e_n + e));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + a.k, order.end(),
                        [&](int x, int y) { return v[x] > v[y] || (v[x] == v[y] && x < y); });
      for (int k = 0; k < a.k; ++k) {
        live[k] = order[k];
        rep[k] = LoadIdx(a.replay, l * a.replay.layer_stride + r * a.replay.row_stride + k);
      }
      bool d;
      int64_t ov;
      CompareSets(live.data(), rep.data(), a.k, &d, &ov);
      st.rows_counted++;
      st.rows_differ += d;
      st.overlap_sum += ov;
    }
    stats[l] = st;
  }
  return KernelStatus::Ok();
}

KernelStatus AgreementFromIds(const AgreementIdsArgs& a, AgreementStats* stats) {
  if (auto s = ValidateAgreementIds(a); !s.ok()) return s;
  if (a.layers > 0 && stats == nullptr) return KernelStatus::InvalidArgument("null stats");
  std::vector<int64_t> live(a.k), rep(a.k);
  for (int64_t l = 0; l < a.layers; ++l) {
    AgreementStats st;
    for (int64_t r = 0; r < a.rows; ++r) {
      if (a.mask && a.mask[r] == 0) continue;
      for (int k = 0; k < a.k; ++k) {
        live[k] = LoadIdx(a.live, l * a.live.layer_stride + r * a.live.row_stride + k);
        rep[k] = LoadIdx(a.replay, l * a.replay.layer_stride + r * a.replay.row_stride + k);
      }
      bool d;
      int64_t ov;
      CompareSets(live.data(), rep.data(), a.k, &d, &ov);
      st.rows_counted++;
      st.rows_differ += d;
      st.overlap_sum += ov;
    }
    stats[l] = st;
  }
  return KernelStatus::Ok();
}

}  // namespace cpu
}  // namespace rollpack::kernels
