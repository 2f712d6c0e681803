// GPU test of the masked log-probabilities: the CUDA kernels against the CPU
// reference (float64 inside) on random problems: every id/offset/target type,
// fp32 and bf16, empty lists (full vocabulary), dropped targets, vocabularies
// that do and do not fill 16-byte vectors, misaligned logits, a real-size
// vocabulary, and rows with out-of-range input (NaN rows, nothing read out of
// bounds). Standalone (no GoogleTest). Exit 0 = passed, 1 = a failure, 77 = no
// CUDA device (ctest SKIP_RETURN_CODE).
//   masked_logprob_gpu_test [seed] [iterations]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/masked_logprob.h"
#include "kernels/masked_logprob_cuda.h"
#include "kernels/testing.h"
#include "kernels/testing_cuda.h"

using namespace rollpack::kernels;
using namespace rollpack::kernels::test_support;

namespace {

// A device copy of a host buffer, `pad` bytes after a 256-aligned start.
struct Dev {
  char* base = nullptr;
  char* p = nullptr;
  Dev(const void* src, size_t n, size_t pad = 0) {
    CK(cudaMalloc(&base, n + pad + 16));
    p = base + pad;
    if (n) CK(cudaMemcpy(p, src, n, cudaMemcpyHostToDevice));
  }
  explicit Dev(size_t n) : Dev(nullptr, 0) {
    CK(cudaFree(base));
    CK(cudaMalloc(&base, n + 16));
    p = base;
  }
  ~Dev() { cudaFree(base); }
};

double GradValue(const std::vector<uint8_t>& g, bool bf16, int64_t i) {
  if (!bf16) return reinterpret_cast<const float*>(g.data())[i];
  return Bf16ToFloat(reinterpret_cast<const uint16_t*>(g.data())[i]);
}

struct Shape {
  int64_t rows, vocab;
  int max_set;
  bool bf16;
  size_t logits_pad;  // bytes: 0 = 16-byte aligned rows (when V allows)
  int bad_row;        // -1 = none; else that row gets an out-of-range id
};

void RunCase(std::mt19937_64& rng, const Shape& s, int iter) {
  const IndexType vts[] = {IndexType::kU16, IndexType::kI32, IndexType::kI64};
  const IndexType ots[] = {IndexType::kI32, IndexType::kI64};
  const IndexType vt = s.vocab <= 65536 ? vts[iter % 3] : vts[1 + iter % 2];
  const IndexType ot = ots[(iter / 3) % 2], tt = ots[(iter / 6) % 2];
  const int esz = s.bf16 ? 2 : 4;
  const std::string tag = "iter " + std::to_string(iter) + " rows " + std::to_string(s.rows) +
                          " V " + std::to_string(s.vocab) + (s.bf16 ? " bf16" : " f32") +
                          " pad " + std::to_string(s.logits_pad);

  std::normal_distribution<float> nd(0.f, 4.f);
  std::vector<uint8_t> logits(size_t(s.rows * s.vocab) * esz);
  for (int64_t i = 0; i < s.rows * s.vocab; ++i) {
    const float x = nd(rng);
    if (s.bf16) {
      const uint16_t b = FloatToBf16(x);
      std::memcpy(&logits[i * 2], &b, 2);
    } else {
      std::memcpy(&logits[i * 4], &x, 4);
    }
  }
  const int64_t shift = int64_t(rng() % 3);
  std::vector<int64_t> values(shift, 0), offsets{shift}, targets;
  std::vector<int64_t> pool;
  for (int64_t t = 0; t < s.rows; ++t) {
    const int kind = int(rng() % 10);  // 0: no mask, 1: target dropped
    const int64_t n = kind == 0 ? 0 : 1 + int64_t(rng() % uint64_t(std::min<int64_t>(s.max_set, s.vocab)));
    // n distinct ids: sorted like an engine's mask.nonzero(), or shuffled.
    std::vector<int64_t> set;
    while (int64_t(set.size()) < n) {
      set.push_back(int64_t(rng() % uint64_t(s.vocab)));
      if (set.size() == size_t(n)) {
        std::sort(set.begin(), set.end());
        set.erase(std::unique(set.begin(), set.end()), set.end());
      }
    }
    if (rng() % 2) std::shuffle(set.begin(), set.end(), rng);
    int64_t y = set.empty() ? int64_t(rng() % uint64_t(s.vocab)) : set[rng() % set.size()];
    if (kind == 1 && int64_t(set.size()) < s.vocab) {
      do y = int64_t(rng() % uint64_t(s.vocab));
      while (std::find(set.begin(), set.end(), y) != set.end());
    }
    if (t == s.bad_row) set.push_back(s.vocab + 3);
    values.insert(values.end(), set.begin(), set.end());
    offsets.push_back(int64_t(values.size()));
    targets.push_back(y);
  }
  auto hv = EncodeIds(values, vt), ho = EncodeIds(offsets, ot), ht = EncodeIds(targets, tt);
  MaskedLogprobArgs a;
  a.logits = logits.data();
  a.logits_type = s.bf16 ? FloatType::kBF16 : FloatType::kF32;
  a.rows = s.rows;
  a.vocab = s.vocab;
  a.values = hv.data();
  a.values_type = vt;
  a.num_values = int64_t(values.size());
  a.offsets = ho.data();
  a.offsets_type = ot;
  a.targets = ht.data();
  a.targets_type = tt;

  // CPU reference (it refuses a case with a bad row: that row is checked
  // for NaN instead, and the others for not being NaN).
  const bool ref_ok = s.bad_row < 0;
  std::vector<float> want_lp(s.rows), want_lse(s.rows), glp(s.rows), glse(s.rows);
  for (auto& g : glp) g = nd(rng);
  for (auto& g : glse) g = nd(rng) * 0.25f;
  const bool with_glse = iter % 2 == 0;
  std::vector<uint8_t> want_g(size_t(s.rows * s.vocab) * esz);
  if (ref_ok) {
    auto st = cpu::MaskedLogprobForward(a, want_lp.data(), want_lse.data());
    Check(st.ok(), tag + " cpu forward " + st.ToString());
    st = cpu::MaskedLogprobBackward(a, want_lse.data(), glp.data(),
                                    with_glse ? glse.data() : nullptr, want_g.data());
    Check(st.ok(), tag + " cpu backward " + st.ToString());
  }

  Dev dl(logits.data(), logits.size(), s.logits_pad), dv(hv.data(), hv.size()),
      dofs(ho.data(), ho.size()), dt(ht.data(), ht.size()),
      dglp(glp.data(), glp.size() * 4), dglse(glse.data(), glse.size() * 4);
  Dev dlp(size_t(s.rows) * 4), dlse(size_t(s.rows) * 4), dg(want_g.size());
  MaskedLogprobArgs d = a;
  d.logits = dl.p;
  d.values = dv.p;
  d.offsets = dofs.p;
  d.targets = dt.p;
  auto st = cuda::MaskedLogprobForward(d, reinterpret_cast<float*>(dlp.p),
                                       reinterpret_cast<float*>(dlse.p), nullptr);
  Check(st.ok(), tag + " cuda forward " + st.ToString());
  // The backward uses the CPU reference's lse, so that its check is of the
  // backward alone.
  Dev dlse_ref(want_lse.data(), want_lse.size() * 4);
  st = cuda::MaskedLogprobBackward(d, reinterpret_cast<float*>(ref_ok ? dlse_ref.p : dlse.p),
                                   reinterpret_cast<float*>(dglp.p),
                                   with_glse ? reinterpret_cast<float*>(dglse.p) : nullptr, dg.p,
                                   nullptr);
  Check(st.ok(), tag + " cuda backward " + st.ToString());
  CK(cudaDeviceSynchronize());
  std::vector<float> lp(s.rows), lse(s.rows);
  std::vector<uint8_t> g(want_g.size());
  CK(cudaMemcpy(lp.data(), dlp.p, lp.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(lse.data(), dlse.p, lse.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(g.data(), dg.p, g.size(), cudaMemcpyDeviceToHost));

  if (s.bad_row >= 0) {
    Check(std::isnan(lp[s.bad_row]) && std::isnan(lse[s.bad_row]), tag + " bad row not NaN");
    bool all_nan = true;
    for (int64_t v = 0; v < s.vocab; ++v)
      all_nan &= std::isnan(GradValue(g, s.bf16, s.bad_row * s.vocab + v));
    Check(all_nan, tag + " bad row gradient not NaN");
    for (int64_t t = 0; t < s.rows; ++t)
      if (t != s.bad_row) Check(!std::isnan(lse[t]), tag + " a good row is NaN");
    return;
  }
  double max_lp = 0, max_g = 0;
  for (int64_t t = 0; t < s.rows; ++t) {
    if (std::isinf(want_lp[t])) {
      Check(lp[t] == want_lp[t], tag + " row " + std::to_string(t) + " want -inf");
    } else {
      max_lp = std::max(max_lp, std::fabs(double(lp[t]) - want_lp[t]));
    }
    max_lp = std::max(max_lp, std::fabs(double(lse[t]) - want_lse[t]));
  }
  for (int64_t i = 0; i < s.rows * s.vocab; ++i) {
    const double w = GradValue(want_g, s.bf16, i), o = GradValue(g, s.bf16, i);
    // bf16 stores: one rounding apart at most.
    const double tol = s.bf16 ? 8e-3 * std::fabs(w) + 1e-6 : 2e-6;
    if (std::fabs(o - w) > tol) {
      Check(false, tag + " grad at " + std::to_string(i) + " got " + std::to_string(o) +
                       " want " + std::to_string(w));
      break;
    }
    max_g = std::max(max_g, std::fabs(o - w));
  }
  // lse is a sum of up to V terms accumulated in fp32.
  const double tol_lp = 5e-6 * (1 + std::log2(double(s.vocab)));
  Check(max_lp <= tol_lp, tag + " logprob/lse max abs error " + std::to_string(max_lp));
  ++g_checks;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 39;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 40;
  std::mt19937_64 rng(seed);
  for (int it = 0; it < iters; ++it) {
    Shape s;
    s.rows = it % 13 == 0 ? 0 : 1 + int64_t(rng() % 40);
    const int64_t vocabs[] = {1, 7, 32, 100, 1000, 1024, 4099, 8192};
    s.vocab = vocabs[rng() % 8];
    s.max_set = int(1 + rng() % 1200);
    s.bf16 = it % 2 == 1;
    s.logits_pad = it % 5 == 4 ? 4 : 0;
    s.bad_row = (it % 7 == 6 && s.rows > 0) ? int(rng() % s.rows) : -1;
    RunCase(rng, s, it);
  }
  // A real vocabulary (Qwen's 151936), both dtypes.
  for (int bf = 0; bf < 2; ++bf) RunCase(rng, Shape{24, 151936, 1000, bf == 1, 0, -1}, iters + bf);
  std::printf("%d checks, %d failures (seed %llu)\n", g_checks, g_fail,
              (unsigned long long)seed);
  return g_fail ? 1 : 0;
}
