#!/usr/bin/env python3
"""Masked log-probabilities on the GPU: the CUDA kernel (kernels/masked_logprob_cuda.h,
through the ctypes shim librollpack_kernels_capi.so) against torch; prints one
table and writes JSON.

Problem: T rows of logits [T, V] (fp32 or bf16, N(0, 3^2)), each row's kept
set the top-|S_t| ids of its own logits (what top-k/top-p keeps), |S_t|
log-uniform in [smin, smax], ascending ids (a mask's nonzero()), int32 CSR
values + int64 offsets, the target drawn from the set; --empty of the rows
have no mask (full vocabulary). Timed with CUDA events (median of --iters
calls after warm-up), forward and backward (dense [T, V] gradient) of:
  kernel   the CUDA kernel (logprob + lse forward; gradient from them)
  torch    the plain torch reference: ids padded to [T, smax], gather +
           masked logsumexp (+ a full-row logsumexp for unmasked rows), autograd
  segment  rollpack.sampling_mask.masked_token_logprobs (torch, CSR, autograd
           Function; its input checks included)
  bitset   the mask as a [T, V] bool tensor: masked_fill + log_softmax + gather
Errors: max abs error of logprob (and lse) against float64 over all rows, of
the gradient against a float64 autograd gradient over the first --grad-rows.
Usage: masked_logprob_bench.py LIB.so [--rows T] [--vocab V] [--json PATH]
"""
import argparse
import ctypes
import importlib.util
import json
import math
import os
import sys

import torch

ap = argparse.ArgumentParser()
ap.add_argument("lib")
ap.add_argument("--rows", type=int, default=8192)
ap.add_argument("--vocab", type=int, default=151936)
ap.add_argument("--smin", type=int, default=20)
ap.add_argument("--smax", type=int, default=1000)
ap.add_argument("--empty", default="0,0.1,1", help="fractions of unmasked rows, one config each")
ap.add_argument("--dtypes", default="float32,bfloat16")
ap.add_argument("--iters", type=int, default=15)
ap.add_argument("--grad-rows", type=int, default=256)
ap.add_argument("--json", default="")
args = ap.parse_args()

lib = ctypes.CDLL(args.lib)
vp, ci, c64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
lib.rp_last_error.restype = ctypes.c_char_p
lib.rp_masked_logprob_forward.argtypes = [vp, ci, c64, c64, vp, ci, c64, vp, ci, vp, ci, vp, vp,
                                          vp]
lib.rp_masked_logprob_backward.argtypes = [vp, ci, c64, c64, vp, ci, c64, vp, ci, vp, ci, vp, vp,
                                           vp, vp, vp]
lib.rp_masked_logprob_forward.restype = ci
lib.rp_masked_logprob_backward.restype = ci
I32, I64 = 2, 3
FLOAT = {torch.float32: 0, torch.bfloat16: 1}

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "sampling_mask", os.path.join(_here, "..", "..", "client", "python", "rollpack",
                                  "sampling_mask.py"))
sampling_mask = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sampling_mask)

dev = torch.device("cuda")


def P(t):
    return vp(None) if t is None else vp(t.data_ptr())


def ck(rc):
    if rc != 0:
        raise RuntimeError("kernel status %d: %s" % (rc, lib.rp_last_error().decode()))


