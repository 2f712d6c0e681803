// GPU fuzz test: CUDA kernels vs the CPU implementation on random shapes.
// Standalone (no GoogleTest: the GPU machine may not have it). Prints one line
// per failure and a summary; exit 0 = all passed, 1 = a failure, 77 = no CUDA
// device (ctest SKIP_RETURN_CODE).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/replay_kernels.h"
#include "kernels/bench/unpack_variants.h"
#include "kernels/replay_kernels_cuda.h"
#include "kernels/testing.h"
#include "kernels/testing_cuda.h"

using namespace rollpack::kernels;
using namespace rollpack::kernels::test_support;

namespace {

void CheckStatus(const KernelStatus& s, const std::string& what) {
  Check(s.ok(), what + " status " + s.ToString());
}

double RelErr(const std::vector<double>& out, const std::vector<double>& ref) {
  long double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(out[i]) != std::isnan(ref[i])) return INFINITY;
    if (std::isnan(out[i])) continue;
    num += (out[i] - ref[i]) * (long double)(out[i] - ref[i]);
    den += ref[i] * (long double)ref[i];
  }
  return den == 0 ? std::sqrt(double(num)) : std::sqrt(double(num / den));
}

// ------------------------------------------------------------------ unpack
struct UnpackCase {
  int64_t rows, layers;
  int k;
  bool u16, i64, fill, use_mask;
  int variant;  // 0..4 = UnpackVariant, 5 = UnpackPipelined(cfg)
  cuda::UnpackConfig cfg;
  int64_t pad;
  bool default_stride;
  size_t in_off, out_off;  // misalignment of the input / output pointers, bytes
};

void CheckUnpack(std::mt19937_64& rng, const UnpackCase& u, int it) {
  const int64_t rows = u.rows, layers = u.layers;
  const int k = u.k;
  const int64_t ls = rows * k + u.pad;
  const int esz = u.i64 ? 8 : 4;
  const int64_t n = rows * layers * k;
  const int isz = u.u16 ? 2 : 1;
  std::vector<uint8_t> in(n * isz);
  for (auto& b : in) b = uint8_t(rng());
  std::vector<uint8_t> mask(rows);
  for (auto& m : mask) m = rng() % 3 != 0;
  const size_t out_bytes = size_t(layers * ls) * esz;
  std::vector<uint8_t> want(out_bytes, 0x5A), got(out_bytes, 0);
  DevBuf din(in.size() + u.in_off), dmask(rows), dout(out_bytes + u.out_off);
  Upload(din.as<char>(u.in_off), in.data(), in.size());
  Upload(dmask.p, mask.data(), rows);
  CK(cudaMemset(dout.p, 0x5A, out_bytes + u.out_off));
  UnpackArgs a;
  a.in_type = u.u16 ? IndexType::kU16 : IndexType::kU8;
  a.mask = u.use_mask ? dmask.as<uint8_t>() : nullptr;
  a.rows = rows;
  a.layers = layers;
  a.k = k;
  a.out_type = u.i64 ? OutIndexType::kI64 : OutIndexType::kI32;
  a.out_layer_stride = u.pad == 0 && u.default_stride ? -1 : ls;
  a.masked_fill_minus_one = u.fill;
  a.experts = din.as<char>(u.in_off);
  a.out = dout.as<char>(u.out_off);
  char tag[256];
  std::snprintf(tag, sizeof tag, "unpack it=%d rows=%lld L=%lld K=%d u16=%d i64=%d fill=%d mask=%d var=%d tr=%d bps=%d cs=%d pad=%lld inoff=%zu outoff=%zu",
                it, (long long)rows, (long long)layers, k, u.u16, u.i64, u.fill, u.use_mask, u.variant,
                u.cfg.tile_rows, u.cfg.blocks_per_sm, u.cfg.streaming_stores, (long long)u.pad,
                u.in_off, u.out_off);
  KernelStatus s = u.variant == 5 ? cuda::UnpackPipelined(a, u.cfg, nullptr)
                                  : cuda::UnpackWithVariant(a, cuda::UnpackVariant(u.variant), nullptr);
  if (s.code == StatusCode::kInvalidArgument && u.variant != int(cuda::UnpackVariant::kAuto) &&
      u.variant != int(cuda::UnpackVariant::kDirect)) {
    s = cuda::UnpackWithVariant(a, cuda::UnpackVariant::kDirect, nullptr);  // tile too big
  }
  CheckStatus(s, tag);
  CK(cudaDeviceSynchronize());
  Download(got.data(), dout.as<char>(u.out_off), out_bytes);
  UnpackArgs c = a;
  c.experts = in.data();
  c.mask = u.use_mask ? mask.data() : nullptr;
  c.out = want.data();
  CheckStatus(cpu::Unpack(c), std::string(tag) + " cpu");
  Check(got == want, tag);
}

