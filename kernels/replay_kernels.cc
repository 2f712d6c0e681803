// CPU reference implementation of the routing-replay kernels (see
// replay_kernels.h for the semantics). Straightforward loops, float64 inside.
#include "kernels/replay_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

namespace rollpack::kernels {

std::string KernelStatus::ToString() const {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT: " + message;
    case StatusCode::kInternal:
      return "INTERNAL: " + message;
  }
  return "UNKNOWN: " + message;
}

int IndexTypeSize(IndexType t) {
  switch (t) {
    case IndexType::kU8:
      return 1;
    case IndexType::kU16:
      return 2;
    case IndexType::kI32:
      return 4;
    case IndexType::kI64:
      return 8;
  }
  return 0;
}

double FractionDiffer(const AgreementStats& s) {
  return s.rows_counted > 0 ? double(s.rows_differ) / double(s.rows_counted) : 0.0;
}
double MeanOverlap(const AgreementStats& s, int k) {
  return s.rows_counted > 0 && k > 0
             ? double(s.overlap_sum) / (double(s.rows_counted) * double(k))
             : 0.0;
}

float Bf16ToFloat(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7FC0;
  u += 0x7FFF + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

namespace {

bool ValidIndexType(IndexType t) { return IndexTypeSize(t) != 0; }

KernelStatus CheckK(int k) {
  if (k < 1 || k > kMaxK)
    return KernelStatus::InvalidArgument("K must be in [1, 16], got " + std::to_string(k));
  return KernelStatus::Ok();
}

KernelStatus CheckView(const IndexView& v, const char* name, int64_t rows, int k,
                       bool layered) {
  if (!ValidIndexType(v.type))
    return KernelStatus::InvalidArgument(std::string(name) + ": bad index type");
  if (rows > 0 && v.data == nullptr)
    return KernelStatus::InvalidArgument(std::string(name) + ": null data");
  if (rows > 1 && v.row_stride < k)
    return KernelStatus::InvalidArgument(std::string(name) + ": row_stride < K");
  if (layered && v.layer_stride < 0)
    return KernelStatus::InvalidArgument(std::string(name) + ": negative layer_stride");
  return KernelStatus::Ok();
}

int64_t LoadIdx(const IndexView& v, int64_t off) {
  switch (v.type) {
    case IndexType::kU8:
      return static_cast<const uint8_t*>(v.data)[off];
    case IndexType::kU16:
      return static_cast<const uint16_t*>(v.data)[off];
    case IndexType::kI32:
      return static_cast<const int32_t*>(v.data)[off];
    case IndexType::kI64:
      return static_cast<const int64_t*>(v.data)[off];
  }
  return -1;
}

double LoadLogit(const void* p, FloatType t, int64_t off) {
  if (t == FloatType::kF32) return static_cast<const float*>(p)[off];
  return Bf16ToFloat(static_cast<const uint16_t*>(p)[off]);
}

}  // namespace

KernelStatus ValidateUnpack(const UnpackArgs& a) {
  if (a.rows < 0 || a.layers < 0)
    return KernelStatus::InvalidArgument("rows and layers must be >= 0");
  if (auto s = CheckK(a.k); !s.ok()) return s;
  if (a.in_type != IndexType::kU8 && a.in_type != IndexType::kU16)
    return KernelStatus::InvalidArgument("replay_experts must be uint8 or uint16");
  if (a.out_type != OutIndexType::kI32 && a.out_type != OutIndexType::kI64)
    return KernelStatus::InvalidArgument("output must be int32 or int64");
  const int64_t n = a.rows * a.layers;
  if (n > 0 && (a.experts == nullptr || a.out == nullptr))
    return KernelStatus::InvalidArgument("null experts or out");
  if (a.out_layer_stride != -1 && a.out_layer_stride < a.rows * a.k)
    return KernelStatus::InvalidArgument("out_layer_stride < rows * K");
  return KernelStatus::Ok();
}

KernelStatus ValidateApply(const ApplyArgs& a) {
  if (a.rows < 0) return KernelStatus::InvalidArgument("rows must be >= 0");
  if (a.experts < 1 || a.experts > kMaxExperts)
    return KernelStatus::InvalidArgument("E must be in [1, 1024], got " +
                                         std::to_string(a.experts));
  if (auto s = CheckK(a.k); !s.ok()) return s;
  if (a.k > a.experts) return KernelStatus::InvalidArgument("K > E");
  if (a.logits_type != FloatType::kF32 && a.logits_type != FloatType::kBF16)
    return KernelStatus::InvalidArgument("logits must be fp32 or bf16");
  if (a.score != ScoreFunction::kSoftmax && a.score != ScoreFunction::kSigmoid)
    return KernelStatus::InvalidArgument("bad score function");
  if (a.rows > 0 && a.logits == nullptr)
    return KernelStatus::InvalidArgument("null logits");
  if (!std::isfinite(a.scale)) return KernelStatus::InvalidArgument("scale not finite");
  return CheckView(a.ids, "ids", a.rows, a.k, false);
}

KernelStatus ValidateAgreementLogits(const AgreementLogitsArgs& a) {
  if (a.rows < 0 || a.layers < 0)
    return KernelStatus::InvalidArgument("rows and layers must be >= 0");
  if (a.experts < 1 || a.experts > kMaxExperts)
    return KernelStatus::InvalidArgument("E must be in [1, 1024], got " +
                                         std::to_string(a.experts));
  if (auto s = CheckK(a.k); !s.ok()) return s;
  if (a.k > a.experts) return KernelStatus::InvalidArgument("K > E");
  if (a.logits_type != FloatType::kF32 && a.logits_type != FloatType::kBF16)
    return KernelStatus::InvalidArgument("logits must be fp32 or bf16");
  if (a.rows > 0 && a.layers > 0 && a.logits == nullptr)
    return KernelStatus::InvalidArgument("null logits");
  if (a.logits_layer_stride != -1 && a.logits_layer_stride < a.rows * a.experts)
    return KernelStatus::InvalidArgument("logits_layer_stride < rows * E");
  return CheckView(a.replay, "replay", a.rows, a.k, true);
}

KernelStatus ValidateAgreementIds(const AgreementIdsArgs& a) {
  if (a.rows < 0 || a.layers < 0)
    return KernelStatus::InvalidArgument("rows and layers must be >= 0");
  if (auto s = CheckK(a.k); !s.ok()) return s;
  if (auto s = CheckView(a.live, "live", a.rows, a.k, true); !s.ok()) return s;
  return CheckView(a.replay, "replay", a.rows, a.k, true);
}

namespace cpu {

KernelStatus Unpack(const UnpackArgs& a) {
  if (auto s = ValidateUnpack(a); !s.ok()) return s;
  const int64_t ls = a.out_layer_stride == -1 ? a.rows * a.k : a.out_layer_stride;
  for (int64_t r = 0; r < a.rows; ++r) {
    const bool fill = a.masked_fill_minus_one && a.mask != nullptr && a.mask[r] == 0;
    for (int64_t l = 0; l < a.layers; ++l) {
      for (int k = 0; k < a.k; ++k) {
        const int64_t src = (r * a.layers + l) * a.k + k;
        int64_t v = a.in_type == IndexType::kU8
                        ? int64_t(static_cast<const uint8_t*>(a.experts)[src])
                        : int64_t(static_cast<const uint16_t*>(a.experts)[src]);
        if (fill) v = -1;
        const int64_t dst = l * ls + r * a.k + k;
        if (a.out_type == OutIndexType::kI64)
          static_cast<int64_t*>(a.out)[dst] = v;
        else
          static_cast<int32_t*>(a.out)[dst] = int32_t(v);
      }
    }
  }
  return KernelStatus::Ok();
}

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
