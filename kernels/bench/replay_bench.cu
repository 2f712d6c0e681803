// GPU benchmark of the routing-replay kernels with CUDA events (no torch):
// device-to-device copy bandwidth, then each kernel's median time and
// bandwidth (bytes read + written, each input read once, each output written
// once) as a fraction of the copy. replay_bench.py adds the torch comparisons.
// Usage: replay_bench [iters] [--sweep | --unpack]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/bench/unpack_variants.h"
#include "kernels/replay_kernels_cuda.h"

using namespace rollpack::kernels;

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::printf("FATAL %s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)
#define KS(x)                                                             \
  do {                                                                    \
    KernelStatus s_ = (x);                                                \
    if (!s_.ok()) {                                                       \
      std::printf("FATAL %s:%d %s\n", __FILE__, __LINE__, s_.ToString().c_str()); \
      std::exit(1);                                                       \
    }                                                                     \
  } while (0)

static int g_iters = 50;
static bool g_sweep = false;        // --sweep: kPipelined's knobs, unpack only
static bool g_unpack_only = false;  // --unpack: unpack only

constexpr int kBatch = 10;
// Median over the event pairs (start, end) of one batch of kBatch calls, in
// microseconds per call; destroys the events.
static double MedianUsPerCall(std::vector<cudaEvent_t>& ev) {
  std::vector<double> t(ev.size() / 2);
  for (size_t i = 0; i < t.size(); ++i) {
    float ms;
    CK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    t[i] = ms * 1e3 / kBatch;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median time in microseconds of one f() call: g_iters event-timed batches of
// kBatch back-to-back calls (so that launch gaps do not count), median batch / kBatch.
static double TimeUs(const std::function<void()>& f) {
  for (int i = 0; i < 5; ++i) f();
  CK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * g_iters);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < g_iters; ++i) {
    CK(cudaEventRecord(ev[2 * i]));
    for (int b = 0; b < kBatch; ++b) f();
    CK(cudaEventRecord(ev[2 * i + 1]));
  }
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
  return MedianUsPerCall(ev);
}

// Same, for work launched on g_stream: kBatch calls captured in a CUDA graph,
// median of g_iters replays (no launch gaps or host overhead, as the torch
// benchmark times). The copy ceiling is not graph-timed: a captured 1 GiB
// memcpy node ran at 2768 GB/s against 4251 launched directly (H200).
static cudaStream_t g_stream = nullptr;
static double TimeUsGraph(const std::function<void()>& f) {
  for (int i = 0; i < 3; ++i) f();
  CK(cudaStreamSynchronize(g_stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
  for (int b = 0; b < kBatch; ++b) f();
  CK(cudaStreamEndCapture(g_stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, g_stream));
  CK(cudaStreamSynchronize(g_stream));
  std::vector<cudaEvent_t> ev(2 * g_iters);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  for (int i = 0; i < g_iters; ++i) {
    CK(cudaEventRecord(ev[2 * i], g_stream));
    CK(cudaGraphLaunch(exec, g_stream));
    CK(cudaEventRecord(ev[2 * i + 1], g_stream));
  }
  CK(cudaStreamSynchronize(g_stream));
  CK(cudaGetLastError());
  const double us = MedianUsPerCall(ev);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return us;
}

static void* DevRandom(size_t bytes, std::mt19937_64& rng) {
  std::vector<uint64_t> h((bytes + 7) / 8);
  for (auto& v : h) v = rng();
  void* d;
  CK(cudaMalloc(&d, h.size() * 8));
  CK(cudaMemcpy(d, h.data(), h.size() * 8, cudaMemcpyHostToDevice));
  return d;
}

// Random valid distinct ids: row r, slot k -> (r * 7 + k * step) mod E style
// is too regular for caches; use a host shuffle per row.
static void* DevIds(int64_t rows, int64_t per_row_sets, int k, int e, int elem, std::mt19937_64& rng) {
  std::vector<uint8_t> h(size_t(rows * per_row_sets * k) * elem);
  std::vector<int> perm(e);
  for (int i = 0; i < e; ++i) perm[i] = i;
  for (int64_t s = 0; s < rows * per_row_sets; ++s) {
    for (int i = 0; i < k; ++i) std::swap(perm[i], perm[i + rng() % (e - i)]);
    for (int i = 0; i < k; ++i) {
      const int64_t v = perm[i];
      std::copy_n(reinterpret_cast<const uint8_t*>(&v), elem, &h[(s * k + i) * elem]);
    }
  }
  void* d;
  CK(cudaMalloc(&d, h.size()));
  CK(cudaMemcpy(d, h.data(), h.size(), cudaMemcpyHostToDevice));
  return d;
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--sweep") g_sweep = true;
    else if (std::string(argv[i]) == "--unpack") g_unpack_only = true;
    else g_iters = std::max(3, std::atoi(argv[i]));
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  std::mt19937_64 rng(7);
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));

  // Copy ceiling.
  const size_t copy_bytes = size_t(1) << 30;
  void* ca = DevRandom(copy_bytes, rng);
  void* cb;
  CK(cudaMalloc(&cb, copy_bytes));
  const double copy_us = TimeUs([&] { CK(cudaMemcpyAsync(cb, ca, copy_bytes, cudaMemcpyDeviceToDevice)); });
  const double copy_gbs = 2.0 * copy_bytes / copy_us / 1e3;
  CK(cudaFree(ca));
  CK(cudaFree(cb));
  std::printf("%-58s %10s %10s %8s\n", "kernel", "time_us", "GB/s", "%copy");
  std::printf("%-58s %10.1f %10.0f %8.1f\n", "d2d copy 1 GiB (cudaMemcpyAsync)", copy_us, copy_gbs, 100.0);

  // Unpack.
  struct UShape { int64_t rows, layers; int k; bool u16; };
  std::vector<UShape> ushapes = {UShape{16384, 48, 8, false}, UShape{65536, 48, 8, false},
                                 UShape{65536, 58, 8, false}, UShape{65536, 48, 10, true},
                                 UShape{8192, 94, 8, false}};
  // Rows off the 16-byte path (4-byte and element copies), K = 6 and K = 5.
  ushapes.push_back(UShape{65536, 58, 6, false});
  ushapes.push_back(UShape{65536, 15, 10, true});
  ushapes.push_back(UShape{65536, 47, 5, false});
  std::vector<std::string> summary;
  for (UShape s : ushapes) {
    const int isz = s.u16 ? 2 : 1;
    const size_t in_bytes = size_t(s.rows * s.layers * s.k) * isz;
    void* in = DevRandom(in_bytes, rng);
    void* mask = DevRandom(s.rows, rng);
    void* out;
    CK(cudaMalloc(&out, size_t(s.rows * s.layers * s.k) * 8));
    for (int i64 = 1; i64 >= 0; --i64) {
      UnpackArgs a;
      a.experts = in;
      a.in_type = s.u16 ? IndexType::kU16 : IndexType::kU8;
      a.mask = static_cast<uint8_t*>(mask);
      a.rows = s.rows;
      a.layers = s.layers;
      a.k = s.k;
      a.out = out;
      a.out_type = i64 ? OutIndexType::kI64 : OutIndexType::kI32;
      const double bytes = double(in_bytes) + s.rows + double(s.rows * s.layers * s.k) * (i64 ? 8 : 4);
      char shape[96];
      std::snprintf(shape, sizeof shape, "rows=%lld L=%lld K=%d %s->%s", (long long)s.rows,
                    (long long)s.layers, s.k, s.u16 ? "u16" : "u8", i64 ? "i64" : "i32");
      auto row = [&](const char* what, double us) {
        char name[160];
        std::snprintf(name, sizeof name, "unpack %s %s", what, shape);
        std::printf("%-58s %10.1f %10.0f %8.1f\n", name, us, bytes / us / 1e3, 100.0 * bytes / us / 1e3 / copy_gbs);
        return 100.0 * bytes / us / 1e3 / copy_gbs;
      };
      const double auto_pct = row("auto  ", TimeUsGraph([&] { KS(cuda::UnpackWithVariant(a, cuda::UnpackVariant::kAuto, g_stream)); }));
      for (int v : {1, 3, 2}) {
        if (g_sweep && v != 1) continue;
        row(v == 1 ? "tiled " : v == 3 ? "flat  " : "direct",
            TimeUsGraph([&] { KS(cuda::UnpackWithVariant(a, cuda::UnpackVariant(v), g_stream)); }));
      }
      if (g_sweep) {
        double best = 0;
        char best_cfg[64] = "";
        for (int fill = 0; fill <= 1; ++fill)
          for (int cs = 0; cs <= 1; ++cs)
            for (int bps : {1, 2, 3, 4, 6, 8})
              for (int tr : {8, 16, 24, 32, 48, 64, 128, 256}) {
                if (fill && (cs || bps != 4)) continue;  // the -1 fill: one column
                cuda::UnpackConfig c;
                c.tile_rows = tr;
                c.blocks_per_sm = bps;
                c.streaming_stores = cs;
                UnpackArgs b = a;
                b.masked_fill_minus_one = fill;
                char what[64];
                std::snprintf(what, sizeof what, "pipe tr=%d bps=%d cs=%d fill=%d", tr, bps, cs, fill);
                const double pct = row(what, TimeUsGraph([&] { KS(cuda::UnpackPipelined(b, c, g_stream)); }));
                if (!fill && pct > best) {
                  best = pct;
                  std::snprintf(best_cfg, sizeof best_cfg, "tr=%d bps=%d cs=%d", tr, bps, cs);
                }
              }
        char line[256];
        std::snprintf(line, sizeof line, "SWEEP %-34s auto %5.1f%%  best %5.1f%% at %s", shape, auto_pct,
                      best, best_cfg);
        summary.push_back(line);
      }
    }
    CK(cudaFree(in));
    CK(cudaFree(mask));
    CK(cudaFree(out));
  }
  for (const auto& l : summary) std::printf("%s\n", l.c_str());
  if (g_sweep || g_unpack_only) {
    std::printf("bench done\n");
    return 0;
  }

  // Apply forward/backward and agreement.
  const int64_t rows = 65536;
  for (int e : {128, 256, 512, 1024}) {
    const int k = 8;
    for (int bf16 = 0; bf16 <= 1; ++bf16) {
      // Random finite logits: random bits would give NaN/inf, so draw normals.
      std::vector<float> hf(size_t(rows) * e);
      std::normal_distribution<float> nd(0.f, 2.f);
      for (auto& v : hf) v = nd(rng);
      std::vector<uint16_t> hb(hf.size());
      for (size_t i = 0; i < hf.size(); ++i) hb[i] = FloatToBf16(hf[i]);
      const size_t lbytes = hf.size() * (bf16 ? 2 : 4);
      void* logits;
      CK(cudaMalloc(&logits, lbytes));
      CK(cudaMemcpy(logits, bf16 ? static_cast<void*>(hb.data()) : hf.data(), lbytes, cudaMemcpyHostToDevice));
      void* ids = DevIds(rows, 1, k, e, 8, rng);
      float *probs, *gp;
      uint8_t* map;
      void* gx;
      CK(cudaMalloc(&probs, rows * k * 4));
      CK(cudaMalloc(&map, rows * e));
      CK(cudaMalloc(&gx, lbytes));
      gp = static_cast<float*>(DevRandom(rows * k * 4, rng));
      std::vector<float> hg(rows * k);
      for (auto& v : hg) v = nd(rng);
      CK(cudaMemcpy(gp, hg.data(), hg.size() * 4, cudaMemcpyHostToDevice));
      for (int sig = 0; sig <= 1; ++sig) {
        ApplyArgs a;
        a.logits = logits;
        a.logits_type = bf16 ? FloatType::kBF16 : FloatType::kF32;
        a.ids = {ids, IndexType::kI64, k, 0};
        a.rows = rows;
        a.experts = e;
        a.k = k;
        a.score = sig ? ScoreFunction::kSigmoid : ScoreFunction::kSoftmax;
        a.renormalize = true;
        const double fus = TimeUs([&] { KS(cuda::ApplyForward(a, {probs, map, nullptr}, nullptr)); });
        const double fbytes = double(lbytes) + rows * k * 8.0 + rows * k * 4.0 + double(rows) * e;
        const double bus = TimeUs([&] { KS(cuda::ApplyBackward(a, gp, gx, nullptr)); });
        const double bbytes = 2.0 * lbytes + rows * k * 8.0 + rows * k * 4.0;
        char name[128];
        std::snprintf(name, sizeof name, "apply fwd %s rows=%lld E=%d K=%d %s+renorm", bf16 ? "bf16" : "fp32",
                      (long long)rows, e, k, sig ? "sigmoid" : "softmax");
        std::printf("%-58s %10.1f %10.0f %8.1f\n", name, fus, fbytes / fus / 1e3, 100.0 * fbytes / fus / 1e3 / copy_gbs);
        std::snprintf(name, sizeof name, "apply bwd %s rows=%lld E=%d K=%d %s+renorm", bf16 ? "bf16" : "fp32",
                      (long long)rows, e, k, sig ? "sigmoid" : "softmax");
        std::printf("%-58s %10.1f %10.0f %8.1f\n", name, bus, bbytes / bus / 1e3, 100.0 * bbytes / bus / 1e3 / copy_gbs);
      }
      AgreementStats* st;
      CK(cudaMalloc(&st, sizeof(AgreementStats)));
      AgreementLogitsArgs g;
      g.logits = logits;
      g.logits_type = bf16 ? FloatType::kBF16 : FloatType::kF32;
      g.replay = {ids, IndexType::kI64, k, 0};
      g.rows = rows;
      g.layers = 1;
      g.experts = e;
      g.k = k;
      const double aus = TimeUs([&] { KS(cuda::AgreementFromLogits(g, st, nullptr)); });
      const double abytes = double(lbytes) + rows * k * 8.0;
      char name[128];
      std::snprintf(name, sizeof name, "agreement(logits) %s rows=%lld E=%d K=%d", bf16 ? "bf16" : "fp32",
                    (long long)rows, e, k);
      std::printf("%-58s %10.1f %10.0f %8.1f\n", name, aus, abytes / aus / 1e3, 100.0 * abytes / aus / 1e3 / copy_gbs);
      CK(cudaFree(st));
      CK(cudaFree(logits));
      CK(cudaFree(ids));
      CK(cudaFree(probs));
      CK(cudaFree(map));
      CK(cudaFree(gx));
      CK(cudaFree(gp));
    }
  }
  CK(cudaDeviceSynchronize());
  std::printf("bench done\n");
  return 0;
}