void FuzzUnpack(std::mt19937_64& rng, int iters) {
  for (int it = 0; it < iters; ++it) {
    UnpackCase u;
    u.rows = it % 10 == 0 ? 0 : std::uniform_int_distribution<int>(1, it % 3 ? 300 : 5000)(rng);
    u.layers = std::uniform_int_distribution<int>(1, it % 7 == 0 ? 200 : 64)(rng);
    u.k = std::uniform_int_distribution<int>(1, 16)(rng);
    u.u16 = rng() & 1;
    u.i64 = rng() & 1;
    u.fill = rng() & 1;
    u.use_mask = rng() & 1;
    // 5 = kPipelined with random knobs: tile rows down to one granule,
    // partial last tiles, few or many blocks.
    u.variant = int(rng() % 6);
    u.cfg.tile_rows = int(rng() % 70);
    u.cfg.blocks_per_sm = int(rng() % 9);
    u.cfg.streaming_stores = int(rng() % 3) - 1;
    u.pad = (rng() & 1) ? 0 : int64_t(rng() % 5);
    u.default_stride = rng() & 1;
    u.in_off = (rng() % 4 == 0) ? (u.u16 ? 2 : 1) : 0;
    u.out_off = (rng() % 4 == 0) ? size_t(u.i64 ? 8 : 4) : 0;
    CheckUnpack(rng, u, it);
  }
  // Rows of 48 KB (kPipelined: one row per stage) and of 80 KB (no tile fits:
  // kAuto falls back to kDirect, explicit kPipelined refuses).
  int it = 100000;
  for (int64_t layers : {1500, 2500})
    for (int variant : {0, 4})
      for (int i64 = 0; i64 <= 1; ++i64) {
        UnpackCase u{37, layers, 16, true, bool(i64), true, true, variant, {}, 0, true, 0, 0};
        CheckUnpack(rng, u, it++);
      }
  // Large, smaller, large again on one kernel instance: a launch with less
  // shared memory must not lower the limit a larger one raised.
  for (int tr : {8, 4, 8}) {
    UnpackCase u{37, 200, 16, true, true, false, false, 5, {}, 0, true, 0, 0};
    u.cfg.tile_rows = tr;
    u.cfg.blocks_per_sm = 1;
    CheckUnpack(rng, u, it++);
  }
}

