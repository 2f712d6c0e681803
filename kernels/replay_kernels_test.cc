// CPU fuzz tests of the routing-replay kernels' CPU implementation against
// independent references written differently: output-order loops for unpack,
// long-double log-sum-exp for apply forward, central finite differences of a
// long-double forward for apply backward, full stable sort + membership
// arrays for agreement.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/replay_kernels.h"
#include "kernels/testing.h"

namespace rollpack::kernels {
namespace {

using LD = long double;
using test_support::DistinctIds;
using test_support::StoreIdx;

double RelErr(const std::vector<double>& out, const std::vector<double>& ref) {
  LD num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(out[i])) return INFINITY;
    num += (LD(out[i]) - ref[i]) * (LD(out[i]) - ref[i]);
    den += LD(ref[i]) * ref[i];
  }
  if (den == 0) return std::sqrt(double(num));
  return std::sqrt(double(num / den));
}

// ------------------------------------------------------------------ unpack

TEST(UnpackCpu, FuzzAgainstOutputOrderLoops) {
  std::mt19937_64 rng(1);
  for (int iter = 0; iter < 300; ++iter) {
    const int64_t rows = iter % 17 == 0 ? 0 : std::uniform_int_distribution<int>(1, 70)(rng);
    const int64_t layers = std::uniform_int_distribution<int>(1, 9)(rng);
    const int k = std::uniform_int_distribution<int>(1, 16)(rng);
    const bool u16 = rng() & 1, i64 = rng() & 1, fill = rng() & 1, use_mask = rng() & 1;
    const int64_t pad = rng() % 3;  // extra elements between layers
    const int64_t ls = rows * k + pad;
    const int64_t n = rows * layers * k;
    std::vector<uint16_t> src(n);
    for (auto& v : src) v = uint16_t(rng() % (u16 ? 65536 : 256));
    std::vector<uint8_t> in8(n);
    for (int64_t i = 0; i < n; ++i) in8[i] = uint8_t(src[i]);
    std::vector<uint8_t> mask(rows);
    for (auto& m : mask) m = (rng() % 4) != 0;
    std::vector<int64_t> out64(layers * ls, 12345);
    std::vector<int32_t> out32(layers * ls, 12345);
    UnpackArgs a;
    a.experts = u16 ? static_cast<const void*>(src.data()) : in8.data();
    a.in_type = u16 ? IndexType::kU16 : IndexType::kU8;
    a.mask = use_mask ? mask.data() : nullptr;
    a.rows = rows;
    a.layers = layers;
    a.k = k;
    a.out = i64 ? static_cast<void*>(out64.data()) : out32.data();
    a.out_type = i64 ? OutIndexType::kI64 : OutIndexType::kI32;
    a.out_layer_stride = pad == 0 && (rng() & 1) ? -1 : ls;
    a.masked_fill_minus_one = fill;
    ASSERT_TRUE(cpu::Unpack(a).ok());
    for (int64_t l = 0; l < layers; ++l) {
      for (int64_t j = 0; j < ls; ++j) {
        const int64_t got = i64 ? out64[l * ls + j] : out32[l * ls + j];
        if (j >= rows * k) {  // padding must stay untouched
          ASSERT_EQ(got, 12345);
          continue;
        }
        const int64_t r = j / k, kk = j % k;
        int64_t want = src[r * layers * k + l * k + kk];
        if (fill && use_mask && mask[r] == 0) want = -1;
        ASSERT_EQ(got, want) << "iter " << iter << " l " << l << " j " << j;
      }
    }
  }
}

TEST(UnpackCpu, RejectsBadShapes) {
  uint8_t in[4] = {};
  int64_t out[4] = {};
  UnpackArgs a;
  a.experts = in;
  a.out = out;
  a.rows = 1;
  a.layers = 1;
  a.k = 0;
  EXPECT_EQ(cpu::Unpack(a).code, StatusCode::kInvalidArgument);
  a.k = 17;
  EXPECT_EQ(cpu::Unpack(a).code, StatusCode::kInvalidArgument);
  a.k = 4;
  a.in_type = IndexType::kI32;
  EXPECT_EQ(cpu::Unpack(a).code, StatusCode::kInvalidArgument);
  a.in_type = IndexType::kU8;
  a.out_layer_stride = 3;
  EXPECT_EQ(cpu::Unpack(a).code, StatusCode::kInvalidArgument);
  a.out_layer_stride = -1;
  EXPECT_TRUE(cpu::Unpack(a).ok());
  a.rows = 0;
  a.experts = nullptr;
  a.out = nullptr;
  EXPECT_TRUE(cpu::Unpack(a).ok());
}

