// CUDA implementation of the routing-replay kernels (semantics in
// replay_kernels.h, API in replay_kernels_cuda.h). Standard library + CUDA
// runtime only.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "kernels/replay_kernels_cuda.h"

namespace rollpack::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

KernelStatus CheckLaunch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return KernelStatus::Internal(std::string(what) + ": " + cudaGetErrorString(e));
  return KernelStatus::Ok();
}

KernelStatus CheckCall(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    return KernelStatus::Internal(std::string(what) + ": " + cudaGetErrorString(e));
  return KernelStatus::Ok();
}

int64_t GridFor(int64_t work_items, int64_t per_block) {
  int64_t g = (work_items + per_block - 1) / per_block;
  return g < 1 ? 1 : (g > (1LL << 30) ? (1LL << 30) : g);
}

// ------------------------------------------------------------------ unpack

// kTiledFlat (first version, kept for the benchmark): one block = TR
// consecutive rows (a contiguous chunk of the input), copied to shared memory
// with 16-byte loads, then written layer by layer: for layer l the block's
// output is the contiguous run out[l][r0 .. r0+TR)[0 .. K). Costs two integer
// divisions per output element and bank conflicts between rows.
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads)
    UnpackTiledFlatKernel(const TIn* __restrict__ in, const uint8_t* __restrict__ mask,
                      int64_t rows, int layers, int k, TOut* __restrict__ out,
                      int64_t ls, bool fill, int tr, bool vec_out) {
  extern __shared__ __align__(16) unsigned char smem[];
  TIn* s = reinterpret_cast<TIn*>(smem);
  const int64_t r0 = int64_t(blockIdx.x) * tr;
  if (r0 >= rows) return;
  const int nr = int(rows - r0 < tr ? rows - r0 : tr);
  const int64_t row_elems = int64_t(layers) * k;
  const int64_t n_in = nr * row_elems;
  const TIn* src = in + r0 * row_elems;

  // Phase 1: contiguous chunk -> shared memory.
  int64_t done = 0;
  if ((reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    const int64_t nvec = n_in * int64_t(sizeof(TIn)) / 16;
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(smem);
    for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) d4[i] = __ldg(s4 + i);
    done = nvec * 16 / int64_t(sizeof(TIn));
  }
  for (int64_t i = done + threadIdx.x; i < n_in; i += blockDim.x) s[i] = src[i];
  __syncthreads();

  // Phase 2: per layer, a contiguous run of nr*K outputs.
  constexpr int V = 16 / sizeof(TOut);
  const int seg = nr * k;
  const int nchunks = (seg + V - 1) / V;
  const int total = layers * nchunks;
  for (int c = threadIdx.x; c < total; c += blockDim.x) {
    const int l = c / nchunks;
    const int j0 = (c - l * nchunks) * V;
    alignas(16) TOut vals[V];
#pragma unroll
    for (int t = 0; t < V; ++t) {
      const int j = j0 + t;
      TOut v = 0;
      if (j < seg) {
        const int rl = j / k;
        const int kk = j - rl * k;
        v = TOut(s[(int64_t(rl) * layers + l) * k + kk]);
        if (fill && mask[r0 + rl] == 0) v = TOut(-1);
      }
      vals[t] = v;
    }
    TOut* dst = out + int64_t(l) * ls + r0 * k + j0;
    if (vec_out && j0 + V <= seg) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(vals);
    } else {
#pragma unroll
      for (int t = 0; t < V; ++t)
        if (j0 + t < seg) dst[t] = vals[t];
    }
  }
}

// kTiled: like kTiledFlat, but shared-memory rows are padded to an odd number
// of 16-byte units (no bank conflicts between rows), and each thread owns one
// 16-byte output chunk position of the block's run and loops over a subset of
// the layers: the chunk's shared-memory offsets and mask flags are computed
// once, and each layer then costs V shared loads and one 16-byte store.
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads)
    UnpackTiledKernel(const TIn* __restrict__ in, const uint8_t* __restrict__ mask,
                      int64_t rows, int layers, int k, TOut* __restrict__ out,
                      int64_t ls, bool fill, int tr, int pitch, bool vec_in, bool vec_out) {
  extern __shared__ __align__(16) unsigned char smem[];
  TIn* s = reinterpret_cast<TIn*>(smem);
  const int64_t r0 = int64_t(blockIdx.x) * tr;
  if (r0 >= rows) return;
  const int nr = int(rows - r0 < tr ? rows - r0 : tr);
  const int row_elems = layers * k;
  const TIn* src = in + r0 * row_elems;

  // Phase 1: rows r0 .. r0+nr -> shared memory, row pitch `pitch` elements.
  if (vec_in && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    const int vpr = row_elems * int(sizeof(TIn)) / 16;  // 16-byte units per row
    const int nvec = nr * vpr;
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
      const int r = i / vpr;
      const int w = i - r * vpr;
      reinterpret_cast<uint4*>(s + r * pitch)[w] = __ldg(s4 + i);
    }
  } else {
    const int n_in = nr * row_elems;
    for (int i = threadIdx.x; i < n_in; i += blockDim.x) {
      const int r = i / row_elems;
      s[r * pitch + (i - r * row_elems)] = src[i];
    }
  }
  __syncthreads();

  // Phase 2.
  constexpr int V = 16 / sizeof(TOut);
  const int seg = nr * k;
  const int nchunks = (seg + V - 1) / V;
  const int groups = nchunks >= int(blockDim.x) ? 1 : int(blockDim.x) / nchunks;
  const int work = nchunks * groups;
  for (int c = threadIdx.x; c < work; c += blockDim.x) {
    const int g = c / nchunks;
    const int j0 = (c - g * nchunks) * V;
    int off[V];
    bool neg[V];
#pragma unroll
    for (int t = 0; t < V; ++t) {
      const int j = j0 + t < seg ? j0 + t : seg - 1;
      const int rl = j / k;
      off[t] = rl * pitch + (j - rl * k) + g * k;
      neg[t] = fill && mask[r0 + rl] == 0;
    }
    const bool full = vec_out && j0 + V <= seg;
    TOut* dst = out + int64_t(g) * ls + r0 * k + j0;
    const int64_t dstep = int64_t(groups) * ls;
    const int sstep = groups * k;
#pragma unroll 4
    for (int l = g; l < layers; l += groups) {
      alignas(16) TOut vals[V];
#pragma unroll
      for (int t = 0; t < V; ++t) vals[t] = neg[t] ? TOut(-1) : TOut(s[off[t]]);
      if (full) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(vals);
      } else {
#pragma unroll
        for (int t = 0; t < V; ++t)
          if (j0 + t < seg) dst[t] = vals[t];
      }
#pragma unroll
      for (int t = 0; t < V; ++t) off[t] += sstep;
      dst += dstep;
    }
  }
}

