// CPU masked log-probabilities (masked_logprob.h), also the reference the GPU
// test holds the CUDA kernel to: float64 inside, every row's input checked.
#include "kernels/masked_logprob.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu_helpers.h"

namespace rollpack::kernels {

using internal::LoadLogit;

KernelStatus ValidateMaskedLogprob(const MaskedLogprobArgs& a) {
  if (a.rows < 0) return KernelStatus::InvalidArgument("rows must be >= 0, got " +
                                                       std::to_string(a.rows));
  if (a.vocab < 1 || a.vocab > std::numeric_limits<int32_t>::max())
    return KernelStatus::InvalidArgument("vocab must be in [1, 2^31), got " +
                                         std::to_string(a.vocab));
  if (a.logits_type != FloatType::kF32 && a.logits_type != FloatType::kBF16)
    return KernelStatus::InvalidArgument("logits must be fp32 or bf16");
  if (a.values_type != IndexType::kU16 && a.values_type != IndexType::kI32 &&
      a.values_type != IndexType::kI64)
    return KernelStatus::InvalidArgument("values must be uint16, int32 or int64");
  if (a.offsets_type != IndexType::kI32 && a.offsets_type != IndexType::kI64)
    return KernelStatus::InvalidArgument("offsets must be int32 or int64");
  if (a.targets_type != IndexType::kI32 && a.targets_type != IndexType::kI64)
    return KernelStatus::InvalidArgument("targets must be int32 or int64");
  if (a.num_values < 0)
    return KernelStatus::InvalidArgument("num_values must be >= 0, got " +
                                         std::to_string(a.num_values));
  if (a.num_values > 0 && a.values == nullptr)
    return KernelStatus::InvalidArgument("null values");
  if (a.offsets == nullptr) return KernelStatus::InvalidArgument("null offsets");
  if (a.rows > 0 && (a.logits == nullptr || a.targets == nullptr))
    return KernelStatus::InvalidArgument("null logits or targets");
  return KernelStatus::Ok();
}

namespace cpu {
namespace {

int64_t Load(const void* p, IndexType t, int64_t off) {
  return internal::LoadIdx(IndexView{p, t, 1, 0}, off);
}

// One row's list, checked: ids in [0, V), distinct; the target in [0, V).
struct Row {
  std::vector<int64_t> ids;  // empty = the whole vocabulary
  int64_t target = 0;
  bool target_kept = true;
};

KernelStatus LoadRow(const MaskedLogprobArgs& a, int64_t t, Row& row) {
  const int64_t lo = Load(a.offsets, a.offsets_type, t);
  const int64_t hi = Load(a.offsets, a.offsets_type, t + 1);
  if (lo < 0 || hi < lo || hi > a.num_values)
    return KernelStatus::InvalidArgument(
        "offsets of row " + std::to_string(t) + " are [" + std::to_string(lo) + ", " +
        std::to_string(hi) + "), outside [0, num_values = " + std::to_string(a.num_values) +
        "] or decreasing");
  row.target = Load(a.targets, a.targets_type, t);
  if (row.target < 0 || row.target >= a.vocab)
    return KernelStatus::InvalidArgument("target " + std::to_string(row.target) + " of row " +
                                         std::to_string(t) + " outside [0, V = " +
                                         std::to_string(a.vocab) + ")");
  row.ids.resize(hi - lo);
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t id = Load(a.values, a.values_type, i);
    if (id < 0 || id >= a.vocab)
      return KernelStatus::InvalidArgument("kept id " + std::to_string(id) + " of row " +
                                           std::to_string(t) + " outside [0, V = " +
                                           std::to_string(a.vocab) + ")");
    row.ids[i - lo] = id;
  }
  std::vector<int64_t> sorted = row.ids;
  std::sort(sorted.begin(), sorted.end());
  const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
  if (dup != sorted.end())
    return KernelStatus::InvalidArgument("kept id " + std::to_string(*dup) +
                                         " repeated in row " + std::to_string(t));
  row.target_kept = row.ids.empty() || std::binary_search(sorted.begin(), sorted.end(),
                                                          row.target);
  return KernelStatus::Ok();
}

double Logit(const MaskedLogprobArgs& a, int64_t t, int64_t v) {
  return LoadLogit(a.logits, a.logits_type, t * a.vocab + v);
}

// log sum exp over the row's kept ids (all of [0, V) when none), max-shifted.
double RowLse(const MaskedLogprobArgs& a, int64_t t, const Row& row) {
  const int64_t n = row.ids.empty() ? a.vocab : int64_t(row.ids.size());
  auto id = [&](int64_t i) { return row.ids.empty() ? i : row.ids[i]; };
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, Logit(a, t, id(i)));
  if (std::isinf(mx)) return mx;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(Logit(a, t, id(i)) - mx);
  return mx + std::log(sum);
}

void StoreGrad(const MaskedLogprobArgs& a, void* g, int64_t off, double v) {
  if (a.logits_type == FloatType::kF32)
    static_cast<float*>(g)[off] = float(v);
  else
    static_cast<uint16_t*>(g)[off] = FloatToBf16(float(v));
}

}  // namespace

KernelStatus MaskedLogprobForward(const MaskedLogprobArgs& a, float* logprobs, float* lse) {
  if (auto s = ValidateMaskedLogprob(a); !s.ok()) return s;
  if (a.rows > 0 && logprobs == nullptr)
    return KernelStatus::InvalidArgument("null logprobs output");
  Row row;
  for (int64_t t = 0; t < a.rows; ++t) {
    if (auto s = LoadRow(a, t, row); !s.ok()) return s;
    const double l = RowLse(a, t, row);
    logprobs[t] = row.target_kept ? float(Logit(a, t, row.target) - l)
                                  : -std::numeric_limits<float>::infinity();
    if (lse != nullptr) lse[t] = float(l);
  }
  return KernelStatus::Ok();
}

KernelStatus MaskedLogprobBackward(const MaskedLogprobArgs& a, const float* lse,
                                   const float* grad_logprobs, const float* grad_lse,
                                   void* grad_logits) {
  if (auto s = ValidateMaskedLogprob(a); !s.ok()) return s;
  if (a.rows > 0 && (lse == nullptr || grad_logprobs == nullptr || grad_logits == nullptr))
    return KernelStatus::InvalidArgument("null lse, grad_logprobs or grad_logits");
  Row row;
  for (int64_t t = 0; t < a.rows; ++t) {
    if (auto s = LoadRow(a, t, row); !s.ok()) return s;
    const double g = row.target_kept ? double(grad_logprobs[t]) : 0.0;
    const double h = grad_lse != nullptr ? double(grad_lse[t]) : 0.0;
    const double l = lse[t];
    auto grad = [&](int64_t v) {
      return (v == row.target ? g : 0.0) + (h - g) * std::exp(Logit(a, t, v) - l);
    };
    const int64_t base = t * a.vocab;
    if (row.ids.empty()) {
      for (int64_t v = 0; v < a.vocab; ++v) StoreGrad(a, grad_logits, base + v, grad(v));
    } else {
      for (int64_t v = 0; v < a.vocab; ++v) StoreGrad(a, grad_logits, base + v, 0.0);
      for (int64_t v : row.ids) StoreGrad(a, grad_logits, base + v, grad(v));
    }
  }
  return KernelStatus::Ok();
}

}  // namespace cpu
}  // namespace rollpack::kernels
