// GPU test of the static unpack (unpack_static_cuda.h): the CUDA kernel
// against the CPU reference, bit for bit, on random shapes (rows 0..3000 of
// max_rows, layers 1..64, K 1..16, E K..1024, uint8/uint16 in, int64/int32
// out, masks with and without -1 fill, contiguous / sliced / layer-major
// buffers, 16-byte aligned and misaligned outputs, rows from a device
// pointer), every output poisoned first and every element outside the view
// checked untouched; then the graph path: the kernel captured once in a CUDA
// graph reading a staging buffer and a device row count, replayed for three
// micro-batches of different sizes refreshed outside the graph.
// Standalone (no GoogleTest on the GPU machine); exit 0 = passed, 1 = a
// failure, 77 = no CUDA device (ctest SKIP_RETURN_CODE).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/unpack_static.h"
#include "kernels/unpack_static_cuda.h"
#include "kernels/testing.h"
#include "kernels/testing_cuda.h"

using namespace rollpack::kernels;
using namespace rollpack::kernels::test_support;

namespace {

struct Shape {
  int64_t rows, max_rows, layers;
  int k, e;
  bool u16, i32, mask, fill;
  int layout;       // 0 contiguous, 1 slice of a wider row-major buffer, 2 layer-major
  int out_shift;    // elements added to the output pointer (misaligned when odd)
};

std::string Name(const Shape& s) {
  char b[256];
  std::snprintf(b, sizeof(b),
                "rows=%lld max_rows=%lld L=%lld K=%d E=%d %s->%s mask=%d fill=%d layout=%d "
                "shift=%d",
                (long long)s.rows, (long long)s.max_rows, (long long)s.layers, s.k, s.e,
                s.u16 ? "u16" : "u8", s.i32 ? "i32" : "i64", s.mask, s.fill, s.layout,
                s.out_shift);
  return b;
}

// Strides and the element count of the whole (wider) buffer; `base` is the
// view's first element in it.
void Strides(const Shape& s, int64_t* rs, int64_t* ls, int64_t* total, int64_t* base) {
  *rs = -1;
  *ls = -1;
  *base = s.out_shift;
  *total = s.max_rows * s.layers * s.k + s.out_shift;
  if (s.layout == 1) {
    *ls = s.k + 3;
    *rs = (s.layers + 2) * *ls;
    *base = *ls + s.out_shift;
    *total = s.max_rows * *rs + *ls + s.out_shift;
  } else if (s.layout == 2) {
    *rs = s.k;
    *ls = (s.max_rows + 2) * s.k;
    *total = s.layers * *ls + s.out_shift;
  }
}

// One shape: CPU reference and CUDA kernel into identically poisoned
// buffers; with rows_from_device, rows come through a device scalar; cfg:
// the vector kernel's knobs (default: the automatic ones).
void RunShape(const Shape& s, std::mt19937_64& rng, bool rows_from_device,
              cuda::internal::StaticUnpackConfig cfg = {}) {
  const int64_t in_rows = rows_from_device ? s.max_rows : s.rows;
  const int isz = s.u16 ? 2 : 1, osz = s.i32 ? 4 : 8;
  std::vector<uint8_t> in(std::max<int64_t>(in_rows * s.layers * s.k * isz, 1));
  for (int64_t i = 0; i < in_rows * s.layers * s.k; ++i) {
    const uint16_t v = uint16_t(rng() % uint64_t(s.e));
    if (s.u16) std::memcpy(&in[i * 2], &v, 2); else in[i] = uint8_t(v);
  }
  std::vector<uint8_t> mask(std::max<int64_t>(in_rows, 1));
  for (auto& m : mask) m = uint8_t(rng() % 3 != 0);
  int64_t rs, ls, total, base;
  Strides(s, &rs, &ls, &total, &base);
  std::vector<uint8_t> ref((total + 1) * osz, 0xA5), got((total + 1) * osz, 0);

  StaticUnpackArgs a;
  a.in_type = s.u16 ? IndexType::kU16 : IndexType::kU8;
  a.rows = s.rows;
  a.layers = s.layers;
  a.k = s.k;
  a.num_experts = s.e;
  a.out_type = s.i32 ? OutIndexType::kI32 : OutIndexType::kI64;
  a.max_rows = s.max_rows;
  a.out_row_stride = rs;
  a.out_layer_stride = ls;
  a.masked_fill_minus_one = s.fill;

  StaticUnpackArgs c = a;
  c.experts = in.data();
  c.mask = s.mask ? mask.data() : nullptr;
  c.out = ref.data() + base * osz;
  int64_t host_rows = s.rows;
  if (rows_from_device) c.rows_ptr = &host_rows;
  const KernelStatus cs = cpu::StaticUnpack(c);
  Check(cs.ok(), Name(s) + " cpu: " + cs.ToString());

  void *din, *dmask, *dout;
  int64_t* drows;
  CK(cudaMalloc(&din, in.size()));
  CK(cudaMalloc(&dmask, mask.size()));
  CK(cudaMalloc(&dout, got.size()));
  CK(cudaMalloc(&drows, sizeof(int64_t)));
  CK(cudaMemcpy(din, in.data(), in.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dmask, mask.data(), mask.size(), cudaMemcpyHostToDevice));
  CK(cudaMemset(dout, 0xA5, got.size()));  // the same poison as ref
  a.experts = din;
  a.mask = s.mask ? static_cast<uint8_t*>(dmask) : nullptr;
  a.out = static_cast<char*>(dout) + base * osz;
  if (rows_from_device) {
    Check(cuda::StoreRows(drows, s.rows, nullptr).ok(), Name(s) + " StoreRows");
    a.rows_ptr = drows;
    a.rows = -5;  // ignored
  }
  const KernelStatus gs = cuda::internal::StaticUnpackWithConfig(a, cfg, nullptr);
  Check(gs.ok(), Name(s) + " cuda: " + gs.ToString());
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(got.data(), dout, got.size(), cudaMemcpyDeviceToHost));
  Check(got == ref, Name(s) + (rows_from_device ? " (device rows)" : "") + " bps " +
                        std::to_string(cfg.blocks_per_sm) + " differs from CPU");
  CK(cudaFree(din));
  CK(cudaFree(dmask));
  CK(cudaFree(dout));
  CK(cudaFree(drows));
}