// One thread per V consecutive outputs of one layer, gathered from global.
template <typename TIn, typename TOut>
__global__ void __launch_bounds__(kThreads)
    UnpackDirectKernel(const TIn* __restrict__ in, const uint8_t* __restrict__ mask,
                       int64_t rows, int layers, int k, TOut* __restrict__ out,
                       int64_t ls, bool fill, bool vec_out) {
  constexpr int V = 16 / sizeof(TOut);
  const int64_t seg = rows * k;
  const int64_t nchunks = (seg + V - 1) / V;
  const int64_t total = int64_t(layers) * nchunks;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < total;
       c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t l = c / nchunks;
    const int64_t j0 = (c - l * nchunks) * V;
    alignas(16) TOut vals[V];
#pragma unroll
    for (int t = 0; t < V; ++t) {
      const int64_t j = j0 + t;
      TOut v = 0;
      if (j < seg) {
        const int64_t r = j / k;
        const int64_t kk = j - r * k;
        v = TOut(__ldg(in + (r * layers + l) * k + kk));
        if (fill && mask[r] == 0) v = TOut(-1);
      }
      vals[t] = v;
    }
    TOut* dst = out + l * ls + j0;
    if (vec_out && j0 + V <= seg) {
      *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(vals);
    } else {
#pragma unroll
      for (int t = 0; t < V; ++t)
        if (j0 + t < seg) dst[t] = vals[t];
    }
  }
}