// ------------------------------------------------------------------- apply

struct ApplyCase {
  int64_t rows;
  int e, k;
  bool bf16, sigmoid, renorm;
  float scale;
  IndexType id_type;
  std::vector<float> logits;      // values (bf16-representable when bf16)
  std::vector<uint16_t> logits_bf16;
  std::vector<int64_t> ids;       // [rows, K]
  std::vector<uint8_t> ids_buf;
  std::vector<float> grad;        // [rows, K]
  ApplyArgs args() const {
    ApplyArgs a;
    a.logits = bf16 ? static_cast<const void*>(logits_bf16.data()) : logits.data();
    a.logits_type = bf16 ? FloatType::kBF16 : FloatType::kF32;
    a.ids = {ids_buf.data(), id_type, k, 0};
    a.rows = rows;
    a.experts = e;
    a.k = k;
    a.score = sigmoid ? ScoreFunction::kSigmoid : ScoreFunction::kSoftmax;
    a.renormalize = renorm;
    a.scale = scale;
    return a;
  }
};

ApplyCase RandomApplyCase(std::mt19937_64& rng, int iter, bool allow_dup) {
  ApplyCase c;
  c.rows = iter % 13 == 0 ? 0 : std::uniform_int_distribution<int>(1, 12)(rng);
  const int emax = iter % 5 == 0 ? 1024 : 300;
  c.e = std::uniform_int_distribution<int>(1, emax)(rng);
  c.k = std::uniform_int_distribution<int>(1, std::min(16, c.e))(rng);
  c.bf16 = rng() & 1;
  c.sigmoid = rng() & 1;
  c.renorm = rng() & 1;
  c.scale = (rng() & 1) ? 1.0f : 2.5f;
  c.id_type = IndexType(rng() % 4);
  if (c.id_type == IndexType::kU8 && c.e > 256) c.id_type = IndexType::kU16;
  std::normal_distribution<float> nd(0.f, 2.f);
  c.logits.resize(c.rows * c.e);
  c.logits_bf16.resize(c.rows * c.e);
  for (size_t i = 0; i < c.logits.size(); ++i) {
    float v = nd(rng);
    if (c.bf16) {
      c.logits_bf16[i] = FloatToBf16(v);
      v = Bf16ToFloat(c.logits_bf16[i]);
    }
    c.logits[i] = v;
  }
  c.ids.resize(c.rows * c.k);
  c.ids_buf.assign(c.rows * c.k * 8, 0);
  for (int64_t r = 0; r < c.rows; ++r) {
    std::vector<int64_t> ids = DistinctIds(rng, c.e, c.k);
    if (allow_dup && c.k > 1 && (rng() & 1)) ids[c.k - 1] = ids[0];
    for (int k = 0; k < c.k; ++k) {
      c.ids[r * c.k + k] = ids[k];
      StoreIdx(c.ids_buf, c.id_type, r * c.k + k, ids[k]);
    }
  }
  c.grad.resize(c.rows * c.k);
  for (auto& g : c.grad) g = nd(rng);
  return c;
}

// Long-double probs of one row at the given logits, via log-sum-exp (softmax)
// or 1 / (1 + e^-x) (sigmoid).
std::vector<LD> RefRowProbs(const ApplyCase& c, const std::vector<LD>& x, int64_t r) {
  std::vector<LD> p(c.k);
  LD lse = 0;
  if (!c.sigmoid) {
    LD mx = x[0];
    for (LD v : x) mx = std::max(mx, v);
    LD s = 0;
    for (LD v : x) s += std::exp(v - mx);
    lse = mx + std::log(s);
  }
  LD sum = 0;
  for (int k = 0; k < c.k; ++k) {
    const LD xi = x[c.ids[r * c.k + k]];
    p[k] = c.sigmoid ? 1 / (1 + std::exp(-xi)) : std::exp(xi - lse);
    sum += p[k];
  }
  if (c.renorm)
    for (auto& v : p) v /= sum + (c.sigmoid ? LD(1e-20) : LD(0));
  for (auto& v : p) v *= c.scale;
  return p;
}

