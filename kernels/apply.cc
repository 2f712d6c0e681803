// CPU apply forward/backward, also the reference the GPU test checks the CUDA
// kernels against: float64 inside, so that its own rounding is far below the
// tolerances the GPU results are held to.
#include "kernels/apply.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu_helpers.h"

namespace rollpack::kernels {

using internal::LoadIdx;
using internal::LoadLogit;

KernelStatus ValidateApply(const ApplyArgs& a) {
  if (a.rows < 0) return KernelStatus::InvalidArgument("rows must be >= 0");
  if (a.experts < 1 || a.experts > kMaxExperts)
    return KernelStatus::InvalidArgument("E must be in [1, 1024], got " +
                                         std::to_string(a.experts));
  if (auto s = internal::CheckK(a.k); !s.ok()) return s;
  if (a.k > a.experts) return KernelStatus::InvalidArgument("K > E");
  if (a.logits_type != FloatType::kF32 && a.logits_type != FloatType::kBF16)
    return KernelStatus::InvalidArgument("logits must be fp32 or bf16");
  if (a.score != ScoreFunction::kSoftmax && a.score != ScoreFunction::kSigmoid)
    return KernelStatus::InvalidArgument("bad score function");
  if (a.rows > 0 && a.logits == nullptr)
    return KernelStatus::InvalidArgument("null logits");
  if (!std::isfinite(a.scale)) return KernelStatus::InvalidArgument("scale not finite");
  return internal::CheckView(a.ids, "ids", a.rows, a.k, false);
}

namespace cpu {

namespace {

KernelStatus CheckIdsInRange(const ApplyArgs& a) {
  for (int64_t r = 0; r < a.rows; ++r)
    for (int k = 0; k < a.k; ++k) {
      const int64_t id = LoadIdx(a.ids, r * a.ids.row_stride + k);
      if (id < 0 || id >= a.experts)
        return KernelStatus::InvalidArgument("replay id " + std::to_string(id) +
                                             " outside [0, E) at row " +
                                             std::to_string(r));
    }
  return KernelStatus::Ok();
}

// Scores of one row in float64: softmax over all E or sigmoid.
void RowScores(const ApplyArgs& a, int64_t r, std::vector<double>& s) {
  const int e_n = a.experts;
  s.resize(e_n);
  for (int e = 0; e < e_n; ++e) s[e] = LoadLogit(a.logits, a.logits_type, r * e_n + e);
  if (a.score == ScoreFunction::kSoftmax) {
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double& v : s) {
      v = std::exp(v - mx);
      sum += v;
    }
    for (double& v : s) v /= sum;
  } else {
    for (double& v : s) v = 1.0 / (1.0 + std::exp(-v));
  }
}

double RenormEps(const ApplyArgs& a) {
  return a.score == ScoreFunction::kSigmoid ? 1e-20 : 0.0;
}

}  // namespace

KernelStatus ApplyForward(const ApplyArgs& a, const ApplyForwardOut& out) {
  if (auto s = ValidateApply(a); !s.ok()) return s;
  if (a.rows > 0 && out.probs == nullptr)
    return KernelStatus::InvalidArgument("null probs output");
  if (auto s = CheckIdsInRange(a); !s.ok()) return s;
  const int e_n = a.experts;
  std::vector<double> s;
  std::vector<int64_t> ids(a.k);
  std::vector<double> p(a.k);
  for (int64_t r = 0; r < a.rows; ++r) {
    RowScores(a, r, s);
    double sum = 0;
    for (int k = 0; k < a.k; ++k) {
      ids[k] = LoadIdx(a.ids, r * a.ids.row_stride + k);
      p[k] = s[ids[k]];
      sum += p[k];
    }
    const double denom = a.renormalize ? sum + RenormEps(a) : 1.0;
    for (int k = 0; k < a.k; ++k)
      out.probs[r * a.k + k] = float(double(a.scale) * p[k] / denom);
    if (out.routing_map) {
      std::fill_n(out.routing_map + r * e_n, e_n, uint8_t{0});
      for (int k = 0; k < a.k; ++k) out.routing_map[r * e_n + ids[k]] = 1;
    }
    if (out.probs_dense) {
      std::fill_n(out.probs_dense + r * e_n, e_n, 0.0f);
      for (int k = 0; k < a.k; ++k)
        out.probs_dense[r * e_n + ids[k]] = out.probs[r * a.k + k];
    }
  }
  return KernelStatus::Ok();
}

KernelStatus ApplyBackward(const ApplyArgs& a, const float* grad_probs,
                           void* grad_logits) {
  if (auto s = ValidateApply(a); !s.ok()) return s;
  if (a.rows > 0 && (grad_probs == nullptr || grad_logits == nullptr))
    return KernelStatus::InvalidArgument("null grad_probs or grad_logits");
  if (auto s = CheckIdsInRange(a); !s.ok()) return s;
  const int e_n = a.experts;
  std::vector<double> s, dx;
  std::vector<int64_t> ids(a.k);
  std::vector<double> p(a.k), dp(a.k);
  for (int64_t r = 0; r < a.rows; ++r) {
    RowScores(a, r, s);
    double sum = 0;
    for (int k = 0; k < a.k; ++k) {
      ids[k] = LoadIdx(a.ids, r * a.ids.row_stride + k);
      p[k] = s[ids[k]];
      sum += p[k];
    }
    // dL/dp_k.
    if (a.renormalize) {
      const double denom = sum + RenormEps(a);
      double gq = 0;  // sum_j g_j q_j with q_j = p_j / denom
      for (int k = 0; k < a.k; ++k) gq += double(grad_probs[r * a.k + k]) * (p[k] / denom);
      for (int k = 0; k < a.k; ++k)
        dp[k] = double(a.scale) * (double(grad_probs[r * a.k + k]) - gq) / denom;
    } else {
      for (int k = 0; k < a.k; ++k) dp[k] = double(a.scale) * grad_probs[r * a.k + k];
    }
    dx.assign(e_n, 0.0);
    if (a.score == ScoreFunction::kSoftmax) {
      double c = 0;
      for (int k = 0; k < a.k; ++k) c += dp[k] * p[k];
      for (int e = 0; e < e_n; ++e) dx[e] = -s[e] * c;
      for (int k = 0; k < a.k; ++k) dx[ids[k]] += s[ids[k]] * dp[k];
    } else {
      for (int k = 0; k < a.k; ++k) dx[ids[k]] += dp[k] * p[k] * (1.0 - p[k]);
    }
    for (int e = 0; e < e_n; ++e) {
      if (a.logits_type == FloatType::kF32)
        static_cast<float*>(grad_logits)[r * e_n + e] = float(dx[e]);
      else
        static_cast<uint16_t*>(grad_logits)[r * e_n + e] = FloatToBf16(float(dx[e]));
    }
  }
  return KernelStatus::Ok();
}

}  // namespace cpu
}  // namespace rollpack::kernels