int MaxDynamicSmem() {
  static int v = [] {
    int dev = 0, val = 48 * 1024;
    if (cudaGetDevice(&dev) == cudaSuccess)
      cudaDeviceGetAttribute(&val, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return val;
  }();
  return v;
}

int NumSms() {
  static int v = [] {
    int dev = 0, val = 132;
    if (cudaGetDevice(&dev) == cudaSuccess)
      cudaDeviceGetAttribute(&val, cudaDevAttrMultiProcessorCount, dev);
    return val;
  }();
  return v;
}

int SmemPerSm() {
  static int v = [] {
    int dev = 0, val = 228 * 1024;
    if (cudaGetDevice(&dev) == cudaSuccess)
      cudaDeviceGetAttribute(&val, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    return val;
  }();
  return v;
}

// kPipelined. A grid of a few blocks per SM walks the tiles of `tr` rows in
// grid-stride order: at any moment the resident blocks work on neighbouring
// tiles, so the writes in flight cluster in one region of each layer's output
// (as with one block per tile) instead of scattering over the whole tensor,
// which costs DRAM efficiency. Each block cycles its tiles through
// kPipeStages shared-memory stages: while it writes tile i, the copies of its
// next tiles are already in flight (cp.async), so an SM always has reads
// outstanding next to its stores, also at the start, where a load-then-store
// block leaves the memory system idle for a round trip.
constexpr int kPipeStages = 3;

struct PipeParams {
  const void* in;
  const uint8_t* mask;
  void* out;
  int64_t rows;
  int64_t ntiles;
  int64_t ls;           // output layer stride, elements
  int layers;
  int k;
  int tr;               // rows per tile; tile starts keep the output runs 16-byte aligned
  int row_bytes;        // layers * K * sizeof(TIn)
  int pitch_bytes;      // shared-memory row (padded, except on the flat path)
  int stage_bytes;
  bool fill;
  bool vec_out;
  bool streaming;
};

// cp.async copies land in commit-group order; the wait below leaves the newest
// kPipeStages - 2 groups in flight. Without sm_80 the copies are plain.
template <int CP>
__device__ __forceinline__ void CpAsync(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (CP == 16) {
    // .cg: the input is read once, keep it out of L1.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(d), "l"(src), "n"(CP) : "memory");
  }
#else
  if constexpr (CP == 16) {
    *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
  } else {
    *static_cast<uint32_t*>(dst) = *static_cast<const uint32_t*>(src);
  }
#endif
}

__device__ __forceinline__ void CpAsyncCommit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void CpAsyncWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Starts the copy of `nr` contiguous input rows at src into a stage and
// commits it as one group.
// CP = 16 or 4 (row_bytes and src CP-aligned): CP-byte copies into rows
// padded to pitch_bytes. CP = 0 (rows of an odd size, or a misaligned input):
// the bytes land unpadded at their address modulo 4 (rows of such a size
// already fall in different banks), copied as aligned 4-byte words, except
// the partial words at both ends, which are copied byte by byte so that
// nothing outside the input is read.
template <int CP>
__device__ __forceinline__ void IssueTile(const unsigned char* __restrict__ src, int nr, int row_bytes,
                                         int pitch_bytes, unsigned char* dst) {
  if constexpr (CP > 0) {
    const int upr = row_bytes / CP;  // units per row
    const int n = nr * upr;
    // (r, w) of i = threadIdx.x + m * blockDim.x, stepped without a division.
    const int dr = int(blockDim.x) / upr, dw = int(blockDim.x) - dr * upr;
    int r = int(threadIdx.x) / upr, w = int(threadIdx.x) - r * upr;
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      CpAsync<CP>(dst + r * pitch_bytes + w * CP, src + i * CP);
      r += dr;
      w += dw;
      if (w >= upr) {
        w -= upr;
        ++r;
      }
    }
    CpAsyncCommit();
  } else {
    const int shift = int(reinterpret_cast<uintptr_t>(src) & 3);
    const unsigned char* a0 = src - shift;
    const int end = shift + nr * row_bytes;  // stage offset past the last byte
    const int words = (end + 3) / 4;
    for (int i = threadIdx.x; i < words; i += blockDim.x) {
      const int b = 4 * i;
      if (b >= shift && b + 4 <= end) {
        CpAsync<4>(dst + b, a0 + b);
      } else {
        for (int j = b < shift ? shift : b; j < b + 4 && j < end; ++j) dst[j] = a0[j];
      }
    }
    CpAsyncCommit();
  }
}

// A thread's share of one tile: the V consecutive outputs j0 .. j0+V-1 of the
// tile's per-layer run (nr * K elements) for layers g, g + groups, ... The
// shared-memory offsets are computed once per tile shape, not per layer.
template <typename TOut>
struct ChunkPlan {
  static constexpr int V = 16 / int(sizeof(TOut));
  int seg;
  int j0;
  int g;
  int groups;  // g >= groups: the thread has nothing to write
  int off[V];  // element offset in the stage, layer 0
  int row[V];  // tile row (mask index)
};

template <typename TOut>
__device__ __forceinline__ ChunkPlan<TOut> PlanChunk(int nr, int k, int pitch) {
  constexpr int V = ChunkPlan<TOut>::V;
  ChunkPlan<TOut> p;
  p.seg = nr * k;
  const int nchunks = (p.seg + V - 1) / V;  // <= blockDim.x (host)
  p.groups = int(blockDim.x) / nchunks;
  p.g = int(threadIdx.x) / nchunks;
  p.j0 = (int(threadIdx.x) - p.g * nchunks) * V;
  int r = p.j0 / k, kk = p.j0 - r * k;
#pragma unroll
  for (int t = 0; t < V; ++t) {
    // Past the run's end: a valid offset that is never stored.
    const bool in = p.j0 + t < p.seg;
    p.off[t] = in ? r * pitch + kk : p.off[0];
    p.row[t] = in ? r : p.row[0];
    if (++kk == k) {
      kk = 0;
      ++r;
    }
  }
  return p;
}

// V ids at s (V * sizeof(TIn) <= 8 bytes, aligned), widened.
template <typename TIn, typename TOut, int V>
__device__ __forceinline__ void LoadPacked(const TIn* s, TOut (&v)[V]) {
  constexpr int B = V * int(sizeof(TIn));
  using W = std::conditional_t<B == 2, uint16_t, std::conditional_t<B == 4, uint32_t, unsigned long long>>;
  const W w = *reinterpret_cast<const W*>(s);
  constexpr int bits = 8 * int(sizeof(TIn));
#pragma unroll
  for (int t = 0; t < V; ++t) v[t] = TOut((w >> (t * bits)) & ((1u << bits) - 1));
}

// KVEC: K % V == 0 (a chunk never crosses a row) and aligned rows: the V ids
// of a chunk are one shared-memory load.
template <typename TIn, typename TOut, bool KVEC>
__device__ __forceinline__ void StoreTile(const ChunkPlan<TOut>& p, const TIn* __restrict__ s,
                                          const uint8_t* __restrict__ smask, const PipeParams& pp,
                                          TOut* __restrict__ out) {
  constexpr int V = ChunkPlan<TOut>::V;
  if (p.g >= p.groups) return;
  bool neg[V];
#pragma unroll
  for (int t = 0; t < V; ++t) neg[t] = pp.fill && smask[p.row[t]] == 0;
  const bool full = pp.vec_out && p.j0 + V <= p.seg;
  TOut* dst = out + int64_t(p.g) * pp.ls + p.j0;
  const int64_t dstep = int64_t(p.groups) * pp.ls;
  const int sstep = p.groups * pp.k;
  int lo = p.g * pp.k;
#pragma unroll 4
  for (int l = p.g; l < pp.layers; l += p.groups) {
    alignas(16) TOut v[V];
    if constexpr (KVEC) {
      LoadPacked<TIn, TOut, V>(s + p.off[0] + lo, v);
    } else {
#pragma unroll
      for (int t = 0; t < V; ++t) v[t] = TOut(s[p.off[t] + lo]);
    }
#pragma unroll
    for (int t = 0; t < V; ++t)
      if (neg[t]) v[t] = TOut(-1);
    if (full) {
      const uint4 u = *reinterpret_cast<const uint4*>(v);
      if (pp.streaming) {
        __stcs(reinterpret_cast<uint4*>(dst), u);  // evict-first: the output is not re-read here
      } else {
        *reinterpret_cast<uint4*>(dst) = u;
      }
    } else {
#pragma unroll
      for (int t = 0; t < V; ++t)
        if (p.j0 + t < p.seg) dst[t] = v[t];
    }
    lo += sstep;
    dst += dstep;
  }
}

template <typename TIn, typename TOut, int CP, bool KVEC>
__global__ void __launch_bounds__(kThreads) UnpackPipelinedKernel(const PipeParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  // This block's tiles: blockIdx.x + i * gridDim.x, i < mine.
  const int64_t mine = (p.ntiles - blockIdx.x + gridDim.x - 1) / gridDim.x;
  const unsigned char* in = static_cast<const unsigned char*>(p.in);
  TOut* out = static_cast<TOut*>(p.out);
  const int pitch = p.pitch_bytes / int(sizeof(TIn));
  uint8_t* smask = smem + kPipeStages * p.stage_bytes;
  auto first_row = [&](int64_t i) { return (int64_t(blockIdx.x) + i * gridDim.x) * p.tr; };
  auto tile_rows = [&](int64_t r0) { return int(p.rows - r0 < p.tr ? p.rows - r0 : p.tr); };

#pragma unroll
  for (int i = 0; i < kPipeStages - 1; ++i) {
    if (i < mine) {
      const int64_t r0 = first_row(i);
      const int nr = tile_rows(r0);
      IssueTile<CP>(in + r0 * p.row_bytes, nr, p.row_bytes, p.pitch_bytes,
                               smem + i * p.stage_bytes);
      if (p.fill && int(threadIdx.x) < nr) smask[i * p.tr + threadIdx.x] = p.mask[r0 + threadIdx.x];
    } else {
      CpAsyncCommit();  // one group per tile slot keeps the wait count right
    }
  }
  const ChunkPlan<TOut> full = PlanChunk<TOut>(p.tr, p.k, pitch);
  for (int64_t i = 0; i < mine; ++i) {
    CpAsyncWait<kPipeStages - 2>();
    // Tile i is visible to the whole block, and every thread is done with
    // tile i-1, whose stage the prefetch below refills.
    __syncthreads();
    const int64_t in_ = i + kPipeStages - 1;
    const int sn = int(in_ % kPipeStages);
    int nrn = 0;
    uint8_t mnext = 1;
    if (in_ < mine) {
      const int64_t rn = first_row(in_);
      nrn = tile_rows(rn);
      IssueTile<CP>(in + rn * p.row_bytes, nrn, p.row_bytes, p.pitch_bytes,
                                smem + sn * p.stage_bytes);
      // Loaded now, stored to shared memory after this tile: its latency
      // hides behind the tile's stores instead of stalling them.
      if (p.fill && int(threadIdx.x) < nrn) mnext = __ldg(p.mask + rn + threadIdx.x);
    } else {
      CpAsyncCommit();
    }
    const int st = int(i % kPipeStages);
    const int64_t r0 = first_row(i);
    const int shift = CP == 0 ? int(reinterpret_cast<uintptr_t>(in + r0 * p.row_bytes) & 3) : 0;
    const TIn* s = reinterpret_cast<const TIn*>(smem + st * p.stage_bytes + shift);
    TOut* o = out + r0 * p.k;
    const int nr = tile_rows(r0);
    if (nr == p.tr) {
      StoreTile<TIn, TOut, KVEC>(full, s, smask + st * p.tr, p, o);
    } else {
      StoreTile<TIn, TOut, KVEC>(PlanChunk<TOut>(nr, p.k, pitch), s, smask + st * p.tr, p, o);
    }
    if (p.fill && int(threadIdx.x) < nrn) smask[sn * p.tr + threadIdx.x] = mnext;
  }
}

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Resident blocks per SM of `kern` with `smem` bytes, after making sure its
// dynamic shared-memory limit allows `smem`. Both cached: unpack runs once
// per micro-batch and these are driver round trips. The limit is only ever
// raised, so a launch with less shared memory never undoes a larger one's.
KernelStatus PrepareKernel(const void* kern, int64_t smem, int* resident) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int64_t> limit;               // (kernel, device)
  static std::map<std::pair<const void*, int64_t>, int> occupancy;           // (kernel, smem * 256 + device)
  std::lock_guard<std::mutex> lock(mu);
  int dev = 0;
  if (auto s = CheckCall(cudaGetDevice(&dev), "cudaGetDevice"); !s.ok()) return s;
  int64_t& lim = limit[{kern, dev}];
  if (smem > 48 * 1024 && smem > lim) {
    if (auto s = CheckCall(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
                           "cudaFuncSetAttribute");
        !s.ok())
      return s;
    lim = smem;
  }
  const auto key = std::make_pair(kern, smem * 256 + dev);
  if (auto it = occupancy.find(key); it != occupancy.end()) {
    *resident = it->second;
    return KernelStatus::Ok();
  }
  if (auto s = CheckCall(cudaOccupancyMaxActiveBlocksPerMultiprocessor(resident, kern, kThreads, size_t(smem)),
                         "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      !s.ok())
    return s;
  occupancy[key] = *resident;
  return KernelStatus::Ok();
}

// Automatic knobs, from the benchmark's sweep on an H200 (docs/kernels.md):
// input tiles of at most about 32 KB, as many blocks per SM (up to 3) as
// their stages leave shared memory for, and streaming stores.
constexpr int64_t kPipeTileBytes = 32 << 10;
constexpr int kPipeMaxBlocksPerSm = 3;

// Launches kPipelined; *fits = false (and INVALID_ARGUMENT) when a tile of
// the smallest size does not fit in shared memory.
template <typename TIn, typename TOut>
KernelStatus LaunchPipelined(const UnpackArgs& a, const UnpackConfig& cfg, cudaStream_t st,
                             bool* fits) {
  constexpr int V = 16 / int(sizeof(TOut));
  constexpr int isz = int(sizeof(TIn));
  *fits = true;
  PipeParams p{};
  p.in = a.experts;
  p.mask = a.mask;
  p.out = a.out;
  p.rows = a.rows;
  p.layers = int(a.layers);
  p.k = a.k;
  p.ls = a.out_layer_stride == -1 ? a.rows * a.k : a.out_layer_stride;
  p.fill = a.masked_fill_minus_one && a.mask != nullptr;
  p.vec_out = (reinterpret_cast<uintptr_t>(a.out) & 15) == 0 &&
              (p.ls * int64_t(sizeof(TOut))) % 16 == 0;
  p.streaming = cfg.streaming_stores != 0;
  const int64_t row_bytes = a.layers * a.k * isz;
  const uintptr_t ia = reinterpret_cast<uintptr_t>(a.experts);
  const int cp = row_bytes % 16 == 0 && ia % 16 == 0 ? 16 : row_bytes % 4 == 0 && ia % 4 == 0 ? 4 : 0;
  // Padded rows: an odd number of copy units (4-byte words for CP = 4), so
  // the rows a warp reads for one layer fall in different banks.
  int64_t pitch = row_bytes;
  if (cp == 16 && (pitch / 16) % 2 == 0) pitch += 16;
  if (cp == 4 && (pitch / 4) % 2 == 0) pitch += 4;
  const bool kvec = cp != 0 && a.k % V == 0 && pitch % (V * isz) == 0;
  auto smem_for = [&](int64_t tr) {
    const int64_t stage = RoundUp(tr * pitch + (cp == 0 ? 4 : 0), 16);
    return kPipeStages * stage + (p.fill ? RoundUp(kPipeStages * tr, 16) : 0);
  };
  const int64_t smem_max = MaxDynamicSmem();
  // Tiles start at multiples of the granule, so that each tile's per-layer
  // output run starts on an aligned boundary: a 128-byte line shared by two
  // tiles is written by two SMs at different times, and in the sweep runs
  // aligned to 512 bytes beat those aligned to 128 by several percent. The
  // largest alignment whose granule is no larger than the tile wanted (and
  // fits) wins; 16 bytes, which the vector stores need, is the floor.
  const int64_t tr_cap_rows = std::min<int64_t>(kThreads, int64_t(kThreads) * V / a.k);
  const int64_t tr_want = cfg.tile_rows > 0 ? cfg.tile_rows : kPipeTileBytes / row_bytes;
  auto granule_for = [&](int align) {
    int g = align;
    while (g > 1 && (a.k * int(sizeof(TOut))) % g != 0) g /= 2;
    return p.vec_out ? align / g : 1;
  };
  int granule = granule_for(16);
  for (int align : {512, 256, 128}) {
    const int g = granule_for(align);
    if (g <= std::max<int64_t>(tr_want, 1) && g <= tr_cap_rows && smem_for(g) <= smem_max) {
      granule = g;
      break;
    }
  }
  if (smem_for(granule) > smem_max) {
    *fits = false;
    return KernelStatus::InvalidArgument("pipelined unpack: layers * K too large for shared memory");
  }
  // A tile's run is at most one chunk per thread, and a thread stages at
  // most one mask byte.
  const int64_t tr_cap = std::max<int64_t>(granule, tr_cap_rows / granule * granule);
  int64_t tr;
  if (cfg.tile_rows > 0) {
    tr = std::max<int64_t>(granule, std::min<int64_t>(cfg.tile_rows, tr_cap) / granule * granule);
  } else {
    // Power-of-two tiles (granules are powers of two): in the sweep,
    // neighbouring sizes that are not (80 or 84 rows against 64) lost up to
    // 10 % on some shapes.
    tr = granule;
    while (tr * 2 <= std::min(tr_want, tr_cap)) tr *= 2;
    // Few tiles: every SM should get the same number of rows, since a
    // memory-bound SM with an extra tile sets the time. Minimise the rows
    // of the busiest SM, larger tiles first on ties.
    const int64_t sms = NumSms();
    if ((a.rows + tr - 1) / tr < 2 * sms) {
      auto busiest = [&](int64_t t) { return ((a.rows + t - 1) / t + sms - 1) / sms * t; };
      int64_t best = tr;
      for (int64_t t = tr / 2; t >= granule; t /= 2)
        if (busiest(t) < busiest(best)) best = t;
      tr = best;
    }
  }
  int bps = cfg.blocks_per_sm > 0 ? cfg.blocks_per_sm : kPipeMaxBlocksPerSm;
  bps = std::min(bps, 2048 / kThreads);
  if (cfg.blocks_per_sm > 0) {
    // Share of an SM's shared memory per resident block (1 KB is reserved per block).
    const int64_t budget = std::min<int64_t>(smem_max, SmemPerSm() / bps - 1024);
    while (tr > granule && smem_for(tr) > budget) tr -= granule;
  } else {
    while (tr > granule && smem_for(tr) > smem_max) tr /= 2;
    bps = int(std::max<int64_t>(1, std::min<int64_t>(bps, SmemPerSm() / (smem_for(tr) + 1024))));
  }
  p.tr = int(tr);
  p.ntiles = (a.rows + tr - 1) / tr;
  p.row_bytes = int(row_bytes);
  p.pitch_bytes = int(pitch);
  p.stage_bytes = int(RoundUp(tr * pitch + (cp == 0 ? 4 : 0), 16));
  const int64_t smem = smem_for(tr);

  auto launch = [&](auto kern) -> KernelStatus {
    int resident = 0;
    if (auto s = PrepareKernel(reinterpret_cast<const void*>(kern), smem, &resident); !s.ok()) return s;
    if (resident < 1) return KernelStatus::Internal("pipelined unpack: no block fits on an SM");
    // Every block resident at once; then spread the tiles evenly over the
    // fewest blocks that keep the number of rounds (tiles per block) minimal.
    const int64_t slots = int64_t(NumSms()) * std::min(bps, resident);
    const int64_t rounds = (p.ntiles + slots - 1) / slots;
    const int64_t grid = (p.ntiles + rounds - 1) / rounds;
    kern<<<dim3(unsigned(grid)), kThreads, size_t(smem), st>>>(p);
    return CheckLaunch("UnpackPipelinedKernel");
  };
  if (cp == 16) {
    return kvec ? launch(UnpackPipelinedKernel<TIn, TOut, 16, true>)
                : launch(UnpackPipelinedKernel<TIn, TOut, 16, false>);
  }
  if (cp == 4) {
    return kvec ? launch(UnpackPipelinedKernel<TIn, TOut, 4, true>)
                : launch(UnpackPipelinedKernel<TIn, TOut, 4, false>);
  }
  return launch(UnpackPipelinedKernel<TIn, TOut, 0, false>);
}

template <typename TIn, typename TOut>
KernelStatus LaunchUnpack(const UnpackArgs& a, UnpackVariant variant, cudaStream_t st) {
  if (variant == UnpackVariant::kAuto || variant == UnpackVariant::kPipelined) {
    bool fits = true;
    KernelStatus s = LaunchPipelined<TIn, TOut>(a, UnpackConfig{}, st, &fits);
    if (fits || variant == UnpackVariant::kPipelined) return s;
  }
  const int64_t ls = a.out_layer_stride == -1 ? a.rows * a.k : a.out_layer_stride;
  const bool fill = a.masked_fill_minus_one && a.mask != nullptr;
  const TIn* in = static_cast<const TIn*>(a.experts);
  TOut* out = static_cast<TOut*>(a.out);
  const bool out_aligned = (reinterpret_cast<uintptr_t>(out) & 15) == 0 &&
                           (ls * int64_t(sizeof(TOut))) % 16 == 0;
  const int64_t row_bytes = a.layers * a.k * int64_t(sizeof(TIn));
  // Padded shared-memory row: an odd number of 16-byte units when rows are
  // whole units (16-byte loads), else an odd number of 4-byte words.
  const bool vec_in = row_bytes % 16 == 0;
  int64_t pitch_bytes;
  if (vec_in) {
    pitch_bytes = row_bytes + ((row_bytes / 16) % 2 == 0 ? 16 : 0);
  } else {
    pitch_bytes = (row_bytes + 3) / 4 * 4;
    if ((pitch_bytes / 4) % 2 == 0) pitch_bytes += 4;
  }
  const bool flat = variant == UnpackVariant::kTiledFlat;
  const int64_t tile_row_bytes = flat ? row_bytes : pitch_bytes;
  // Rows per tile: a multiple of 16 (keeps every tile's input start and output
  // runs 16-byte aligned), about 8 KB of shared memory.
  int64_t tr = (8192 / tile_row_bytes) / 16 * 16;
  if (tr < 16) tr = 16;
  if (tr > 512) tr = 512;
  const int64_t smem = tr * tile_row_bytes;
  if (variant == UnpackVariant::kAuto)
    variant = smem <= MaxDynamicSmem() ? UnpackVariant::kTiled : UnpackVariant::kDirect;
  if (variant == UnpackVariant::kTiled || variant == UnpackVariant::kTiledFlat) {
    if (smem > MaxDynamicSmem())
      return KernelStatus::InvalidArgument("tiled unpack: layers * K too large for shared memory");
    const int64_t grid = (a.rows + tr - 1) / tr;
    if (grid > (1LL << 31) - 1) return KernelStatus::InvalidArgument("too many rows");
    // In-tile offsets are int: tr * pitch <= shared memory size.
    auto flat_kern = UnpackTiledFlatKernel<TIn, TOut>;
    auto kern = UnpackTiledKernel<TIn, TOut>;
    if (smem > 48 * 1024) {
      cudaError_t e = flat ? cudaFuncSetAttribute(flat_kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem))
                           : cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
      if (auto s = CheckCall(e, "cudaFuncSetAttribute"); !s.ok()) return s;
    }
    if (flat) {
      flat_kern<<<dim3(unsigned(grid)), kThreads, size_t(smem), st>>>(
          in, a.mask, a.rows, int(a.layers), a.k, out, ls, fill, int(tr), out_aligned);
      return CheckLaunch("UnpackTiledFlatKernel");
    }
    kern<<<dim3(unsigned(grid)), kThreads, size_t(smem), st>>>(
        in, a.mask, a.rows, int(a.layers), a.k, out, ls, fill, int(tr),
        int(pitch_bytes / int64_t(sizeof(TIn))), vec_in, out_aligned);
    return CheckLaunch("UnpackTiledKernel");
  }
  constexpr int64_t V = 16 / sizeof(TOut);
  const int64_t chunks = a.layers * ((a.rows * a.k + V - 1) / V);
  const int64_t grid = std::min<int64_t>(GridFor(chunks, kThreads), int64_t(NumSms()) * 16);
  UnpackDirectKernel<TIn, TOut><<<dim3(unsigned(grid)), kThreads, 0, st>>>(
      in, a.mask, a.rows, int(a.layers), a.k, out, ls, fill, out_aligned);
  return CheckLaunch("UnpackDirectKernel");
}

// ------------------------------------------------------------ shared device

__device__ __forceinline__ int64_t LoadIdx(const void* p, int type, int64_t off) {
  switch (type) {
    case int(IndexType::kU8):
      return __ldg(static_cast<const uint8_t*>(p) + off);
    case int(IndexType::kU16):
      return __ldg(static_cast<const uint16_t*>(p) + off);
    case int(IndexType::kI32):
      return __ldg(static_cast<const int32_t*>(p) + off);
    default:
      return __ldg(static_cast<const long long*>(p) + off);
  }
}

template <bool BF16>
__device__ __forceinline__ float LoadLogit(const void* p, int64_t off) {
  if constexpr (BF16) {
    const unsigned short b = __ldg(static_cast<const unsigned short*>(p) + off);
    return __uint_as_float(uint32_t(b) << 16);
  } else {
    return __ldg(static_cast<const float*>(p) + off);
  }
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

struct ApplyParams {
  const void* logits;
  const void* ids;
  int ids_type;
  int64_t ids_row_stride;
  int64_t rows;
  int e;
  int k;
  bool softmax;
  bool renorm;
  float scale;
  float eps;
};

// Loads one row (lane holds e = lane + 32 j) and returns max and sum of
// exp(x - max) (softmax only).
template <bool BF16, int NPL>
__device__ __forceinline__ void LoadRow(const ApplyParams& p, int64_t row, int lane,
                                        float (&x)[NPL], float& mx, float& sum) {
#pragma unroll
  for (int j = 0; j < NPL; ++j) {
    const int e = lane + 32 * j;
    x[j] = e < p.e ? LoadLogit<BF16>(p.logits, row * p.e + e) : -INFINITY;
  }
  mx = 0.f;
  sum = 0.f;
  if (p.softmax) {
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < NPL; ++j) m = fmaxf(m, x[j]);
    mx = WarpMax(m);
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < NPL; ++j)
      if (lane + 32 * j < p.e) s += expf(x[j] - mx);
    sum = WarpSum(s);
  }
}