// ------------------------------------------------------------------- apply
void FuzzApply(std::mt19937_64& rng, int iters) {
  for (int it = 0; it < iters; ++it) {
    const int64_t rows = it % 10 == 0 ? 0 : std::uniform_int_distribution<int>(1, it % 4 ? 200 : 3000)(rng);
    const int e = std::uniform_int_distribution<int>(1, it % 3 == 0 ? 1024 : 300)(rng);
    const int k = std::uniform_int_distribution<int>(1, std::min(16, e))(rng);
    const bool bf16 = rng() & 1, sigmoid = rng() & 1, renorm = rng() & 1;
    const bool want_map = rng() % 4 != 0, want_dense = rng() & 1;
    const bool bad_id = rows > 2 && rng() % 8 == 0;
    IndexType it_t = IndexType(rng() % 4);
    if (it_t == IndexType::kU8 && e > 256) it_t = IndexType::kU16;
    const float scale = (rng() & 1) ? 1.f : 2.5f;
    std::normal_distribution<float> nd(0.f, 3.f);
    const size_t ne = size_t(rows) * e;
    std::vector<float> lf(ne);
    std::vector<uint16_t> lb(ne);
    for (size_t i = 0; i < ne; ++i) {
      lb[i] = FloatToBf16(nd(rng));
      lf[i] = bf16 ? Bf16ToFloat(lb[i]) : nd(rng);
    }
    std::vector<uint8_t> ids(size_t(rows) * k * 8);
    for (int64_t r = 0; r < rows; ++r) {
      auto v = DistinctIds(rng, e, k);
      for (int kk = 0; kk < k; ++kk) StoreIdx(ids, it_t, r * k + kk, v[kk]);
    }
    const int64_t bad_row = bad_id ? 1 : -1;
    std::vector<float> grad(size_t(rows) * k);
    for (auto& g : grad) g = nd(rng);
    const size_t lbytes = ne * (bf16 ? 2 : 4);
    DevBuf dl(lbytes), di(ids.size()), dp(rows * k * 4), dm(ne), dd(ne * 4), dg(rows * k * 4), dgx(lbytes);
    Upload(dl.p, bf16 ? static_cast<const void*>(lb.data()) : lf.data(), lbytes);
    Upload(dg.p, grad.data(), grad.size() * 4);
    CK(cudaMemset(dp.p, 0xFF, rows * k * 4));
    CK(cudaMemset(dm.p, 7, ne));
    CK(cudaMemset(dd.p, 0xFF, ne * 4));
    CK(cudaMemset(dgx.p, 0xFF, lbytes));
    ApplyArgs a;
    a.logits_type = bf16 ? FloatType::kBF16 : FloatType::kF32;
    a.rows = rows;
    a.experts = e;
    a.k = k;
    a.score = sigmoid ? ScoreFunction::kSigmoid : ScoreFunction::kSoftmax;
    a.renormalize = renorm;
    a.scale = scale;
    char tag[200];
    std::snprintf(tag, sizeof tag, "apply it=%d rows=%lld E=%d K=%d bf16=%d sigmoid=%d renorm=%d idt=%d bad=%d",
                  it, (long long)rows, e, k, bf16, sigmoid, renorm, int(it_t), bad_id);
    // CPU reference (valid ids only).
    ApplyArgs c = a;
    c.logits = bf16 ? static_cast<const void*>(lb.data()) : lf.data();
    c.ids = {ids.data(), it_t, k, 0};
    std::vector<float> cp(rows * k), cd(ne);
    std::vector<uint8_t> cm(ne);
    std::vector<float> cgx32(ne);
    std::vector<uint16_t> cgx16(ne);
    CheckStatus(cpu::ApplyForward(c, {cp.data(), cm.data(), cd.data()}), std::string(tag) + " cpu fwd");
    CheckStatus(cpu::ApplyBackward(c, grad.data(), bf16 ? static_cast<void*>(cgx16.data()) : cgx32.data()),
                std::string(tag) + " cpu bwd");
    // An out-of-range id in one row (uint8 ids cannot exceed 255).
    const bool really_bad = bad_id && !(it_t == IndexType::kU8 && e > 255);
    if (really_bad) StoreIdx(ids, it_t, bad_row * k + (k - 1), it_t == IndexType::kU8 ? 255 : e + 7);
    Upload(di.p, ids.data(), ids.size());
    a.logits = dl.p;
    a.ids = {di.p, it_t, k, 0};
    CheckStatus(cuda::ApplyForward(a, {dp.as<float>(), want_map ? dm.as<uint8_t>() : nullptr,
                                       want_dense ? dd.as<float>() : nullptr}, nullptr),
                std::string(tag) + " fwd");
    CheckStatus(cuda::ApplyBackward(a, dg.as<float>(), dgx.p, nullptr), std::string(tag) + " bwd");
    CK(cudaDeviceSynchronize());
    std::vector<float> gp(rows * k), gd(ne), ggx32(ne);
    std::vector<uint8_t> gm(ne);
    std::vector<uint16_t> ggx16(ne);
    Download(gp.data(), dp.p, gp.size() * 4);
    Download(gm.data(), dm.p, ne);
    Download(gd.data(), dd.p, ne * 4);
    if (bf16) Download(ggx16.data(), dgx.p, ne * 2); else Download(ggx32.data(), dgx.p, ne * 4);
    std::vector<double> o1, r1, o2, r2, o3, r3;
    bool map_ok = true, bad_ok = true;
    for (int64_t r = 0; r < rows; ++r) {
      const bool rb = really_bad && r == bad_row;
      for (int kk = 0; kk < k; ++kk) {
        if (rb) { bad_ok &= std::isnan(gp[r * k + kk]); continue; }
        o1.push_back(gp[r * k + kk]);
        r1.push_back(cp[r * k + kk]);
      }
      for (int ee = 0; ee < e; ++ee) {
        const size_t i = size_t(r) * e + ee;
        const double gxv = bf16 ? Bf16ToFloat(ggx16[i]) : ggx32[i];
        const double cxv = bf16 ? Bf16ToFloat(cgx16[i]) : cgx32[i];
        if (rb) {
          bad_ok &= std::isnan(gxv);
          if (want_map) bad_ok &= gm[i] == 0;
          continue;
        }
        if (want_map) map_ok &= gm[i] == cm[i];
        if (want_dense) { o2.push_back(gd[i]); r2.push_back(cd[i]); }
        o3.push_back(gxv);
        r3.push_back(cxv);
      }
    }
    if (!want_map) map_ok = std::all_of(gm.begin(), gm.end(), [](uint8_t v) { return v == 7; });
    const double e1 = RelErr(o1, r1), e2 = RelErr(o2, r2), e3 = RelErr(o3, r3);
    const double tol_g = bf16 ? 1e-2 : 1e-6;
    char msg[400];
    std::snprintf(msg, sizeof msg, "%s probs_err=%.3g dense_err=%.3g grad_err=%.3g map_ok=%d bad_ok=%d", tag, e1, e2, e3,
                  map_ok, bad_ok);
    Check(e1 < 1e-6 && e2 < 1e-6 && e3 < tol_g && map_ok && bad_ok, msg);
  }
}

