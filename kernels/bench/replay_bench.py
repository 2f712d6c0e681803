#!/usr/bin/env python3
"""Routing-replay kernels vs torch on the GPU; prints one table.

Loads the CUDA kernels through the ctypes shim (librollpack_kernels_capi.so,
built by kernels/CMakeLists.txt) and measures, with CUDA events (median of
--iters calls after warm-up):
  - device-to-device copy bandwidth (torch copy_, bytes read + written),
  - unpack: bandwidth vs that copy, and speed vs the torch expression
    x.permute(1, 0, 2).to(torch.int64).contiguous() on the same input,
  - apply forward/backward: error vs a float64 torch autograd reference and
    speed vs the unfused torch version (fp32 math, as Megatron),
  - agreement from logits: equality with a torch top-k version and speed,
  - end-to-end micro-batch latency: received replay payload in host memory
    (pinned) -> per-layer [rows, K] int64 tensors ready on the GPU (wall clock,
    synchronised), for our unpack and for the torch expression.
Usage: replay_bench.py LIB.so [--iters N] [--json PATH]
"""
import argparse
import ctypes
import json
import sys
import time
import traceback

import torch

ap = argparse.ArgumentParser()
ap.add_argument("lib")
ap.add_argument("--iters", type=int, default=50)
ap.add_argument("--json", default="")
ap.add_argument("--sections", default="unpack,apply,agreement,e2e")
# UnpackVariant values timed in the unpack section (0 = auto, 1 = tiled,
# 4 = pipelined); the first one is the table's main row.
ap.add_argument("--unpack-variants", default="0")
args = ap.parse_args()

lib = ctypes.CDLL(args.lib)
vp, ci, cf, c64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_int64
lib.rp_last_error.restype = ctypes.c_char_p
lib.rp_unpack.argtypes = [vp, ci, vp, c64, c64, ci, vp, ci, c64, ci, ci, vp]
lib.rp_apply_forward.argtypes = [vp, ci, vp, ci, c64, c64, ci, ci, ci, ci, cf, vp, vp, vp, vp]
lib.rp_apply_backward.argtypes = [vp, ci, vp, ci, c64, c64, ci, ci, ci, ci, cf, vp, vp, vp]
lib.rp_agreement_logits.argtypes = [vp, ci, c64, vp, ci, c64, c64, vp, c64, c64, ci, ci, vp, vp]
for f in (lib.rp_unpack, lib.rp_apply_forward, lib.rp_apply_backward, lib.rp_agreement_logits):
    f.restype = ci

U8, U16, I32, I64 = 0, 1, 2, 3
F32, BF16 = 0, 1
dev = torch.device("cuda")


def P(t):
    return vp(None) if t is None else vp(t.data_ptr())


def S():
    return vp(torch.cuda.current_stream().cuda_stream)


def ck(rc):
    if rc != 0:
        raise RuntimeError("kernel status %d: %s" % (rc, lib.rp_last_error().decode()))


REP = 10  # calls per timed replay
_fallback = []