__device__ __forceinline__ float Score(const ApplyParams& p, float x, float mx, float sum) {
  return p.softmax ? expf(x - mx) / sum : 1.0f / (1.0f + expf(-x));
}

template <bool BF16, int NPL>
__global__ void __launch_bounds__(kThreads)
    ApplyForwardKernel(ApplyParams p, float* __restrict__ probs, uint8_t* __restrict__ map,
                       float* __restrict__ dense) {
  const int lane = threadIdx.x & 31;
  const int64_t warp0 = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t nwarps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = warp0; row < p.rows; row += nwarps) {
    float x[NPL], mx, sum;
    LoadRow<BF16, NPL>(p, row, lane, x, mx, sum);
    int64_t id = 0;
    bool valid = true;
    float pk = 0.f;
    if (lane < p.k) {
      id = LoadIdx(p.ids, p.ids_type, row * p.ids_row_stride + lane);
      valid = id >= 0 && id < p.e;
      if (valid) pk = Score(p, LoadLogit<BF16>(p.logits, row * p.e + id), mx, sum);
    }
    const bool bad = __any_sync(kFull, !valid);
    const float S = WarpSum(pk);
    float q = p.renorm ? pk / (S + p.eps) : pk;
    q *= p.scale;
    if (bad) q = NAN;
    if (lane < p.k) probs[row * p.k + lane] = q;
    if (map != nullptr) {
      uint8_t* mrow = map + row * p.e;
      if ((p.e & 15) == 0 && (reinterpret_cast<uintptr_t>(map) & 15) == 0) {
        for (int i = lane; i < p.e / 16; i += 32) reinterpret_cast<uint4*>(mrow)[i] = make_uint4(0, 0, 0, 0);
      } else {
        for (int i = lane; i < p.e; i += 32) mrow[i] = 0;
      }
    }
    if (dense != nullptr) {
      float* drow = dense + row * p.e;
      const float z = bad ? NAN : 0.f;
      if ((p.e & 3) == 0 && (reinterpret_cast<uintptr_t>(dense) & 15) == 0) {
        for (int i = lane; i < p.e / 4; i += 32) reinterpret_cast<float4*>(drow)[i] = make_float4(z, z, z, z);
      } else {
        for (int i = lane; i < p.e; i += 32) drow[i] = z;
      }
    }
    __syncwarp();
    if (lane < p.k && valid && !bad) {
      if (map != nullptr) map[row * p.e + id] = 1;
      if (dense != nullptr) dense[row * p.e + id] = q;
    }
    __syncwarp();
  }
}