def timeit(fn):
    """Median milliseconds of one fn() call."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(args.iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def make_problem(t, v, dtype, empty_frac, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    logits32 = torch.randn(t, v, device=dev, generator=g) * 3
    smax = min(args.smax, v)
    u = torch.rand(t, device=dev, generator=g)
    sizes = torch.exp(math.log(args.smin) + u * (math.log(smax) - math.log(args.smin))).long()
    sizes = sizes.clamp(1, smax)
    sizes[torch.rand(t, device=dev, generator=g) < empty_frac] = 0
    logits = logits32.to(dtype)
    del logits32
    top = logits.float().topk(smax, dim=1).indices  # by value, descending
    keep = torch.arange(smax, device=dev).unsqueeze(0) < sizes.unsqueeze(1)
    ids_sorted = torch.where(keep, top, torch.full_like(top, v)).sort(dim=1).values
    offsets = torch.zeros(t + 1, dtype=torch.int64, device=dev)
    offsets[1:] = sizes.cumsum(0)
    pick = (torch.rand(t, device=dev, generator=g) * sizes.clamp(min=1)).long()
    targets = torch.where(sizes > 0, ids_sorted.gather(1, pick.unsqueeze(1)).squeeze(1),
                          torch.randint(0, v, (t,), device=dev, generator=g))
    valid = keep  # the first sizes[t] of each sorted row are its kept ids
    values = ids_sorted[valid].to(torch.int32)
    ids_pad = torch.where(valid, ids_sorted, torch.zeros_like(ids_sorted))
    empty_rows = (sizes == 0).nonzero().squeeze(1)
    return logits, values, offsets, targets, ids_pad, valid, empty_rows, sizes


def torch_reference(logits, ids_pad, valid, empty_rows, targets, comp=torch.float32):
    z = logits.gather(1, ids_pad).to(comp).masked_fill(~valid, float("-inf"))
    lse = torch.logsumexp(z, 1)
    if empty_rows.numel():
        lse = lse.index_copy(0, empty_rows, torch.logsumexp(logits[empty_rows].to(comp), 1))
    lp = logits.gather(1, targets.unsqueeze(1)).squeeze(1).to(comp) - lse
    return lp, lse


def bitset_reference(logits, bitset, targets):
    ls = logits.float().masked_fill(~bitset, float("-inf")).log_softmax(-1)
    return ls.gather(1, targets.unsqueeze(1)).squeeze(1)


rows_out, results = [], {}
prop = torch.cuda.get_device_properties(0)
print("device: %s, %d SMs, torch %s, CUDA %s" % (prop.name, prop.multi_processor_count,
                                                 torch.__version__, torch.version.cuda))
T, V = args.rows, args.vocab
for dname in args.dtypes.split(","):
    dtype = getattr(torch, dname)
    for empty_frac in (float(x) for x in args.empty.split(",")):
        cfg = "%s T=%d V=%d set=%d..%d empty=%g" % (dname, T, V, args.smin, args.smax,
                                                   empty_frac)
        logits, values, offsets, targets, ids_pad, valid, empty_rows, sizes = make_problem(
            T, V, dtype, empty_frac, 39)
        mean_s = float(sizes[sizes > 0].float().mean())
        lp = torch.empty(T, device=dev)
        lse = torch.empty(T, device=dev)
        gout = torch.randn(T, device=dev)
        grad = torch.empty_like(logits)
        stream = vp(torch.cuda.current_stream().cuda_stream)

        def k_fwd():
            ck(lib.rp_masked_logprob_forward(P(logits), FLOAT[dtype], T, V, P(values), I32,
                                             values.numel(), P(offsets), I64, P(targets), I64,
                                             P(lp), P(lse), stream))

        def k_bwd():
            ck(lib.rp_masked_logprob_backward(P(logits), FLOAT[dtype], T, V, P(values), I32,
                                              values.numel(), P(offsets), I64, P(targets), I64,
                                              P(lse), P(gout), None, P(grad), stream))

        t_kf, t_kb = timeit(k_fwd), timeit(k_bwd)
        t_fill = timeit(lambda: grad.zero_())  # the write floor of any dense gradient
        k_fwd()
        k_bwd()
        torch.cuda.synchronize()

        # Errors against float64.
        want_lp, want_lse = torch_reference(logits, ids_pad, valid, empty_rows, targets,
                                            torch.float64)
        err_lp = float((lp.double() - want_lp).abs().max())
        err_lse = float((lse.double() - want_lse).abs().max())
        n = min(args.grad_rows, T)
        leaf = logits[:n].detach().double().requires_grad_()
        er = empty_rows[empty_rows < n]
        ref_lp, _ = torch_reference(leaf, ids_pad[:n], valid[:n], er, targets[:n], torch.float64)
        (gref,) = torch.autograd.grad(ref_lp, leaf, gout[:n].double())
        err_g = float((grad[:n].double() - gref).abs().max())
        del leaf, gref, ref_lp

        # torch reference (fp32 math), autograd.
        x = logits.detach().requires_grad_()
        t_tf = timeit(lambda: torch_reference(x, ids_pad, valid, empty_rows, targets))
        out_t, _ = torch_reference(x, ids_pad, valid, empty_rows, targets)
        t_tb = timeit(lambda: torch.autograd.grad(out_t, x, gout, retain_graph=True))
        err_t = float((out_t.detach().double() - want_lp).abs().max())
        del out_t

        # rollpack.sampling_mask (torch, CSR).
        t_sf = timeit(lambda: sampling_mask.masked_token_logprobs(x, values, offsets, targets))
        out_s = sampling_mask.masked_token_logprobs(x, values, offsets, targets)
        t_sb = timeit(lambda: torch.autograd.grad(out_s, x, gout, retain_graph=True))
        err_s = float((out_s.detach().double() - want_lp).abs().max())
        del out_s

        # Bitset: the same sets as a [T, V] bool mask (empty rows: all True).
        bitset = torch.zeros(T, V, dtype=torch.bool, device=dev)
        row = torch.repeat_interleave(torch.arange(T, device=dev), sizes)
        bitset[row, values.long()] = True
        bitset[empty_rows] = True
        t_bf = timeit(lambda: bitset_reference(x, bitset, targets))
        out_b = bitset_reference(x, bitset, targets)
        t_bb = timeit(lambda: torch.autograd.grad(out_b, x, gout, retain_graph=True))
        err_b = float((out_b.detach().double() - want_lp).abs().max())
        del out_b, bitset, x

        esz = logits.element_size()
        bwd_gbs = T * V * esz / (t_kb * 1e-3) / 1e9  # the dense gradient written
        for impl, tf, tb, e in (("kernel", t_kf, t_kb, err_lp), ("torch", t_tf, t_tb, err_t),
                                ("segment", t_sf, t_sb, err_s), ("bitset", t_bf, t_bb, err_b)):
            rows_out.append((cfg, impl, tf, tb, t_tf / tf, t_tb / tb, e))
        results[cfg] = dict(
            mean_set=mean_s, kernel=dict(fwd_ms=t_kf, bwd_ms=t_kb, max_err_logprob=err_lp,
                                         max_err_lse=err_lse, max_err_grad=err_g,
                                         grad_rows=n, bwd_write_gbs=bwd_gbs),
            zero_fill_ms=t_fill,
            torch=dict(fwd_ms=t_tf, bwd_ms=t_tb, max_err_logprob=err_t),
            segment=dict(fwd_ms=t_sf, bwd_ms=t_sb, max_err_logprob=err_s),
            bitset=dict(fwd_ms=t_bf, bwd_ms=t_bb, max_err_logprob=err_b))
        print("%s: mean |S| %.0f; kernel max err logprob %.3g lse %.3g grad %.3g (first %d "
              "rows); backward writes %.0f GB/s; torch zero_() of the [T, V] gradient %.3f ms"
              % (cfg, mean_s, err_lp, err_lse, err_g, n, bwd_gbs, t_fill))
        del logits, grad, ids_pad, valid
        torch.cuda.empty_cache()

print()
print("| config | impl | fwd ms | bwd ms | fwd: torch ms / this | bwd: torch ms / this "
      "| max abs err logprob |")
print("|---|---|---:|---:|---:|---:|---:|")
for cfg, impl, tf, tb, sf, sb, e in rows_out:
    print("| %s | %s | %.3f | %.3f | %.2fx | %.2fx | %.2e |" % (cfg, impl, tf, tb, sf, sb, e))
out = dict(device=prop.name, torch=torch.__version__, cuda=torch.version.cuda,
           args=vars(args), results=results)
print()
print("JSON " + json.dumps(out))
if args.json:
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
sys.exit(0)