void Fuzz(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < n; ++i) {
    Shape s;
    s.k = 1 + int(rng() % 16);
    s.u16 = rng() % 2;
    s.e = s.k + int(rng() % uint64_t((s.u16 ? 1024 : 256) - s.k + 1));
    s.layers = 1 + int64_t(rng() % 64);
    s.max_rows = int64_t(rng() % 3000);
    const int r = int(rng() % 4);
    s.rows = r == 0 ? s.max_rows : (r == 1 ? 0 : int64_t(rng() % (s.max_rows + 1)));
    s.i32 = rng() % 2;
    s.mask = rng() % 4 != 0;
    s.fill = rng() % 2;
    s.layout = int(rng() % 3);
    s.out_shift = rng() % 3 == 0 ? int(rng() % 3) : 0;
    cuda::internal::StaticUnpackConfig cfg;
    if (rng() % 2 == 0) {  // every knob the sweep tries must be exact too
      const int bps[] = {-1, 1, 4, 8, 16};
      cfg.blocks_per_sm = bps[rng() % 5];
    }
    RunShape(s, rng, rng() % 3 == 0, cfg);
  }
  // Megatron's shape, both out types, K that vectorises and K that does not.
  for (int k : {8, 6, 1}) {
    for (bool i32 : {false, true}) {
      Shape s{2500, 4096, 48, k, 128, false, i32, true, false, 0, 0};
      RunShape(s, rng, false);
      RunShape(s, rng, true);
    }
  }
}

// The graph path: capture once, replay for several micro-batches.
void Graph() {
  const int64_t max_rows = 2048, layers = 12;
  const int k = 8, e = 64;
  std::mt19937_64 rng(7);
  uint8_t *stage_in, *stage_mask;
  int64_t *rows, *out;
  CK(cudaMalloc(&stage_in, max_rows * layers * k));
  CK(cudaMalloc(&stage_mask, max_rows));
  CK(cudaMalloc(&rows, sizeof(int64_t)));
  CK(cudaMalloc(&out, max_rows * layers * k * sizeof(int64_t)));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  StaticUnpackArgs a;
  a.experts = stage_in;
  a.mask = stage_mask;
  a.rows_ptr = rows;
  a.layers = layers;
  a.k = k;
  a.num_experts = e;
  a.out = out;
  a.max_rows = max_rows;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  // Global mode: any call in the capture that is not capturable (a malloc, a
  // synchronous copy) fails the capture.
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  const KernelStatus cap = cuda::StaticUnpack(a, st);
  CK(cudaStreamEndCapture(st, &graph));
  Check(cap.ok(), "capture: " + cap.ToString());
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int64_t mb_rows : {int64_t{1500}, int64_t{300}, max_rows}) {
    std::vector<uint8_t> in(mb_rows * layers * k), mask(mb_rows);
    for (auto& v : in) v = uint8_t(rng() % e);
    for (auto& m : mask) m = uint8_t(rng() % 5 != 0);
    // Outside the graph: the micro-batch's bytes into the staging buffer
    // (here from the host; the trainer copies device to device), its row
    // count into the device scalar. Then the graph.
    CK(cudaMemcpyAsync(stage_in, in.data(), in.size(), cudaMemcpyHostToDevice, st));
    CK(cudaMemcpyAsync(stage_mask, mask.data(), mask.size(), cudaMemcpyHostToDevice, st));
    Check(cuda::StoreRows(rows, mb_rows, st).ok(), "StoreRows");
    CK(cudaGraphLaunch(exec, st));
    CK(cudaStreamSynchronize(st));
    std::vector<int64_t> got(max_rows * layers * k), ref(got.size(), -9);
    CK(cudaMemcpy(got.data(), out, got.size() * 8, cudaMemcpyDeviceToHost));
    StaticUnpackArgs c = a;
    c.experts = in.data();
    c.mask = mask.data();
    c.rows_ptr = nullptr;
    c.rows = mb_rows;
    c.out = ref.data();
    Check(cpu::StaticUnpack(c).ok(), "graph cpu reference");
    Check(got == ref, "graph replay for " + std::to_string(mb_rows) + " rows differs from CPU");
  }
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(st));
  CK(cudaFree(stage_in));
  CK(cudaFree(stage_mask));
  CK(cudaFree(rows));
  CK(cudaFree(out));
}