TEST(ApplyCpu, ForwardFuzzAgainstLongDouble) {
  std::mt19937_64 rng(2);
  for (int iter = 0; iter < 200; ++iter) {
    ApplyCase c = RandomApplyCase(rng, iter, /*allow_dup=*/false);
    std::vector<float> probs(c.rows * c.k, NAN), dense(c.rows * c.e, NAN);
    std::vector<uint8_t> map(c.rows * c.e, 7);
    ASSERT_TRUE(cpu::ApplyForward(c.args(), {probs.data(), map.data(), dense.data()}).ok());
    std::vector<double> got, ref;
    for (int64_t r = 0; r < c.rows; ++r) {
      std::vector<LD> x(c.logits.begin() + r * c.e, c.logits.begin() + (r + 1) * c.e);
      std::vector<LD> p = RefRowProbs(c, x, r);
      for (int k = 0; k < c.k; ++k) {
        got.push_back(probs[r * c.k + k]);
        ref.push_back(double(p[k]));
      }
      for (int e = 0; e < c.e; ++e) {
        int want_map = 0;
        double want_dense = 0;
        for (int k = 0; k < c.k; ++k)
          if (c.ids[r * c.k + k] == e) {
            want_map = 1;
            want_dense = double(p[k]);
          }
        ASSERT_EQ(map[r * c.e + e], want_map);
        got.push_back(dense[r * c.e + e]);
        ref.push_back(want_dense);
      }
    }
    EXPECT_LT(RelErr(got, ref), 1e-6) << "iter " << iter << " E " << c.e << " K " << c.k;
  }
}

TEST(ApplyCpu, SoftmaxRenormEqualsSoftmaxOverSelectedLogits) {
  // Megatron's non-pre-softmax path: softmax over the K selected logits.
  std::mt19937_64 rng(3);
  for (int iter = 1; iter < 50; ++iter) {
    ApplyCase c = RandomApplyCase(rng, iter, false);
    c.sigmoid = false;
    c.renorm = true;
    c.scale = 1.0f;
    std::vector<float> probs(c.rows * c.k);
    ASSERT_TRUE(cpu::ApplyForward(c.args(), {probs.data(), nullptr, nullptr}).ok());
    for (int64_t r = 0; r < c.rows; ++r) {
      LD mx = -INFINITY, s = 0;
      for (int k = 0; k < c.k; ++k) mx = std::max<LD>(mx, c.logits[r * c.e + c.ids[r * c.k + k]]);
      for (int k = 0; k < c.k; ++k) s += std::exp(c.logits[r * c.e + c.ids[r * c.k + k]] - mx);
      for (int k = 0; k < c.k; ++k) {
        const LD want = std::exp(c.logits[r * c.e + c.ids[r * c.k + k]] - mx) / s;
        EXPECT_NEAR(probs[r * c.k + k], double(want), 1e-6);
      }
    }
  }
}

TEST(ApplyCpu, BackwardFuzzAgainstFiniteDifferences) {
  std::mt19937_64 rng(4);
  for (int iter = 0; iter < 120; ++iter) {
    ApplyCase c = RandomApplyCase(rng, iter, /*allow_dup=*/true);
    if (c.e > 300) c = RandomApplyCase(rng, iter + 1, true);  // keep the O(E^2) reference cheap
    std::vector<float> gx32(c.rows * c.e, NAN);
    std::vector<uint16_t> gx16(c.rows * c.e, 0x7FC0);
    void* gx = c.bf16 ? static_cast<void*>(gx16.data()) : gx32.data();
    ASSERT_TRUE(cpu::ApplyBackward(c.args(), c.grad.data(), gx).ok());
    std::vector<double> got, ref;
    for (int64_t r = 0; r < c.rows; ++r) {
      std::vector<LD> x(c.logits.begin() + r * c.e, c.logits.begin() + (r + 1) * c.e);
      auto loss = [&](const std::vector<LD>& xx) {
        std::vector<LD> p = RefRowProbs(c, xx, r);
        LD l = 0;
        for (int k = 0; k < c.k; ++k) l += LD(c.grad[r * c.k + k]) * p[k];
        return l;
      };
      const LD h = 1e-5L;
      for (int e = 0; e < c.e; ++e) {
        std::vector<LD> xp = x, xm = x;
        xp[e] += h;
        xm[e] -= h;
        ref.push_back(double((loss(xp) - loss(xm)) / (2 * h)));
        got.push_back(c.bf16 ? Bf16ToFloat(gx16[r * c.e + e]) : gx32[r * c.e + e]);
      }
    }
    const double tol = c.bf16 ? 1e-2 : 1e-6;
    EXPECT_LT(RelErr(got, ref), tol) << "iter " << iter << " E " << c.e << " K " << c.k
                                     << " sigmoid " << c.sigmoid << " renorm " << c.renorm;
  }
}