def timeit(fn, iters=None, graph=True):
    """Median microseconds per fn() call. Captures REP back-to-back calls in a
    CUDA graph and times its replays with events (no launch gaps); falls back
    to timing a Python loop of REP calls if capture fails."""
    iters = iters or args.iters
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    run = None
    if graph:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(REP):
                    fn()
            run = g.replay
        except Exception as e:  # noqa: BLE001
            torch.cuda.synchronize()
            print("graph capture failed (%s); timing a loop" % str(e).splitlines()[0])
            _fallback.append(1)
            run = None
    if run is None:
        def run():
            for _ in range(REP):
                fn()
    run()
    torch.cuda.synchronize()
    st = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    en = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        st[i].record()
        run()
        en[i].record()
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) * 1e3 / REP for a, b in zip(st, en))
    return ts[len(ts) // 2]


rows_out = []  # (item, shape, ours_us, GB/s, %copy, torch_us, speedup, check)
results = {}


def add(item, shape, ours_us, nbytes, torch_us, check):
    if _fallback:
        check += " (loop-timed)"
        _fallback.clear()
    gbs = nbytes / ours_us / 1e3 if nbytes else float("nan")
    pct = 100.0 * gbs / COPY_GBS if nbytes else float("nan")
    sp = torch_us / ours_us if torch_us else float("nan")
    rows_out.append((item, shape, ours_us, gbs, pct, torch_us or float("nan"), sp, check))
    results["%s %s" % (item, shape)] = dict(ours_us=ours_us, gbs=gbs, pct_copy=pct,
                                            torch_us=torch_us, speedup=sp, check=check)


def section(fn):
    try:
        fn()
    except Exception:  # keep the other sections' numbers
        traceback.print_exc()
        rows_out.append((fn.__name__, "ERROR", float("nan"), float("nan"), float("nan"),
                         float("nan"), float("nan"), "ERROR"))


prop = torch.cuda.get_device_properties(0)
print("device: %s, %d SMs, torch %s, CUDA %s" % (prop.name, prop.multi_processor_count,
                                                   torch.__version__, torch.version.cuda))
torch.manual_seed(0)

# ---------------------------------------------------------------- copy
_n = 1 << 28  # 1 GiB of int32
_a = torch.randint(-2**31, 2**31 - 1, (_n,), dtype=torch.int32, device=dev)
_b = torch.empty_like(_a)
# Not graph-captured: a captured 1 GiB memcpy node measured 2768 GB/s vs 4251
# for the same copy_ launched directly (H200, 2026-11-21).
COPY_US = timeit(lambda: _b.copy_(_a), graph=False)
COPY_GBS = 2 * 4 * _n / COPY_US / 1e3
del _a, _b
rows_out.append(("d2d copy (torch copy_)", "1 GiB", COPY_US, COPY_GBS, 100.0, float("nan"),
                 float("nan"), "-"))
results["copy_gbs"] = COPY_GBS


# -------------------------------------------------------------- unpack
def bench_unpack():
    for (R, L, K, E) in [(16384, 48, 8, 128), (65536, 48, 8, 128), (65536, 58, 8, 256),
                         (65536, 48, 10, 512), (8192, 94, 8, 128)]:
        u16 = E > 256
        dt = torch.int16 if u16 else torch.uint8  # int16 bits == uint16 for ids < 32768
        x = torch.randint(0, E, (R, L, K), dtype=torch.int32, device=dev).to(dt)
        mask = (torch.rand(R, device=dev) < 0.9).to(torch.uint8)
        for odt, ocode in ((torch.int64, I64), (torch.int32, I32)):
            t_torch = None
            for variant in [int(v) for v in args.unpack_variants.split(",")]:
                out = torch.full((L, R, K), -7, dtype=odt, device=dev)

                def ours():
                    ck(lib.rp_unpack(P(x), U16 if u16 else U8, P(mask), R, L, K, P(out), ocode, -1,
                                     0, variant, S()))

                ours()
                torch.cuda.synchronize()
                ref = x.permute(1, 0, 2).to(odt).contiguous()
                ok = torch.equal(out, ref)
                t_ours = timeit(ours)
                if t_torch is None:
                    t_torch = timeit(lambda: x.permute(1, 0, 2).to(odt).contiguous())
                nbytes = x.numel() * x.element_size() + R + out.numel() * out.element_size()
                add("unpack" if variant == 0 else "unpack v%d" % variant,
                    "R=%d L=%d K=%d %s->%s" % (R, L, K, "u16" if u16 else "u8",
                                               str(odt).replace("torch.", "")),
                    t_ours, nbytes, t_torch, "exact" if ok else "MISMATCH")
                del out, ref


# --------------------------------------------------------------- apply
def torch_probs(x, idx, sig, renorm, f32):
    if sig:
        s = torch.sigmoid(x.float() if f32 else x)
    else:
        s = torch.softmax(x, dim=-1, dtype=torch.float32) if f32 else torch.softmax(x, dim=-1)
    p = s.gather(1, idx)
    if renorm:
        p = p / (p.sum(dim=-1, keepdim=True) + (1e-20 if sig else 0.0))
    return p


def rel(a, b):
    a, b = a.double(), b.double()
    if torch.isnan(a).any():
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def bench_apply():
    R, K = 65536, 8
    for E in (128, 256, 512):
        for dt, dcode in ((torch.float32, F32), (torch.bfloat16, BF16)):
            x = (torch.randn(R, E, device=dev) * 2).to(dt)
            idx = torch.rand(R, E, device=dev).topk(K, dim=-1).indices  # random distinct ids, int64
            g = torch.randn(R, K, device=dev)
            probs = torch.empty(R, K, device=dev)
            rmap = torch.empty(R, E, dtype=torch.uint8, device=dev)
            gx = torch.empty(R, E, dtype=dt, device=dev)
            for sig, renorm in ((False, True), (True, True), (False, False)):
                sc = 1 if sig else 0

                def fwd():
                    ck(lib.rp_apply_forward(P(x), dcode, P(idx), I64, K, R, E, K, sc, int(renorm),
                                            1.0, P(probs), P(rmap), vp(None), S()))

                def bwd():
                    ck(lib.rp_apply_backward(P(x), dcode, P(idx), I64, K, R, E, K, sc, int(renorm),
                                             1.0, P(g), P(gx), S()))

                fwd()
                bwd()
                torch.cuda.synchronize()
                xd = x.double().requires_grad_(True)
                pd = torch_probs(xd, idx, sig, renorm, False)
                (gd,) = torch.autograd.grad(pd, xd, g.double())
                ref_map = torch.zeros(R, E, dtype=torch.bool, device=dev).scatter_(1, idx, True)
                e_p, e_g = rel(probs, pd.detach()), rel(gx, gd)
                tol = 1e-6 if dt == torch.float32 else 1e-2
                map_ok = torch.equal(rmap.bool(), ref_map)
                ok = e_p < 1e-6 and e_g < tol and map_ok
                del xd, pd, gd

                def tfwd():
                    p = torch_probs(x, idx, sig, renorm, True)
                    m = torch.zeros(R, E, dtype=torch.bool, device=dev).scatter_(1, idx, True)
                    return p, m

                xl = x.detach().requires_grad_(True)
                pl = torch_probs(xl, idx, sig, renorm, True)
                t_f, t_b = timeit(fwd), timeit(bwd)
                t_tf = timeit(tfwd)
                # Autograd runs backward ops on the forward's stream, so no graph
                # capture here: a loop of REP calls (GPU-bound at these sizes).
                t_tb = timeit(lambda: torch.autograd.grad(pl, xl, g, retain_graph=True), graph=False)
                name = "%s%s" % ("sigmoid" if sig else "softmax", "+renorm" if renorm else "")
                shape = "R=%d E=%d K=%d %s %s" % (R, E, K, str(dt).replace("torch.", ""), name)
                fb = x.numel() * x.element_size() + idx.numel() * 8 + probs.numel() * 4 + rmap.numel()
                bb = 2 * x.numel() * x.element_size() + idx.numel() * 8 + g.numel() * 4
                add("apply fwd", shape, t_f, fb, t_tf,
                    "err %.1e map %s%s" % (e_p, "ok" if map_ok else "BAD", "" if ok else " FAIL"))
                add("apply bwd", shape, t_b, bb, t_tb,
                    "err %.1e%s; torch loop-timed" % (e_g, "" if ok else " FAIL"))
                del xl, pl


# ----------------------------------------------------------- agreement
def bench_agreement():
    R, K = 65536, 8
    for E in (128, 256):
        for dt, dcode in ((torch.float32, F32), (torch.bfloat16, BF16)):
            x = torch.randn(R, E, device=dev).to(dt)
            order = torch.sort(x.float(), dim=-1, descending=True, stable=True).indices
            rep = order[:, :K].contiguous()
            # 5% of rows: replace one id by one outside the live set.
            nch = R // 20
            rows = torch.randperm(R, device=dev)[:nch]
            rep[rows, 0] = order[rows, K]
            mask = (torch.rand(R, device=dev) < 0.9).to(torch.uint8)
            stats = torch.empty(3, dtype=torch.int64, device=dev)

            def ours():
                ck(lib.rp_agreement_logits(P(x), dcode, -1, P(rep), I64, K, 0, P(mask), R, 1, E, K,
                                           P(stats), S()))

            def tor():
                lv = x.topk(K, dim=-1).indices
                differ = (lv.sort(-1).values != rep.sort(-1).values).any(-1)
                ov = (rep.unsqueeze(-1) == lv.unsqueeze(-2)).any(-1).sum(-1)
                m = mask.bool()
                return m.sum(), (differ & m).sum(), (ov * m).sum()

            def exact():  # documented tie rule: equal logits -> lower expert id first
                lv = torch.sort(x.float(), dim=-1, descending=True, stable=True).indices[:, :K]
                rs = rep.sort(-1).values
                differ = (lv.sort(-1).values != rs).any(-1)
                first = torch.ones_like(rs, dtype=torch.bool)
                first[:, 1:] = rs[:, 1:] != rs[:, :-1]  # count each distinct replay id once
                ov = ((rs.unsqueeze(-1) == lv.unsqueeze(-2)).any(-1) & first).sum(-1)
                m = mask.bool()
                return m.sum(), (differ & m).sum(), (ov * m).sum()

            ours()
            torch.cuda.synchronize()
            want = [int(v) for v in exact()]
            got = stats.tolist()
            t_o, t_t = timeit(ours), timeit(tor)
            frac = got[1] / max(got[0], 1)
            add("agreement(logits)", "R=%d E=%d K=%d %s" % (R, E, K, str(dt).replace("torch.", "")),
                t_o, x.numel() * x.element_size() + rep.numel() * 8 + R, t_t,
                "%s differ=%.4f" % ("equal" if got == want else "MISMATCH %s vs %s" % (got, want),
                                    frac))


# ----------------------------------------------------------- end to end
def bench_e2e():
    for (R, L, K) in [(16384, 48, 8), (65536, 48, 8)]:
        host = torch.randint(0, 128, (R, L, K), dtype=torch.uint8).pin_memory()
        hmask = torch.ones(R, dtype=torch.uint8).pin_memory()
        d = torch.empty((R, L, K), dtype=torch.uint8, device=dev)
        dm = torch.empty(R, dtype=torch.uint8, device=dev)

        def ours():
            d.copy_(host, non_blocking=True)
            dm.copy_(hmask, non_blocking=True)
            out = torch.empty((L, R, K), dtype=torch.int64, device=dev)
            ck(lib.rp_unpack(P(d), U8, P(dm), R, L, K, P(out), I64, -1, 0, 0, S()))
            layers = out.unbind(0)
            torch.cuda.synchronize()
            return layers

        def tor():
            d.copy_(host, non_blocking=True)
            dm.copy_(hmask, non_blocking=True)
            out = d.permute(1, 0, 2).to(torch.int64).contiguous()
            layers = out.unbind(0)
            torch.cuda.synchronize()
            return layers

        def wall(fn, n=30):
            for _ in range(3):
                fn()
            ts = []
            for _ in range(n):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e6)
            ts.sort()
            return ts[len(ts) // 2]

        layers = ours()
        ok = all(torch.equal(layers[l].cpu(), host[:, l, :].to(torch.int64)) for l in (0, L - 1))
        t_o, t_t = wall(ours), wall(tor)
        add("e2e host->tensors", "R=%d L=%d K=%d u8 pinned" % (R, L, K), t_o, 0, t_t,
            "exact" if ok else "MISMATCH")


for fn in (bench_unpack, bench_apply, bench_agreement, bench_e2e):
    if fn.__name__[len("bench_"):] in args.sections.split(","):
        section(fn)

print()
print("GPU: %s; copy %.0f GB/s (bytes read + written). Times: median us, CUDA events "
      "(e2e: wall clock incl. H2D + sync)." % (prop.name, COPY_GBS))
hdr = ("item", "shape", "ours_us", "GB/s", "%copy", "torch_us", "x_torch", "check")
print("| " + " | ".join(hdr) + " |")
print("|" + "---|" * len(hdr))
for r in rows_out:
    print("| %s | %s | %.1f | %.0f | %.1f | %.1f | %.2f | %s |" % r)
if args.json:
    with open(args.json, "w") as f:
        json.dump(dict(device=prop.name, torch=torch.__version__, results=results), f, indent=1)
bad = [r for r in rows_out if "MISMATCH" in str(r[7]) or "FAIL" in str(r[7]) or "ERROR" in str(r[7])]
print("BENCH %s" % ("FAIL (%d rows)" % len(bad) if bad else "OK"))
sys.exit(1 if bad else 0)