// --sweep: the vector kernel's knobs timed on Megatron-like shapes (CUDA
// events, 20 launches, median of 7), against a device-to-device copy.
float TimeUs(const std::function<void()>& f, int iters = 20) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  f();
  CK(cudaDeviceSynchronize());
  std::vector<float> ts;
  for (int rep = 0; rep < 7; ++rep) {
    CK(cudaEventRecord(a));
    for (int i = 0; i < iters; ++i) f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    ts.push_back(ms * 1000 / iters);
  }
  std::sort(ts.begin(), ts.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return ts[ts.size() / 2];
}

void Sweep() {
  const size_t n = size_t{1} << 30;
  void *x, *y;
  CK(cudaMalloc(&x, n));
  CK(cudaMalloc(&y, n));
  const float copy_us = TimeUs([&] { CK(cudaMemcpyAsync(y, x, n, cudaMemcpyDeviceToDevice)); }, 5);
  const double copy_gbs = 2.0 * n / copy_us / 1e3;
  std::printf("copy %.0f GB/s\n", copy_gbs);
  struct S { int64_t max_rows, rows, layers; int k, e; bool u16, i32; };
  const S shapes[] = {{16384, 16384, 48, 8, 128, false, false},
                      {16384, 16384, 48, 8, 128, false, true},
                      {65536, 65536, 48, 8, 128, false, false},
                      {65536, 60000, 58, 8, 256, false, false},
                      {65536, 65536, 48, 10, 384, true, false},
                      {8192, 8192, 94, 8, 128, false, false}};
  for (const S& sh : shapes) {
    StaticUnpackArgs a;
    a.experts = x;
    a.in_type = sh.u16 ? IndexType::kU16 : IndexType::kU8;
    a.rows = sh.rows;
    a.layers = sh.layers;
    a.k = sh.k;
    a.num_experts = sh.e;
    a.out = y;
    a.out_type = sh.i32 ? OutIndexType::kI32 : OutIndexType::kI64;
    a.max_rows = sh.max_rows;
    const double bytes = double(sh.rows * sh.layers * sh.k) * (sh.u16 ? 2 : 1) +
                         double(sh.max_rows * sh.layers * sh.k) * (sh.i32 ? 4 : 8);
    for (int bps : {4, 8, 16, 32, -1, 0}) {  // 0: the default for this out type
      const cuda::internal::StaticUnpackConfig c{bps};
      const float us = TimeUs(
          [&] { Check(cuda::internal::StaticUnpackWithConfig(a, c, nullptr).ok(), "sweep"); });
      std::printf("SWEEP max_rows=%lld rows=%lld L=%lld K=%d %s->%s bps=%d %.1f us "
                  "%.0f GB/s %.1f%%\n",
                  (long long)sh.max_rows, (long long)sh.rows, (long long)sh.layers, sh.k,
                  sh.u16 ? "u16" : "u8", sh.i32 ? "i32" : "i64", bps, us, bytes / us / 1e3,
                  100 * bytes / us / 1e3 / copy_gbs);
    }
  }
  CK(cudaFree(x));
  CK(cudaFree(y));
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  if (argc > 1 && std::string(argv[1]) == "--sweep") {
    Sweep();
    return g_fail == 0 ? 0 : 1;
  }
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 12345;
  const int n = argc > 2 ? std::atoi(argv[2]) : 400;
  Fuzz(seed, n);
  Graph();
  // Refusals reach the caller before any launch.
  StaticUnpackArgs bad;
  bad.rows = 10;
  bad.max_rows = 8;
  bad.layers = 1;
  bad.k = 1;
  bad.num_experts = 4;
  uint8_t dummy = 0;
  bad.experts = &dummy;
  bad.out = &dummy;
  Check(cuda::StaticUnpack(bad, nullptr).code == StatusCode::kInvalidArgument,
        "rows > max_rows refused");
  Check(cudaGetLastError() == cudaSuccess, "no launch on refusal");
  std::printf("unpack_static_gpu_test: seed %llu, %d checks, %d failed\n",
              (unsigned long long)seed, g_checks, g_fail);
  return g_fail == 0 ? 0 : 1;
}