TEST(ApplyCpu, RenormalizedSingleExpertHasZeroGradient) {
  // K = 1 with renormalisation: probs == scale whatever the logits.
  std::mt19937_64 rng(6);
  for (int iter = 1; iter < 20; ++iter) {
    ApplyCase c = RandomApplyCase(rng, iter, false);
    if (c.rows == 0) continue;
    c.k = 1;
    c.renorm = true;
    c.ids.resize(c.rows);
    for (int64_t r = 0; r < c.rows; ++r) {
      c.ids[r] = int64_t(rng() % c.e);
      StoreIdx(c.ids_buf, c.id_type, r, c.ids[r]);
    }
    c.grad.resize(c.rows);
    std::vector<float> probs(c.rows);
    std::vector<float> gx32(c.rows * c.e, NAN);
    std::vector<uint16_t> gx16(c.rows * c.e, 0x7FC0);
    ASSERT_TRUE(cpu::ApplyForward(c.args(), {probs.data(), nullptr, nullptr}).ok());
    ASSERT_TRUE(cpu::ApplyBackward(c.args(), c.grad.data(),
                                   c.bf16 ? static_cast<void*>(gx16.data()) : gx32.data()).ok());
    for (float p : probs) EXPECT_FLOAT_EQ(p, c.scale);
    for (int64_t i = 0; i < c.rows * c.e; ++i)
      EXPECT_EQ(c.bf16 ? Bf16ToFloat(gx16[i]) : gx32[i], 0.0f);
  }
}

TEST(ApplyCpu, RejectsBadShapesAndIds) {
  float logits[8] = {};
  int64_t ids[2] = {0, 9};
  float probs[2];
  ApplyArgs a;
  a.logits = logits;
  a.ids = {ids, IndexType::kI64, 2, 0};
  a.rows = 1;
  a.experts = 8;
  a.k = 2;
  EXPECT_EQ(cpu::ApplyForward(a, {probs, nullptr, nullptr}).code, StatusCode::kInvalidArgument);
  ids[1] = 7;
  EXPECT_TRUE(cpu::ApplyForward(a, {probs, nullptr, nullptr}).ok());
  a.experts = 1025;
  EXPECT_EQ(cpu::ApplyForward(a, {probs, nullptr, nullptr}).code, StatusCode::kInvalidArgument);
  a.experts = 8;
  a.k = 9;
  EXPECT_EQ(cpu::ApplyForward(a, {probs, nullptr, nullptr}).code, StatusCode::kInvalidArgument);
  a.k = 2;
  a.rows = 0;
  EXPECT_TRUE(cpu::ApplyForward(a, {nullptr, nullptr, nullptr}).ok());
  EXPECT_TRUE(cpu::ApplyBackward(a, nullptr, nullptr).ok());
}

// --------------------------------------------------------------- agreement

struct AgreeRef {
  int64_t counted = 0, differ = 0, overlap = 0;
};

void RefCompare(const std::vector<int64_t>& live, const std::vector<int64_t>& rep, int range,
                AgreeRef* out) {
  std::vector<char> in_l(range + 1, 0), in_r(range + 1, 0);
  for (int64_t v : live) in_l[v] = 1;
  for (int64_t v : rep) in_r[v] = 1;
  int64_t ov = 0;
  bool differ = false;
  for (int i = 0; i <= range; ++i) {
    ov += in_l[i] && in_r[i];
    differ |= in_l[i] != in_r[i];
  }
  out->counted++;
  out->differ += differ;
  out->overlap += ov;
}

