"""Static replay buffers vs the per-micro-batch path, on the GPU machine
(docs/performance.md, "Static replay buffers (issue 22)").

For one micro-batch already staged on the device (received ids [rows, L, K]
uint8/uint16 + mask, as TrainerClient hands them out), the time from those
bytes to targets a router can read, per micro-batch, and what it allocates:

- per-mb: what the trainer library does per micro-batch today: a new
  [L, rows, K] int64 tensor and the unpack kernel into it (the library
  allocates with cudaMallocAsync from its pool, here torch's allocator);
- per-mb + copy: what a CUDA-graphed router needs today on top of that: the
  targets copied into the graph's static buffer (permuted) and the rows past
  the micro-batch overwritten with precomputed filler;
- static: write_replay_targets into the static buffer (one kernel);
- staged + graph: StaticReplayTargets.stage (outside the graph) and the
  replay of a graph holding StaticReplayTargets.write.

Times: CUDA events around 20 back-to-back calls from Python (so the ctypes
and launch overhead is in), median of 15; "kernel" rows: the kernels alone,
20 calls captured in one CUDA graph. Allocations: torch's allocator counters
over the timed calls, per call.

    python3 client/python/device/static_targets_bench.py --json $OUT/static_bench.json
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from rollpack import _capi  # noqa: E402
from rollpack.static_targets import StaticReplayTargets, write_replay_targets  # noqa: E402

ITERS, REPS = 20, 15


def gpu_time(fn, iters=ITERS, reps=REPS):
    """Median over reps of the mean time of `iters` back-to-back calls (µs)."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1000 / iters)
    return float(np.median(out))


def graph_time(fn, iters=ITERS):
    """µs per call of `fn`, `iters` calls captured in one graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    return gpu_time(g.replay, iters=1) / iters


def allocs(fn, n=ITERS):
    torch.cuda.synchronize()
    s0 = torch.cuda.memory_stats()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    s1 = torch.cuda.memory_stats()
    d = lambda k: (s1.get(k, 0) - s0.get(k, 0)) / n  # noqa: E731
    return d("allocation.all.allocated"), d("allocated_bytes.all.allocated")


def copy_bandwidth():
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    return 2 * x.numel() / gpu_time(lambda: y.copy_(x), iters=5, reps=7) / 1e3


class Mb:
    """A staged micro-batch as TrainerClient hands it out (device tensors)."""

    def __init__(self, rows, layers, k, e, g):
        dt = torch.uint8 if e <= 256 else torch.int16
        # K distinct ids per (row, layer): a random start, then consecutive.
        start = torch.randint(0, e, (rows, layers, 1), generator=g)
        ids = (start + torch.arange(k)) % e
        self.index = 0
        self.replay_experts = ids.to(dt).cuda()
        self.replay_mask = (torch.rand(rows, generator=g) > 0.05).to(torch.uint8).cuda()


def bench_shape(max_rows, rows, layers, k, e, copy_gbs):
    g = torch.Generator().manual_seed(0)
    mb = Mb(rows, layers, k, e, g)
    ex, mask = mb.replay_experts, mb.replay_mask
    in_type = 0 if ex.dtype == torch.uint8 else 1
    buf = torch.empty((max_rows, layers, k), dtype=torch.int64, device="cuda")
    r = torch.arange(rows, max_rows, device="cuda")[:, None]
    fill = ((r * k + torch.arange(k, device="cuda")[None, :]) % e)[:, None, :].expand(
        max_rows - rows, layers, k).contiguous()
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731

    def per_mb():
        ids = torch.empty((layers, rows, k), dtype=torch.int64, device="cuda")
        _capi.unpack(0, ex.data_ptr(), in_type, mask.data_ptr(), rows, layers, k, ids.data_ptr(),
                     3, False, stream())
        return ids

    def per_mb_copy():
        ids = per_mb()
        buf[:rows].copy_(ids.permute(1, 0, 2))
        if rows < max_rows:
            buf[rows:].copy_(fill)

    def static():
        write_replay_targets(mb, buf, num_experts=e)

    st = StaticReplayTargets(buf, num_experts=e)
    st.stage(mb)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        st.write()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        st.write()

    def staged():
        st.stage(mb)
        graph.replay()

    # Same result from every path (checked, not assumed).
    per_mb_copy()
    want = buf.clone()
    buf.fill_(-1)
    static()
    assert torch.equal(buf, want), "static differs from per-mb + copy"
    buf.fill_(-1)
    staged()
    assert torch.equal(buf, want), "staged graph differs from per-mb + copy"

    res = {"max_rows": max_rows, "rows": rows, "layers": layers, "k": k, "e": e,
           "in": str(ex.dtype).replace("torch.", "")}
    for name, fn in (("per_mb", per_mb), ("per_mb_copy", per_mb_copy), ("static", static),
                     ("staged_graph", staged)):
        res[name + "_us"] = gpu_time(fn)
        res[name + "_allocs"], res[name + "_bytes"] = allocs(fn)
    ids = torch.empty((layers, rows, k), dtype=torch.int64, device="cuda")
    res["kernel_unpack_us"] = graph_time(
        lambda: _capi.unpack(0, ex.data_ptr(), in_type, mask.data_ptr(), rows, layers, k,
                             ids.data_ptr(), 3, False, stream()))
    res["kernel_static_us"] = graph_time(st.write)
    out_bytes = max_rows * layers * k * 8
    res["kernel_static_gbs"] = (rows * layers * k * ex.element_size() + rows + out_bytes) / \
        res["kernel_static_us"] / 1e3
    res["kernel_static_pct_copy"] = 100 * res["kernel_static_gbs"] / copy_gbs
    res["kernel_unpack_gbs"] = (rows * layers * k * (ex.element_size() + 8) + rows) / \
        res["kernel_unpack_us"] / 1e3
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.cuda.get_device_name()
    copy_gbs = copy_bandwidth()
    print("GPU: %s, torch %s, copy %.0f GB/s" % (dev, torch.__version__, copy_gbs))
    shapes = [(16384, 16384, 48, 8, 128), (16384, 12000, 48, 8, 128),
              (65536, 65536, 48, 8, 128), (65536, 60000, 58, 8, 256),
              (65536, 65536, 48, 10, 384), (8192, 8192, 94, 8, 128)]
    rows = []
    for s in shapes:
        r = bench_shape(*s, copy_gbs)
        rows.append(r)
        print(json.dumps(r), flush=True)
    print()
    print("| max_rows / rows, L, K, E (in) | per-mb µs | per-mb + copy µs | static µs | "
          "staged + graph µs | allocs/mb per-mb, +copy, static, staged | bytes/mb per-mb | "
          "kernel: unpack / static µs | static % of copy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %d / %d, %d, %d, %d (%s) | %.1f | %.1f | %.1f | %.1f | %g, %g, %g, %g | %.1f MB |"
              " %.1f / %.1f | %.1f |"
              % (r["max_rows"], r["rows"], r["layers"], r["k"], r["e"], r["in"], r["per_mb_us"],
                 r["per_mb_copy_us"], r["static_us"], r["staged_graph_us"], r["per_mb_allocs"],
                 r["per_mb_copy_allocs"], r["static_allocs"], r["staged_graph_allocs"],
                 r["per_mb_bytes"] / 1e6, r["kernel_unpack_us"], r["kernel_static_us"],
                 r["kernel_static_pct_copy"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": dev, "torch": torch.__version__, "copy_gbs": copy_gbs,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
