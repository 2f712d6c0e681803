// CPU masked log-probabilities against an independent reference: the kept
// set as a membership array over the vocabulary, a long-double log-sum-exp
// without the max shift, the gradient from the softmax formula; and the
// gradient formula itself against central finite differences of the forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/masked_logprob.h"
#include "kernels/testing.h"

namespace rollpack::kernels {
namespace {

using LD = long double;
using test_support::EncodeIds;
constexpr float kInf = std::numeric_limits<float>::infinity();

// A problem in plain vectors, and the args that point into its encodings.
struct Case {
  int64_t rows = 0, vocab = 0;
  bool bf16 = false;
  std::vector<float> logits;           // as the kernel sees them (bf16-rounded when bf16)
  std::vector<uint16_t> logits_bf16;
  std::vector<std::vector<int64_t>> sets;
  std::vector<int64_t> targets;
  int64_t shift = 0;                   // offsets[0]: lists start past `shift` leading values
  IndexType values_type = IndexType::kI32, offsets_type = IndexType::kI64,
            targets_type = IndexType::kI64;
  std::vector<uint8_t> values_buf, offsets_buf, targets_buf;
  std::vector<int64_t> flat_offsets;

  MaskedLogprobArgs Args() {
    std::vector<int64_t> values(shift, 0), offsets{shift};
    for (const auto& s : sets) {
      values.insert(values.end(), s.begin(), s.end());
      offsets.push_back(int64_t(values.size()));
    }
    flat_offsets = offsets;
    values_buf = EncodeIds(values, values_type);
    offsets_buf = EncodeIds(offsets, offsets_type);
    targets_buf = EncodeIds(targets, targets_type);
    MaskedLogprobArgs a;
    a.logits = bf16 ? static_cast<const void*>(logits_bf16.data()) : logits.data();
    a.logits_type = bf16 ? FloatType::kBF16 : FloatType::kF32;
    a.rows = rows;
    a.vocab = vocab;
    a.values = values_buf.data();
    a.values_type = values_type;
    a.num_values = int64_t(values.size());
    a.offsets = offsets_buf.data();
    a.offsets_type = offsets_type;
    a.targets = targets_buf.data();
    a.targets_type = targets_type;
    return a;
  }
};

Case RandomCase(std::mt19937_64& rng, int64_t rows, int64_t vocab, bool bf16) {
  Case c;
  c.rows = rows;
  c.vocab = vocab;
  c.bf16 = bf16;
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int64_t i = 0; i < rows * vocab; ++i) {
    const float x = nd(rng);
    c.logits_bf16.push_back(FloatToBf16(x));
    c.logits.push_back(bf16 ? Bf16ToFloat(c.logits_bf16.back()) : x);
  }
  std::vector<int64_t> all(vocab);
  for (int64_t v = 0; v < vocab; ++v) all[v] = v;
  for (int64_t t = 0; t < rows; ++t) {
    const int kind = int(rng() % 8);  // 0: no mask, 1: target dropped, else a kept set
    std::shuffle(all.begin(), all.end(), rng);
    const int64_t n = kind == 0 ? 0 : 1 + int64_t(rng() % uint64_t(vocab));
    std::vector<int64_t> s(all.begin(), all.begin() + n);
    int64_t y = s.empty() ? int64_t(rng() % uint64_t(vocab)) : s[rng() % s.size()];
    if (kind == 1 && n < vocab) y = all[n];  // a kept set without the target
    c.sets.push_back(s);
    c.targets.push_back(y);
  }
  return c;
}

// Reference: membership over [0, V), long double, no max shift (the logits
// are small enough here).
struct Ref {
  std::vector<LD> lse, logprob;
  std::vector<bool> kept_target;
};

Ref Reference(const Case& c) {
  Ref r;
  for (int64_t t = 0; t < c.rows; ++t) {
    std::vector<bool> in(c.vocab, c.sets[t].empty());
    for (int64_t v : c.sets[t]) in[v] = true;
    LD sum = 0;
    for (int64_t v = 0; v < c.vocab; ++v)
      if (in[v]) sum += std::exp(LD(c.logits[t * c.vocab + v]));
    r.lse.push_back(std::log(sum));
    r.kept_target.push_back(in[c.targets[t]]);
    r.logprob.push_back(in[c.targets[t]] ? LD(c.logits[t * c.vocab + c.targets[t]]) - r.lse[t]
                                         : -LD(kInf));
  }
  return r;
}

float GradAt(const Case& c, const std::vector<uint8_t>& g, int64_t i) {
  if (!c.bf16) return reinterpret_cast<const float*>(g.data())[i];
  return Bf16ToFloat(reinterpret_cast<const uint16_t*>(g.data())[i]);
}

TEST(MaskedLogprobCpu, FuzzAgainstMembershipReference) {
  std::mt19937_64 rng(39);
  const IndexType vt[] = {IndexType::kU16, IndexType::kI32, IndexType::kI64};
  const IndexType ot[] = {IndexType::kI32, IndexType::kI64};
  for (int iter = 0; iter < 240; ++iter) {
    const int64_t rows = iter % 23 == 0 ? 0 : 1 + int64_t(rng() % 12);
    const int64_t vocab = 1 + int64_t(rng() % 300);
    Case c = RandomCase(rng, rows, vocab, iter % 2 == 1);
    c.values_type = vt[iter % 3];
    c.offsets_type = ot[(iter / 3) % 2];
    c.targets_type = ot[(iter / 6) % 2];
    c.shift = int64_t(rng() % 3);
    MaskedLogprobArgs a = c.Args();
    std::vector<float> lp(rows + 1, 7.f), lse(rows + 1, 7.f), glp(rows), glse(rows);
    ASSERT_TRUE(cpu::MaskedLogprobForward(a, lp.data(), lse.data()).ok());
    const Ref r = Reference(c);
    std::normal_distribution<float> nd;
    for (int64_t t = 0; t < rows; ++t) {
      EXPECT_NEAR(lse[t], double(r.lse[t]), 2e-5 * (1 + std::fabs(double(r.lse[t]))))
          << "iter " << iter << " row " << t;
      if (r.kept_target[t])
        EXPECT_NEAR(lp[t], double(r.logprob[t]), 2e-5 * (1 + std::fabs(double(r.logprob[t]))));
      else
        EXPECT_EQ(lp[t], -kInf) << "iter " << iter << " row " << t;
      glp[t] = nd(rng);
      glse[t] = iter % 4 < 2 ? 0.f : nd(rng);
    }
    EXPECT_EQ(lp[rows], 7.f);  // nothing written past the rows
    const int esz = c.bf16 ? 2 : 4;
    std::vector<uint8_t> g(size_t(rows * vocab) * esz, 0xAB);
    ASSERT_TRUE(cpu::MaskedLogprobBackward(a, lse.data(), glp.data(),
                                           iter % 4 < 2 ? nullptr : glse.data(), g.data())
                    .ok());
    for (int64_t t = 0; t < rows; ++t) {
      std::vector<bool> in(vocab, c.sets[t].empty());
      for (int64_t v : c.sets[t]) in[v] = true;
      const LD gt = r.kept_target[t] ? glp[t] : 0, ht = iter % 4 < 2 ? 0 : glse[t];
      for (int64_t v = 0; v < vocab; ++v) {
        LD want = 0;
        if (in[v]) {
          const LD p = std::exp(LD(c.logits[t * vocab + v]) - r.lse[t]);
          want = (v == c.targets[t] ? gt : 0) - gt * p + ht * p;
        }
        const double tol = c.bf16 ? 1e-2 * std::fabs(double(want)) + 1e-6 : 1e-5;
        ASSERT_NEAR(GradAt(c, g, t * vocab + v), double(want), tol)
            << "iter " << iter << " row " << t << " v " << v;
      }
    }
  }
}

// The gradient formula is the derivative of the forward: central differences.
TEST(MaskedLogprobCpu, GradientMatchesFiniteDifferences) {
  std::mt19937_64 rng(7);
  Case c = RandomCase(rng, 6, 17, false);
  c.sets[0].clear();                               // full vocabulary
  c.sets[1] = {3, 9, 4};
  c.targets[1] = 9;
  MaskedLogprobArgs a = c.Args();
  std::vector<float> lp(6), lse(6), glp(6, 0.f), glse(6, 0.f);
  ASSERT_TRUE(cpu::MaskedLogprobForward(a, lp.data(), lse.data()).ok());
  std::vector<float> g(6 * 17);
  for (int which = 0; which < 2; ++which) {        // d logprob, then d lse
    for (int64_t t = 0; t < 6; ++t) {
      std::fill(glp.begin(), glp.end(), 0.f);
      std::fill(glse.begin(), glse.end(), 0.f);
      (which == 0 ? glp : glse)[t] = 1.f;
      ASSERT_TRUE(cpu::MaskedLogprobBackward(a, lse.data(), glp.data(), glse.data(), g.data()).ok());
      for (int64_t v = 0; v < 17; ++v) {
        const float h = 1e-2f, keep = c.logits[t * 17 + v];
        std::vector<float> up(6), upl(6), dn(6), dnl(6);
        c.logits[t * 17 + v] = keep + h;
        ASSERT_TRUE(cpu::MaskedLogprobForward(a, up.data(), upl.data()).ok());
        c.logits[t * 17 + v] = keep - h;
        ASSERT_TRUE(cpu::MaskedLogprobForward(a, dn.data(), dnl.data()).ok());
        c.logits[t * 17 + v] = keep;
        double fd = which == 0 ? (double(up[t]) - dn[t]) / (2 * h)
                               : (double(upl[t]) - dnl[t]) / (2 * h);
        if (which == 0 && std::isinf(lp[t])) fd = 0;  // a dropped target: constant -inf
        EXPECT_NEAR(g[t * 17 + v], fd, 2e-3) << "which " << which << " row " << t << " v " << v;
      }
    }
  }
}

TEST(MaskedLogprobCpu, EmptyListIsTheFullVocabularyAndDroppedTargetIsMinusInf) {
  Case c;
  c.rows = 2;
  c.vocab = 3;
  c.logits = {0.f, 1.f, 2.f, 0.f, 1.f, 2.f};
  c.sets = {{}, {0, 1}};
  c.targets = {2, 2};
  MaskedLogprobArgs a = c.Args();
  float lp[2], lse[2];
  ASSERT_TRUE(cpu::MaskedLogprobForward(a, lp, lse).ok());
  const double full = std::log(1 + std::exp(1.0) + std::exp(2.0));
  EXPECT_NEAR(lse[0], full, 1e-6);
  EXPECT_NEAR(lp[0], 2 - full, 1e-6);
  EXPECT_NEAR(lse[1], std::log(1 + std::exp(1.0)), 1e-6);
  EXPECT_EQ(lp[1], -kInf);
  // No gradient through the -inf; the lse's still flows, inside the set only.
  const float glp[2] = {1.f, 1.f}, glse[2] = {0.f, 1.f};
  float g[6];
  ASSERT_TRUE(cpu::MaskedLogprobBackward(a, lse, glp, glse, g).ok());
  const double p0 = 1 / (1 + std::exp(1.0));
  EXPECT_NEAR(g[3], p0, 1e-6);
  EXPECT_NEAR(g[4], 1 - p0, 1e-6);
  EXPECT_EQ(g[5], 0.f);
}

TEST(MaskedLogprobCpu, RefusesBadInputNamingTheRow) {
  auto run = [](Case c) {
    MaskedLogprobArgs a = c.Args();
    std::vector<float> lp(c.rows);
    return cpu::MaskedLogprobForward(a, lp.data(), nullptr);
  };
  Case base;
  base.rows = 2;
  base.vocab = 4;
  base.logits.assign(8, 0.f);
  base.sets = {{1, 2}, {3}};
  base.targets = {1, 3};
  ASSERT_TRUE(run(base).ok());

  Case c = base;
  c.sets[1] = {4};
  c.targets[1] = 0;
  auto s = run(c);
  EXPECT_EQ(s.code, StatusCode::kInvalidArgument);
  EXPECT_NE(s.message.find("kept id 4 of row 1"), std::string::npos) << s.message;

  c = base;
  c.targets[0] = -1;
  s = run(c);
  EXPECT_NE(s.message.find("target -1 of row 0"), std::string::npos) << s.message;

  c = base;
  c.sets[0] = {2, 2};
  c.targets[0] = 2;
  s = run(c);
  EXPECT_NE(s.message.find("kept id 2 repeated in row 0"), std::string::npos) << s.message;

  c = base;
  MaskedLogprobArgs a = c.Args();
  const int64_t decreasing[3] = {0, 2, 1};
  a.offsets = decreasing;
  float lp[2];
  s = cpu::MaskedLogprobForward(a, lp, nullptr);
  EXPECT_NE(s.message.find("row 1"), std::string::npos) << s.message;
  const int64_t past_end[3] = {0, 2, 9};
  a.offsets = past_end;
  s = cpu::MaskedLogprobForward(a, lp, nullptr);
  EXPECT_NE(s.message.find("num_values = 3"), std::string::npos) << s.message;

  a = c.Args();
  a.values_type = IndexType::kU8;
  EXPECT_EQ(cpu::MaskedLogprobForward(a, lp, nullptr).code, StatusCode::kInvalidArgument);
  a = c.Args();
  a.vocab = 0;
  EXPECT_EQ(cpu::MaskedLogprobForward(a, lp, nullptr).code, StatusCode::kInvalidArgument);
  a = c.Args();
  EXPECT_EQ(cpu::MaskedLogprobForward(a, nullptr, nullptr).code, StatusCode::kInvalidArgument);
  a.rows = 0;
  EXPECT_TRUE(cpu::MaskedLogprobForward(a, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace rollpack::kernels