TEST(AgreementCpu, FromLogitsFuzzAgainstStableSort) {
  std::mt19937_64 rng(5);
  for (int iter = 0; iter < 150; ++iter) {
    const int64_t rows = iter % 11 == 0 ? 0 : std::uniform_int_distribution<int>(1, 40)(rng);
    const int64_t layers = std::uniform_int_distribution<int>(1, 4)(rng);
    const int e = std::uniform_int_distribution<int>(1, iter % 4 == 0 ? 1024 : 200)(rng);
    const int k = std::uniform_int_distribution<int>(1, std::min(16, e))(rng);
    const bool bf16 = rng() & 1, use_mask = rng() & 1;
    // Few distinct values so that ties are common.
    const int levels = (rng() & 1) ? 4 : 1000;
    std::vector<float> lf(layers * rows * e);
    std::vector<uint16_t> lb(lf.size());
    for (size_t i = 0; i < lf.size(); ++i) {
      lb[i] = FloatToBf16(float(int(rng() % levels)) * 0.37f - 3.f);
      lf[i] = bf16 ? Bf16ToFloat(lb[i]) : float(int(rng() % levels)) * 0.37f - 3.f;
    }
    IndexType it = IndexType(rng() % 4);
    if (it == IndexType::kU8 && e > 256) it = IndexType::kI32;
    // Replay ids stored as the received [rows, layers, K] buffer.
    std::vector<uint8_t> rep_buf(rows * layers * k * 8);
    std::vector<uint8_t> mask(rows);
    for (auto& m : mask) m = rng() % 5 != 0;
    std::vector<AgreeRef> want(layers);
    for (int64_t l = 0; l < layers; ++l) {
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<int> order(e);
        for (int i = 0; i < e; ++i) order[i] = i;
        const float* x = &lf[(l * rows + r) * e];
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return x[a] > x[b]; });
        std::vector<int64_t> live(order.begin(), order.begin() + k);
        std::vector<int64_t> rep;
        const int mode = rng() % 3;  // 0: same set shuffled, 1: random, 2: one swapped
        if (mode == 0) {
          rep = live;
          std::shuffle(rep.begin(), rep.end(), rng);
        } else if (mode == 1) {
          rep = DistinctIds(rng, e, k);
        } else {
          rep = live;
          if (e > k) rep[rng() % k] = order[k];
        }
        if (rng() % 8 == 0 && k > 1) rep[1] = rep[0];  // a duplicate
        for (int kk = 0; kk < k; ++kk)
          StoreIdx(rep_buf, it, (r * layers + l) * k + kk, rep[kk]);
        if (use_mask && mask[r] == 0) continue;
        RefCompare(live, rep, e, &want[l]);
      }
    }
    AgreementLogitsArgs a;
    a.logits = bf16 ? static_cast<const void*>(lb.data()) : lf.data();
    a.logits_type = bf16 ? FloatType::kBF16 : FloatType::kF32;
    a.replay = {rep_buf.data(), it, layers * k, k};
    a.mask = use_mask ? mask.data() : nullptr;
    a.rows = rows;
    a.layers = layers;
    a.experts = e;
    a.k = k;
    std::vector<AgreementStats> got(layers, AgreementStats{-1, -1, -1});
    ASSERT_TRUE(cpu::AgreementFromLogits(a, got.data()).ok());
    for (int64_t l = 0; l < layers; ++l) {
      EXPECT_EQ(got[l].rows_counted, want[l].counted) << iter;
      EXPECT_EQ(got[l].rows_differ, want[l].differ) << iter;
      EXPECT_EQ(got[l].overlap_sum, want[l].overlap) << iter;
    }
    // The ids variant with the reference's own live ids gives the same.
    std::vector<uint8_t> live_buf(layers * rows * k * 8);
    for (int64_t l = 0; l < layers; ++l)
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<int> order(e);
        for (int i = 0; i < e; ++i) order[i] = i;
        const float* x = &lf[(l * rows + r) * e];
        std::stable_sort(order.begin(), order.end(), [&](int a2, int b) { return x[a2] > x[b]; });
        for (int kk = 0; kk < k; ++kk)
          StoreIdx(live_buf, IndexType::kI64, (l * rows + r) * k + kk, order[kk]);
      }
    AgreementIdsArgs b;
    b.live = {live_buf.data(), IndexType::kI64, k, rows * k};
    b.replay = a.replay;
    b.mask = a.mask;
    b.rows = rows;
    b.layers = layers;
    b.k = k;
    std::vector<AgreementStats> got2(layers);
    ASSERT_TRUE(cpu::AgreementFromIds(b, got2.data()).ok());
    for (int64_t l = 0; l < layers; ++l) {
      EXPECT_EQ(got2[l].rows_differ, want[l].differ);
      EXPECT_EQ(got2[l].overlap_sum, want[l].overlap);
    }
  }
}

TEST(AgreementCpu, FractionsAndEmpty) {
  AgreementStats s{10, 3, 70};
  EXPECT_DOUBLE_EQ(FractionDiffer(s), 0.3);
  EXPECT_DOUBLE_EQ(MeanOverlap(s, 8), 70.0 / 80.0);
  AgreementStats z;
  EXPECT_EQ(FractionDiffer(z), 0.0);
  EXPECT_EQ(MeanOverlap(z, 8), 0.0);
  AgreementIdsArgs b;
  b.rows = 0;
  b.layers = 2;
  b.k = 4;
  std::vector<AgreementStats> st(2, AgreementStats{5, 5, 5});
  ASSERT_TRUE(cpu::AgreementFromIds(b, st.data()).ok());
  EXPECT_EQ(st[1].rows_counted, 0);
  b.k = 0;
  EXPECT_EQ(cpu::AgreementFromIds(b, st.data()).code, StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rollpack::kernels