// --------------------------------------------------------------- agreement
void FuzzAgreement(std::mt19937_64& rng, int iters) {
  for (int it = 0; it < iters; ++it) {
    const int64_t rows = it % 10 == 0 ? 0 : std::uniform_int_distribution<int>(1, it % 4 ? 300 : 4000)(rng);
    const int64_t layers = std::uniform_int_distribution<int>(1, 6)(rng);
    const int e = std::uniform_int_distribution<int>(1, it % 3 == 0 ? 1024 : 300)(rng);
    const int k = std::uniform_int_distribution<int>(1, std::min(16, e))(rng);
    const bool bf16 = rng() & 1, use_mask = rng() & 1;
    const int levels = (rng() & 1) ? 3 : 100000;
    IndexType rt = IndexType(rng() % 4);
    if (rt == IndexType::kU8 && e > 256) rt = IndexType::kU16;
    const size_t ne = size_t(layers * rows) * e;
    std::vector<float> lf(ne);
    std::vector<uint16_t> lb(ne);
    for (size_t i = 0; i < ne; ++i) {
      const float v = float(int(rng() % levels)) * 0.013f - 1.f;
      lb[i] = FloatToBf16(v);
      lf[i] = bf16 ? Bf16ToFloat(lb[i]) : v;
    }
    // Replay in the received layout [rows, layers, K]; live ids [layers, rows, K] int32.
    std::vector<uint8_t> rep(size_t(rows * layers * k) * 8), live(size_t(rows * layers * k) * 8);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t l = 0; l < layers; ++l) {
        auto v = DistinctIds(rng, e, k);
        auto w = v;
        const int mode = int(rng() % 3);
        if (mode == 0) std::shuffle(w.begin(), w.end(), rng);
        else if (mode == 1) w = DistinctIds(rng, e, k);
        else if (e > k) { w = DistinctIds(rng, e, k); }
        if (rng() % 10 == 0 && k > 1) w[1] = w[0];
        for (int kk = 0; kk < k; ++kk) {
          StoreIdx(rep, rt, (r * layers + l) * k + kk, w[kk]);
          StoreIdx(live, IndexType::kI32, (l * rows + r) * k + kk, v[kk]);
        }
      }
    std::vector<uint8_t> mask(rows);
    for (auto& m : mask) m = rng() % 4 != 0;
    DevBuf dl(ne * 4), drep(rep.size()), dlive(live.size()), dmask(rows), dst(layers * sizeof(AgreementStats));
    Upload(dl.p, bf16 ? static_cast<const void*>(lb.data()) : lf.data(), ne * (bf16 ? 2 : 4));
    Upload(drep.p, rep.data(), rep.size());
    Upload(dlive.p, live.data(), live.size());
    Upload(dmask.p, mask.data(), rows);
    AgreementLogitsArgs a;
    a.logits = dl.p;
    a.logits_type = bf16 ? FloatType::kBF16 : FloatType::kF32;
    a.replay = {drep.p, rt, layers * k, k};
    a.mask = use_mask ? dmask.as<uint8_t>() : nullptr;
    a.rows = rows;
    a.layers = layers;
    a.experts = e;
    a.k = k;
    AgreementIdsArgs b;
    b.live = {dlive.p, IndexType::kI32, k, rows * k};
    b.replay = a.replay;
    b.mask = a.mask;
    b.rows = rows;
    b.layers = layers;
    b.k = k;
    char tag[200];
    std::snprintf(tag, sizeof tag, "agree it=%d rows=%lld L=%lld E=%d K=%d bf16=%d mask=%d levels=%d rt=%d",
                  it, (long long)rows, (long long)layers, e, k, bf16, use_mask, levels, int(rt));
    for (int variant = 0; variant < 2; ++variant) {
      CK(cudaMemset(dst.p, 0x7F, layers * sizeof(AgreementStats)));
      std::vector<AgreementStats> got(layers), want(layers);
      AgreementLogitsArgs ca = a;
      ca.logits = bf16 ? static_cast<const void*>(lb.data()) : lf.data();
      ca.replay.data = rep.data();
      ca.mask = use_mask ? mask.data() : nullptr;
      AgreementIdsArgs cb = b;
      cb.live.data = live.data();
      cb.replay.data = rep.data();
      cb.mask = ca.mask;
      if (variant == 0) {
        CheckStatus(cuda::AgreementFromLogits(a, dst.as<AgreementStats>(), nullptr), tag);
        CheckStatus(cpu::AgreementFromLogits(ca, want.data()), tag);
      } else {
        CheckStatus(cuda::AgreementFromIds(b, dst.as<AgreementStats>(), nullptr), tag);
        CheckStatus(cpu::AgreementFromIds(cb, want.data()), tag);
      }
      CK(cudaDeviceSynchronize());
      Download(got.data(), dst.p, layers * sizeof(AgreementStats));
      bool ok = true;
      for (int64_t l = 0; l < layers; ++l)
        ok &= got[l].rows_counted == want[l].rows_counted && got[l].rows_differ == want[l].rows_differ &&
              got[l].overlap_sum == want[l].overlap_sum;
      char msg[300];
      std::snprintf(msg, sizeof msg, "%s %s gpu=(%lld,%lld,%lld) cpu=(%lld,%lld,%lld)", tag,
                    variant ? "ids" : "logits", (long long)got[0].rows_counted, (long long)got[0].rows_differ,
                    (long long)got[0].overlap_sum, (long long)want[0].rows_counted,
                    (long long)want[0].rows_differ, (long long)want[0].overlap_sum);
      Check(ok, msg);
    }
  }
}

