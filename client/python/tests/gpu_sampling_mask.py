"""GPU test of rollpack.sampling_mask.masked_token_logprobs on CUDA tensors,
for the device tool (exit 77 without CUDA):

- backend "native" (the CUDA kernels through the C ABI of
  client/trainer/masked_logprob_capi.h) equals backend "torch" on the same
  CUDA tensors: logprobs, lse and the gradient through autograd, float32 and
  bfloat16, int32 and int16 (uint16) ids, shifted offsets, unmasked rows,
  dropped targets, vocabularies that do and do not fill 16-byte vectors;
- a row with an out-of-range id comes out NaN from the kernel (no host
  synchronisation, no exception), the other rows unchanged;
- the whole autograd call at T = 8192, V = 151936 timed, native vs torch.

The library is LIB (argument): librollpack_trainer.so, or on a machine
without gRPC a library of client/trainer/masked_logprob_capi.cc alone
(kernels/bench/run_masked_logprob.sh builds one). The module is loaded from
its file, so the rollpack package need not be importable.
    python3 client/python/tests/gpu_sampling_mask.py LIB
"""

import ctypes
import importlib.util
import os
import sys

import torch

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "sampling_mask", os.path.join(_here, "..", "rollpack", "sampling_mask.py"))
sm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sm)

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL", what)


def problem(t, v, shift, gen, dev):
    sizes = torch.randint(1, min(v, 1200) + 1, (t,), generator=gen, device="cpu")
    sizes[torch.rand(t, generator=gen) < 0.15] = 0
    sets = [torch.randperm(v, generator=gen)[:int(n)].sort().values for n in sizes]
    targets = []
    for i, s in enumerate(sets):
        if len(s) and i % 7 == 3 and len(s) < v:  # a target the mask dropped
            kept = torch.zeros(v, dtype=torch.bool)
            kept[s] = True
            targets.append(int((~kept).nonzero()[0, 0]))
        elif len(s):
            targets.append(int(s[int(torch.randint(0, len(s), (1,), generator=gen))]))
        else:
            targets.append(int(torch.randint(0, v, (1,), generator=gen)))
    values = torch.cat([torch.zeros(shift, dtype=torch.int64)] + sets)
    offsets = torch.cat([torch.tensor([shift]), shift + sizes.cumsum(0)])
    return values.to(dev), offsets.to(dev), torch.tensor(targets, device=dev)


def run(logits, values, offsets, targets, backend):
    x = logits.clone().requires_grad_()
    lp, lse = sm.masked_token_logprobs(x, values, offsets, targets, return_lse=True,
                                       backend=backend)
    w = torch.linspace(-1, 1, lp.numel(), device=lp.device)
    finite = torch.isfinite(lp)
    (lp[finite] * w[finite]).sum().add((lse * 0.3).sum()).backward()
    return lp.detach(), lse.detach(), x.grad


def main():
    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 77
    sm._native_lib = sm._bind(ctypes.CDLL(sys.argv[1]))
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(39)
    n = 0
    for dtype in (torch.float32, torch.bfloat16):
        for vtype in (torch.int32, torch.int16):
            for v in (1000, 50001, 32768):
                shift = n % 3
                values, offsets, targets = problem(97, v, shift, gen, dev)
                logits = (torch.randn(97, v, generator=gen) * 4).to(dtype).to(dev)
                a = run(logits, values.to(vtype), offsets, targets, "native")
                b = run(logits, values.to(vtype), offsets, targets, "torch")
                tag = "%s %s V=%d shift=%d" % (dtype, vtype, v, shift)
                check(a[2].dtype == dtype, tag + " grad dtype")
                check(torch.equal(torch.isfinite(a[0]), torch.isfinite(b[0])), tag + " -inf rows")
                f = torch.isfinite(b[0])
                check(torch.allclose(a[0][f], b[0][f], rtol=1e-5, atol=2e-5), tag + " logprob")
                check(torch.allclose(a[1], b[1], rtol=1e-5, atol=2e-5), tag + " lse")
                gt = 1e-5 if dtype == torch.float32 else 2e-2
                check(torch.allclose(a[2].float(), b[2].float(), rtol=gt, atol=gt), tag + " grad")
                n += 1
    # An id out of range: that row NaN, the others as before, nothing raised.
    values, offsets, targets = problem(16, 500, 0, gen, dev)
    logits = torch.randn(16, 500, device=dev)
    good = sm.masked_token_logprobs(logits, values, offsets, targets, backend="native")
    row = int((offsets[1:] > offsets[:-1]).nonzero()[0, 0])
    bad_values = values.clone()
    bad_values[offsets[row]] = 500
    bad = sm.masked_token_logprobs(logits, bad_values, offsets, targets, backend="native")
    check(bool(torch.isnan(bad[row])), "bad row NaN")
    others = torch.arange(16, device=dev) != row
    check(torch.equal(bad[others].nan_to_num(neginf=-1e30), good[others].nan_to_num(neginf=-1e30)),
          "other rows unchanged")
    print("%d cases compared, %d failures" % (n + 1, len(failures)))

    # The autograd call at the benchmark's size, native vs torch.
    t, v = 8192, 151936
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(t, v, device=dev) * 3).to(dtype)
        sizes = torch.randint(20, 1001, (t,), device=dev)
        top = logits.float().topk(1000, dim=1).indices
        keep = torch.arange(1000, device=dev)[None] < sizes[:, None]
        ids = torch.where(keep, top, torch.full_like(top, v)).sort(dim=1).values
        values = ids[keep].to(torch.int32)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64, device=dev), sizes.cumsum(0)])
        targets = ids[:, 0]
        times = {}
        for backend in ("native", "torch"):
            x = logits.detach().requires_grad_()
            for _ in range(2):
                sm.masked_token_logprobs(x, values, offsets, targets, backend=backend).sum().backward()
            torch.cuda.synchronize()
            ts = []
            for _ in range(10):
                x.grad = None
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                sm.masked_token_logprobs(x, values, offsets, targets, backend=backend).sum().backward()
                e.record()
                e.synchronize()
                ts.append(s.elapsed_time(e))
            times[backend] = sorted(ts)[len(ts) // 2]
        print("autograd forward+backward, %s T=%d V=%d set size 20..1000: native %.3f ms, torch "
              "%.3f ms (%.1fx)" % (dtype, t, v, times["native"], times["torch"],
                                   times["torch"] / times["native"]))
        del logits, top, ids
        torch.cuda.empty_cache()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