template <bool BF16>
__device__ __forceinline__ void StoreGrad(void* g, int64_t off, float v) {
  if constexpr (BF16) {
    static_cast<__nv_bfloat16*>(g)[off] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(g)[off] = v;
  }
}

template <bool BF16, int NPL>
__global__ void __launch_bounds__(kThreads)
    ApplyBackwardKernel(ApplyParams p, const float* __restrict__ gprobs, void* __restrict__ gx) {
  const int lane = threadIdx.x & 31;
  const int64_t warp0 = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t nwarps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t row = warp0; row < p.rows; row += nwarps) {
    float x[NPL], mx, sum;
    LoadRow<BF16, NPL>(p, row, lane, x, mx, sum);
    int64_t id = -1;
    bool valid = true;
    float pk = 0.f, g = 0.f, one_minus = 0.f;
    if (lane < p.k) {
      id = LoadIdx(p.ids, p.ids_type, row * p.ids_row_stride + lane);
      valid = id >= 0 && id < p.e;
      if (valid) {
        const float xi = LoadLogit<BF16>(p.logits, row * p.e + id);
        pk = Score(p, xi, mx, sum);
        // 1 - sigmoid(x) = sigmoid(-x), without the cancellation of 1 - pk.
        if (!p.softmax) one_minus = 1.0f / (1.0f + expf(xi));
      }
      g = gprobs[row * p.k + lane];
    }
    const bool bad = __any_sync(kFull, !valid);
    float dp;
    if (p.renorm) {
      // q = p / denom exactly as in the forward; with K = 1, q == 1 and the
      // gradient is exactly 0.
      const float denom = WarpSum(pk) + p.eps;
      const float gq = WarpSum(g * (pk / denom));
      dp = p.scale * (g - gq) / denom;
    } else {
      dp = p.scale * g;
    }
    if (lane >= p.k) dp = 0.f;
    // Sum of dp over the lanes holding the same id (repeated ids).
    float dpt = 0.f;
    for (int k2 = 0; k2 < p.k; ++k2) {
      const long long id2 = __shfl_sync(kFull, (long long)id, k2);
      const float dp2 = __shfl_sync(kFull, dp, k2);
      if (id2 == id) dpt += dp2;
    }
    if (p.softmax) {
      const float c = WarpSum(dp * pk);
#pragma unroll
      for (int j = 0; j < NPL; ++j) {
        const int e = lane + 32 * j;
        if (e < p.e) StoreGrad<BF16>(gx, row * p.e + e, bad ? NAN : -(expf(x[j] - mx) / sum) * c);
      }
      __syncwarp();
      if (lane < p.k && valid && !bad) StoreGrad<BF16>(gx, row * p.e + id, pk * (dpt - c));
    } else {
#pragma unroll
      for (int j = 0; j < NPL; ++j) {
        const int e = lane + 32 * j;
        if (e < p.e) StoreGrad<BF16>(gx, row * p.e + e, bad ? NAN : 0.f);
      }
      __syncwarp();
      if (lane < p.k && valid && !bad) StoreGrad<BF16>(gx, row * p.e + id, dpt * pk * one_minus);
    }
    __syncwarp();
  }
}