void Validation() {
  UnpackArgs u;
  u.rows = 4;
  u.layers = 2;
  u.k = 17;
  Check(cuda::Unpack(u, nullptr).code == StatusCode::kInvalidArgument, "unpack K=17 rejected");
  ApplyArgs a;
  a.rows = 1;
  a.experts = 2048;
  a.k = 4;
  Check(cuda::ApplyForward(a, {}, nullptr).code == StatusCode::kInvalidArgument, "apply E=2048 rejected");
  a.rows = 0;
  a.experts = 8;
  Check(cuda::ApplyForward(a, {}, nullptr).ok(), "apply rows=0 ok");
  Check(cuda::ApplyBackward(a, nullptr, nullptr, nullptr).ok(), "apply bwd rows=0 ok");
  Check(cudaGetLastError() == cudaSuccess, "no sticky error");
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 12345;
  const int pct = argc > 2 ? std::atoi(argv[2]) : 100;  // iterations, percent of the default
  auto n_it = [&](int base) { return std::max(1, base * pct / 100); };
  std::printf("device: %s (sm_%d%d), seed %llu\n", prop.name, prop.major, prop.minor, (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  Validation();
  FuzzUnpack(rng, n_it(200));
  FuzzApply(rng, n_it(150));
  FuzzAgreement(rng, n_it(120));
  std::printf("%s: %d checks, %d failed\n", g_fail ? "FAIL" : "PASS", g_checks, g_fail);
  return g_fail ? 1 : 0;
}
