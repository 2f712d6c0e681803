// CUDA unpack: kPipelined, what the trainer runs on every micro-batch, and
// kDirect, its fallback for rows too large for any tile (unpack_cuda.h). The
// benchmark's other variants are in bench/unpack_variants.cu.
#include "kernels/unpack_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "kernels/device_helpers.cuh"

namespace rollpack::kernels::cuda {
namespace {

using internal::CheckCall;
using internal::CheckLaunch;
using internal::DispatchUnpackTypes;
using internal::GridFor;
using internal::kThreads;
using internal::MaxDynamicSmem;
using internal::NumSms;
using internal::SmemPerSm;

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
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(d), "l"(src), "n"(CP)
                 : "memory");
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
__device__ __forceinline__ void IssueTile(const unsigned char* __restrict__ src, int nr,
                                          int row_bytes, int pitch_bytes, unsigned char* dst) {
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
  using W = std::conditional_t<B == 2, uint16_t,
                               std::conditional_t<B == 4, uint32_t, unsigned long long>>;
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
  static std::map<std::pair<const void*, int>, int64_t> limit;      // (kernel, device)
  static std::map<std::pair<const void*, int64_t>, int> occupancy;  // (kernel, smem * 256 + device)
  std::lock_guard<std::mutex> lock(mu);
  int dev = 0;
  if (auto s = CheckCall(cudaGetDevice(&dev), "cudaGetDevice"); !s.ok()) return s;
  int64_t& lim = limit[{kern, dev}];
  if (smem > 48 * 1024 && smem > lim) {
    if (auto s = CheckCall(
            cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
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
  if (auto s = CheckCall(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(resident, kern, kThreads, size_t(smem)),
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
  const int cp = row_bytes % 16 == 0 && ia % 16 == 0 ? 16
                 : row_bytes % 4 == 0 && ia % 4 == 0 ? 4
                                                     : 0;
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
    return KernelStatus::InvalidArgument(
        "pipelined unpack: layers * K too large for shared memory");
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
    if (auto s = PrepareKernel(reinterpret_cast<const void*>(kern), smem, &resident); !s.ok())
      return s;
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
KernelStatus LaunchDirect(const UnpackArgs& a, cudaStream_t st) {
  const int64_t ls = a.out_layer_stride == -1 ? a.rows * a.k : a.out_layer_stride;
  const bool fill = a.masked_fill_minus_one && a.mask != nullptr;
  TOut* out = static_cast<TOut*>(a.out);
  const bool out_aligned = (reinterpret_cast<uintptr_t>(out) & 15) == 0 &&
                           (ls * int64_t(sizeof(TOut))) % 16 == 0;
  constexpr int64_t V = 16 / sizeof(TOut);
  const int64_t chunks = a.layers * ((a.rows * a.k + V - 1) / V);
  const int64_t grid = std::min<int64_t>(GridFor(chunks, kThreads), int64_t(NumSms()) * 16);
  UnpackDirectKernel<TIn, TOut><<<dim3(unsigned(grid)), kThreads, 0, st>>>(
      static_cast<const TIn*>(a.experts), a.mask, a.rows, int(a.layers), a.k, out, ls, fill,
      out_aligned);
  return CheckLaunch("UnpackDirectKernel");
}

}  // namespace

namespace internal {

KernelStatus CheckUnpack(const UnpackArgs& a, bool* launch) {
  *launch = false;
  if (auto s = ValidateUnpack(a); !s.ok()) return s;
  if (a.rows == 0 || a.layers == 0) return KernelStatus::Ok();
  if (a.layers > (1LL << 24)) return KernelStatus::InvalidArgument("layers too large");
  *launch = true;
  return KernelStatus::Ok();
}

KernelStatus UnpackDirect(const UnpackArgs& a, void* stream) {
  bool launch = false;
  if (auto s = CheckUnpack(a, &launch); !launch) return s;
  return DispatchUnpackTypes(a.in_type, a.out_type, [&](auto in, auto out) {
    return LaunchDirect<decltype(in), decltype(out)>(a, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace internal

KernelStatus Unpack(const UnpackArgs& a, void* stream) {
  bool launch = false;
  if (auto s = internal::CheckUnpack(a, &launch); !launch) return s;
  auto st = static_cast<cudaStream_t>(stream);
  return DispatchUnpackTypes(a.in_type, a.out_type, [&](auto in, auto out) {
    using TIn = decltype(in);
    using TOut = decltype(out);
    bool fits = true;
    KernelStatus s = LaunchPipelined<TIn, TOut>(a, UnpackConfig{}, st, &fits);
    return fits ? s : LaunchDirect<TIn, TOut>(a, st);
  });
}

KernelStatus UnpackPipelined(const UnpackArgs& a, const UnpackConfig& c, void* stream) {
  bool launch = false;
  if (auto s = internal::CheckUnpack(a, &launch); !launch) return s;
  return DispatchUnpackTypes(a.in_type, a.out_type, [&](auto in, auto out) {
    bool fits = true;
    return LaunchPipelined<decltype(in), decltype(out)>(a, c, static_cast<cudaStream_t>(stream),
                                                        &fits);
  });
}

}  // namespace rollpack::kernels::cuda