ApplyParams MakeParams(const ApplyArgs& a) {
  ApplyParams p;
  p.logits = a.logits;
  p.ids = a.ids.data;
  p.ids_type = int(a.ids.type);
  p.ids_row_stride = a.ids.row_stride;
  p.rows = a.rows;
  p.e = a.experts;
  p.k = a.k;
  p.softmax = a.score == ScoreFunction::kSoftmax;
  p.renorm = a.renormalize;
  p.scale = a.scale;
  p.eps = a.score == ScoreFunction::kSigmoid ? 1e-20f : 0.f;
  return p;
}

// Calls f(std::integral_constant<int, NPL>) with NPL = ceil(E / 32) rounded up
// to a power of two.
template <typename F>
KernelStatus DispatchNpl(int e, F&& f) {
  if (e <= 32) return f(std::integral_constant<int, 1>());
  if (e <= 64) return f(std::integral_constant<int, 2>());
  if (e <= 128) return f(std::integral_constant<int, 4>());
  if (e <= 256) return f(std::integral_constant<int, 8>());
  if (e <= 512) return f(std::integral_constant<int, 16>());
  return f(std::integral_constant<int, 32>());
}

int64_t RowGrid(int64_t rows) {
  return std::min<int64_t>(GridFor(rows, kWarpsPerBlock), int64_t(NumSms()) * 64);
}

// ---------------------------------------------------------------- agreement

struct AgreeParams {
  const void* logits;  // null for the ids variant
  int64_t logits_layer_stride;
  const void* live;
  int live_type;
  int64_t live_row_stride, live_layer_stride;
  const void* rep;
  int rep_type;
  int64_t rep_row_stride, rep_layer_stride;
  const uint8_t* mask;
  int64_t rows;
  int e;
  int k;
};

// Lanes < K hold live id `lv` and replay id `rv`; returns (differ, overlap)
// for the row, valid in every lane.
__device__ __forceinline__ void CompareRow(int lane, int k, long long lv, long long rv,
                                           bool* differ, int* overlap) {
  bool r_in_l = false, l_in_r = false, r_first = true;
  for (int k2 = 0; k2 < k; ++k2) {
    const long long l2 = __shfl_sync(kFull, lv, k2);
    const long long r2 = __shfl_sync(kFull, rv, k2);
    r_in_l |= (l2 == rv);
    l_in_r |= (r2 == lv);
    if (k2 < lane && r2 == rv) r_first = false;
  }
  const bool active = lane < k;
  const unsigned ok = __ballot_sync(kFull, !active || (r_in_l && l_in_r));
  const unsigned ov = __ballot_sync(kFull, active && r_first && r_in_l);
  *differ = ok != kFull;
  *overlap = __popc(ov);
}

// Block = one layer (blockIdx.y) x a stride of rows; one warp per row.
template <bool FROM_LOGITS, bool BF16, int NPL>
__global__ void __launch_bounds__(kThreads)
    AgreementKernel(AgreeParams p, unsigned long long* __restrict__ stats) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t l = blockIdx.y;
  long long counted = 0, differ = 0, overlap = 0;
  for (int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + warp; row < p.rows;
       row += int64_t(gridDim.x) * kWarpsPerBlock) {
    if (p.mask != nullptr && p.mask[row] == 0) continue;
    long long lv = -1, rv = -2;
    if (lane < p.k)
      rv = LoadIdx(p.rep, p.rep_type, l * p.rep_layer_stride + row * p.rep_row_stride + lane);
    if constexpr (FROM_LOGITS) {
      float x[NPL];
      const int64_t base = l * p.logits_layer_stride + row * p.e;
#pragma unroll
      for (int j = 0; j < NPL; ++j) {
        const int e = lane + 32 * j;
        x[j] = e < p.e ? LoadLogit<BF16>(p.logits, base + e) : 0.f;
      }
      unsigned taken = 0;  // bit j: element lane + 32 j already selected
      for (int round = 0; round < p.k; ++round) {
        float bv = -INFINITY;
        int bid = 0x7fffffff;
        int bj = -1;
#pragma unroll
        for (int j = 0; j < NPL; ++j) {
          const int e = lane + 32 * j;
          if (e < p.e && !(taken & (1u << j)) && (x[j] > bv || (x[j] == bv && e < bid))) {
            bv = x[j];
            bid = e;
            bj = j;
          }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          const float ov = __shfl_xor_sync(kFull, bv, o);
          const int oid = __shfl_xor_sync(kFull, bid, o);
          if (ov > bv || (ov == bv && oid < bid)) {
            bv = ov;
            bid = oid;
          }
        }
        // bid is now the round's winner in every lane.
        if (bj >= 0 && lane + 32 * bj == bid) taken |= 1u << bj;
        if (lane == round) lv = bid;
      }
    } else {
      if (lane < p.k)
        lv = LoadIdx(p.live, p.live_type, l * p.live_layer_stride + row * p.live_row_stride + lane);
    }
    bool d;
    int ov;
    CompareRow(lane, p.k, lv, rv, &d, &ov);
    counted += 1;
    differ += d;
    overlap += ov;
  }
  __shared__ long long red[3][kWarpsPerBlock];
  if (lane == 0) {
    red[0][warp] = counted;
    red[1][warp] = differ;
    red[2][warp] = overlap;
  }
  __syncthreads();
  if (threadIdx.x < 3) {
    long long s = 0;
    for (int w = 0; w < kWarpsPerBlock; ++w) s += red[threadIdx.x][w];
    if (s != 0) atomicAdd(stats + l * 3 + threadIdx.x, (unsigned long long)s);
  }
}

KernelStatus LaunchAgreement(const AgreeParams& p, bool from_logits, bool bf16,
                             int64_t layers, AgreementStats* stats, cudaStream_t st) {
  static_assert(sizeof(AgreementStats) == 3 * sizeof(unsigned long long), "layout");
  if (layers == 0) return KernelStatus::Ok();
  if (stats == nullptr) return KernelStatus::InvalidArgument("null stats");
  if (layers > 65535) return KernelStatus::InvalidArgument("layers > 65535");
  if (auto s = CheckCall(cudaMemsetAsync(stats, 0, size_t(layers) * sizeof(AgreementStats), st),
                         "cudaMemsetAsync");
      !s.ok())
    return s;
  if (p.rows == 0) return KernelStatus::Ok();
  auto* out = reinterpret_cast<unsigned long long*>(stats);
  const int64_t gx = std::max<int64_t>(
      1, std::min<int64_t>(GridFor(p.rows, kWarpsPerBlock), (int64_t(NumSms()) * 32 + layers - 1) / layers));
  const dim3 grid{unsigned(gx), unsigned(layers), 1u};
  if (!from_logits) {
    AgreementKernel<false, false, 1><<<grid, kThreads, 0, st>>>(p, out);
    return CheckLaunch("AgreementKernel(ids)");
  }
  return DispatchNpl(p.e, [&](auto npl) {
    constexpr int N = decltype(npl)::value;
    if (bf16)
      AgreementKernel<true, true, N><<<grid, kThreads, 0, st>>>(p, out);
    else
      AgreementKernel<true, false, N><<<grid, kThreads, 0, st>>>(p, out);
    return CheckLaunch("AgreementKernel(logits)");
  });
}

}  // namespace

KernelStatus UnpackWithVariant(const UnpackArgs& a, UnpackVariant v, void* stream) {
  if (auto s = ValidateUnpack(a); !s.ok()) return s;
  if (a.rows == 0 || a.layers == 0) return KernelStatus::Ok();
  if (a.layers > (1LL << 24)) return KernelStatus::InvalidArgument("layers too large");
  auto st = static_cast<cudaStream_t>(stream);
  const bool u8 = a.in_type == IndexType::kU8;
  const bool i64 = a.out_type == OutIndexType::kI64;
  if (u8 && i64) return LaunchUnpack<uint8_t, long long>(a, v, st);
  if (u8) return LaunchUnpack<uint8_t, int32_t>(a, v, st);
  if (i64) return LaunchUnpack<uint16_t, long long>(a, v, st);
  return LaunchUnpack<uint16_t, int32_t>(a, v, st);
}

KernelStatus Unpack(const UnpackArgs& a, void* stream) {
  return UnpackWithVariant(a, UnpackVariant::kAuto, stream);
}

KernelStatus UnpackPipelined(const UnpackArgs& a, const UnpackConfig& c, void* stream) {
  if (auto s = ValidateUnpack(a); !s.ok()) return s;
  if (a.rows == 0 || a.layers == 0) return KernelStatus::Ok();
  if (a.layers > (1LL << 24)) return KernelStatus::InvalidArgument("layers too large");
  auto st = static_cast<cudaStream_t>(stream);
  bool fits = true;
  const bool u8 = a.in_type == IndexType::kU8;
  const bool i64 = a.out_type == OutIndexType::kI64;
  if (u8 && i64) return LaunchPipelined<uint8_t, long long>(a, c, st, &fits);
  if (u8) return LaunchPipelined<uint8_t, int32_t>(a, c, st, &fits);
  if (i64) return LaunchPipelined<uint16_t, long long>(a, c, st, &fits);
  return LaunchPipelined<uint16_t, int32_t>(a, c, st, &fits);
}

KernelStatus ApplyForward(const ApplyArgs& a, const ApplyForwardOut& out, void* stream) {
  if (auto s = ValidateApply(a); !s.ok()) return s;
  if (a.rows > 0 && out.probs == nullptr)
    return KernelStatus::InvalidArgument("null probs output");
  if (a.rows == 0) return KernelStatus::Ok();
  auto st = static_cast<cudaStream_t>(stream);
  const ApplyParams p = MakeParams(a);
  const dim3 grid(unsigned(RowGrid(a.rows)));
  return DispatchNpl(a.experts, [&](auto npl) {
    constexpr int N = decltype(npl)::value;
    if (a.logits_type == FloatType::kBF16)
      ApplyForwardKernel<true, N><<<grid, kThreads, 0, st>>>(p, out.probs, out.routing_map,
                                                            out.probs_dense);
    else
      ApplyForwardKernel<false, N><<<grid, kThreads, 0, st>>>(p, out.probs, out.routing_map,
                                                             out.probs_dense);
    return CheckLaunch("ApplyForwardKernel");
  });
}

KernelStatus ApplyBackward(const ApplyArgs& a, const float* grad_probs, void* grad_logits,
                           void* stream) {
  if (auto s = ValidateApply(a); !s.ok()) return s;
  if (a.rows > 0 && (grad_probs == nullptr || grad_logits == nullptr))
    return KernelStatus::InvalidArgument("null grad_probs or grad_logits");
  if (a.rows == 0) return KernelStatus::Ok();
  auto st = static_cast<cudaStream_t>(stream);
  const ApplyParams p = MakeParams(a);
  const dim3 grid(unsigned(RowGrid(a.rows)));
  return DispatchNpl(a.experts, [&](auto npl) {
    constexpr int N = decltype(npl)::value;
    if (a.logits_type == FloatType::kBF16)
      ApplyBackwardKernel<true, N><<<grid, kThreads, 0, st>>>(p, grad_probs, grad_logits);
    else
      ApplyBackwardKernel<false, N><<<grid, kThreads, 0, st>>>(p, grad_probs, grad_logits);
    return CheckLaunch("ApplyBackwardKernel");
  });
}

KernelStatus AgreementFromLogits(const AgreementLogitsArgs& a, AgreementStats* stats,
                                 void* stream) {
  if (auto s = ValidateAgreementLogits(a); !s.ok()) return s;
  AgreeParams p{};
  p.logits = a.logits;
  p.logits_layer_stride = a.logits_layer_stride == -1 ? a.rows * a.experts : a.logits_layer_stride;
  p.rep = a.replay.data;
  p.rep_type = int(a.replay.type);
  p.rep_row_stride = a.replay.row_stride;
  p.rep_layer_stride = a.replay.layer_stride;
  p.mask = a.mask;
  p.rows = a.rows;
  p.e = a.experts;
  p.k = a.k;
  return LaunchAgreement(p, true, a.logits_type == FloatType::kBF16, a.layers, stats,
                         static_cast<cudaStream_t>(stream));
}

KernelStatus AgreementFromIds(const AgreementIdsArgs& a, AgreementStats* stats, void* stream) {
  if (auto s = ValidateAgreementIds(a); !s.ok()) return s;
  AgreeParams p{};
  p.live = a.live.data;
  p.live_type = int(a.live.type);
  p.live_row_stride = a.live.row_stride;
  p.live_layer_stride = a.live.layer_stride;
  p.rep = a.replay.data;
  p.rep_type = int(a.replay.type);
  p.rep_row_stride = a.replay.row_stride;
  p.rep_layer_stride = a.replay.layer_stride;
  p.mask = a.mask;
  p.rows = a.rows;
  p.e = 0;
  p.k = a.k;
  return LaunchAgreement(p, false, false, a.layers, stats, static_cast<cudaStream_t>(stream));
}

}  // namespace rollpack::kernels::cuda
