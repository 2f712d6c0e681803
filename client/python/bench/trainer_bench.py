"""Trainer-side benchmark for the GPU machine (docs/trainer.md, "Measured").

Prints one markdown table (and --json): the unpack kernel's bandwidth vs the
measured device copy bandwidth, kernels vs the torch expressions (through the
Python binding, so the numbers include its call overhead), and end-to-end
micro-batch latency from a real rollpackd on 127.0.0.1: fetch -> tensors
ready on the GPU (rollpack.TrainerClient: gRPC in C++, pinned staging, async
H2D, unpack kernel) vs the same through the Python gRPC stub + numpy + torch.

    python3 client/python/bench/trainer_bench.py --rollpackd build/bin/rollpackd
"""

import argparse
import json
import os
import signal
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rollpack  # noqa: E402
from rollpack import ndarray as nd  # noqa: E402
from rollpack._proto import (scheduler_pb2, scheduler_pb2_grpc, trainer_pb2,  # noqa: E402
                             trainer_pb2_grpc)
from rollpack import _capi  # noqa: E402
from rollpack.trainer import TrainerClient  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import start_etcd, start_rollpackd  # noqa: E402


def gpu_time(fn, iters=20, reps=15):
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


def copy_bandwidth():
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    us = gpu_time(lambda: y.copy_(x), iters=5, reps=7)
    d2d = 2 * x.numel() / us / 1e3
    h = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
    d = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    us_h = gpu_time(lambda: d.copy_(h, non_blocking=True), iters=3, reps=7)
    return d2d, h.numel() / us_h / 1e3


def bench_unpack(rows, layers, k, copy_gbs):
    ex = torch.randint(0, 128, (rows, layers, k), dtype=torch.uint8, device="cuda")
    mask = torch.ones(rows, dtype=torch.uint8, device="cuda")
    out = torch.empty(layers, rows, k, dtype=torch.int64, device="cuda")
    s = torch.cuda.current_stream().cuda_stream

    def ours():
        _capi.unpack(0, ex.data_ptr(), 0, mask.data_ptr(), rows, layers, k, out.data_ptr(), 3,
                     False, s)

    ours()
    assert torch.equal(out, ex.permute(1, 0, 2).to(torch.int64))
    t_ours = gpu_time(ours)
    t_torch = gpu_time(lambda: ex.permute(1, 0, 2).to(torch.int64).contiguous())
    nbytes = ex.numel() * (1 + 8) + rows
    gbs = nbytes / t_ours / 1e3
    return {"what": "unpack R=%d L=%d K=%d u8->i64" % (rows, layers, k), "ours_us": t_ours,
            "torch_us": t_torch, "speedup": t_torch / t_ours, "GB/s": gbs,
            "pct_copy": 100 * gbs / copy_gbs}


def bench_apply(rows, e, k):
    x = torch.randn(rows, e, device="cuda")
    ids = torch.argsort(torch.rand(rows, e, device="cuda"), 1)[:, :k].contiguous()

    def torch_fwd():
        p = torch.softmax(x, -1).gather(1, ids)
        p = p / p.sum(-1, keepdim=True)
        m = torch.zeros(rows, e, dtype=torch.bool, device="cuda").scatter_(1, ids, True)
        return p, m

    p, m = rollpack.apply_replay(x, ids)
    pt, mt = torch_fwd()
    err = float((p - pt).abs().max())
    assert torch.equal(m, mt) and err < 1e-5, err
    t_ours = gpu_time(lambda: rollpack.apply_replay(x, ids))
    t_torch = gpu_time(torch_fwd)
    return {"what": "apply fwd R=%d E=%d K=%d fp32" % (rows, e, k), "ours_us": t_ours,
            "torch_us": t_torch, "speedup": t_torch / t_ours, "max_err": err}


def bench_agreement(rows, layers, e, k):
    x = torch.randn(layers, rows, e, device="cuda")
    rep = x.topk(k, -1).indices
    rep[:, ::7, 0] = (rep[:, ::7, 0] + 1) % e  # some rows differ (or repeat an id)

    def torch_agree():
        live = x.topk(k, -1).indices.sort(-1).values
        return (live != rep.sort(-1).values).any(-1).sum(-1)

    a = rollpack.routing_agreement(x, rep)
    t_ours = gpu_time(lambda: rollpack.routing_agreement(x, rep), iters=5)
    t_torch = gpu_time(torch_agree, iters=5)
    return {"what": "agreement L=%d R=%d E=%d K=%d" % (layers, rows, e, k), "ours_us": t_ours,
            "torch_us": t_torch, "speedup": t_torch / t_ours,
            "fraction_differ": a.fraction_differ}


def run_client(make, replay_shape, compute_ms):
    """One rank's stream on the GPU: ms per micro-batch over the whole stream
    (client creation and the first fetch included) and in steady state
    (from the first micro-batch on: what prefetch can hide), the first
    micro-batch's latency, and next()'s median wait."""
    waits = []
    t0 = time.perf_counter()
    c = make()
    first = None
    stop_ms = 0.0
    while True:
        a = time.perf_counter()
        try:
            mb = next(c)
        except StopIteration:
            stop_ms = (time.perf_counter() - a) * 1e3
            break
        torch.cuda.current_stream().synchronize()  # tensors ready
        waits.append(time.perf_counter() - a)
        if first is None:
            first = time.perf_counter()
        assert mb.replay_indices.shape == replay_shape, mb.replay_indices.shape
        if compute_ms:
            time.sleep(compute_ms / 1000)  # the training step, off the copy path
    end = time.perf_counter()
    n = len(waits)
    return {"ms_per_mb": (end - t0) / n * 1e3,
            "steady_ms_per_mb": (end - first) / n * 1e3,
            "first_ms": (first - t0) * 1e3,
            "next_wait_ms": float(np.median(waits)) * 1e3, "microbatches": n,
            # Where steady state loses time to delivery: every wait after
            # the first, and the call that finds the end.
            "wait_after_first_ms": [w * 1e3 for w in waits[1:]], "end_wait_ms": stop_ms}


def compute_alone(compute_ms, n):
    """ms per micro-batch of the stand-in compute with nothing else running:
    what delivery hidden behind it would give."""
    t0 = time.perf_counter()
    for _ in range(n):
        time.sleep(compute_ms / 1000)
    return (time.perf_counter() - t0) / n * 1e3


def bench_members(rollpackd, etcd, tokens_per_mb, num_mb, layers, e, k, compute_ms):
    """One rank pulling from 1, 2 and 4 cluster members (docs/cluster.md):
    the samples spread round-robin, the rank dialing member 0; direct pulls
    (pieces from every owner in parallel) against proxy (member 0 pulls the
    others' samples and serves them)."""
    samples = make_samples(1, tokens_per_mb * num_mb, layers, e, k)
    spec = rollpack.ModelSpec("m", num_layers=layers, num_experts=e, topk=k)
    rows = []
    for members in (1, 2, 4):
        etcd_proc, etcd_url = start_etcd(etcd)
        procs = []
        try:
            addresses = []
            for m in range(members):
                proc, address = start_rollpackd(
                    rollpackd, ["--cluster-etcd", etcd_url, "--cluster-lease-seconds", "5"])
                procs.append(proc)
                addresses.append(address)
            pool = "m%d" % members
            for m, address in enumerate(addresses):
                with rollpack.Producer(address, pool) as p:
                    if m == 0:
                        p.register_model(spec)
                    p.put(samples[m::members])
            import grpc
            ch = grpc.insecure_channel(addresses[0])
            sched = scheduler_pb2_grpc.SchedulerStub(ch)
            n = sched.CreateStep(scheduler_pb2.CreateStepRequest(
                step_id=pool, pool=pool, num_samples=len(samples),
                topology=scheduler_pb2.Topology(dp=1, cp=1, tp=1, pp=1,
                                                max_tokens_per_rank=tokens_per_mb)),
                timeout=120).num_microbatches
            shape = (layers, tokens_per_mb, k)
            runs = []
            for delivery in ("direct", "proxy") * 2:  # alternated; the first pass warms up
                for compute in (0, compute_ms):
                    r = run_client(lambda: TrainerClient(addresses[0], pool, (0, 0, 0, 0), "cuda",
                                                         prefetch=3, delivery=delivery),
                                   shape, compute)
                    r["what"] = "%d member(s), %s, prefetch 3, %s" % (
                        members, delivery,
                        "back-to-back" if not compute else "%g ms compute per mb" % compute)
                    r["members"] = members
                    r["delivery"] = delivery
                    r["microbatches"] = n
                    runs.append(r)
            rows += runs[len(runs) // 2:]  # the second pass
            sched.ReleaseStep(scheduler_pb2.ReleaseStepRequest(step_id=pool), timeout=60)
            ch.close()
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=30)
            etcd_proc.send_signal(signal.SIGTERM)
            etcd_proc.wait(timeout=30)
    return rows


def make_samples(seed, tokens, layers, e, k, seq=4096):
    """Rollouts of `seq` tokens, `tokens` in all, with distinct top-k ids."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(tokens // seq):
        toks = rng.integers(1, 100000, size=seq).astype(np.int32)
        base = rng.integers(0, e, size=(seq, layers, 1))
        ids = ((base + np.arange(k)) % e).astype(np.uint8)
        samples.append(rollpack.Sample("s%d" % i, toks, ids))
    return samples


def bench_e2e(address, tokens_per_mb, num_mb, layers, e, k, compute_ms):
    pool = "e2e%d" % tokens_per_mb
    samples = make_samples(0, tokens_per_mb * num_mb, layers, e, k)
    spec = rollpack.ModelSpec("m", num_layers=layers, num_experts=e, topk=k)
    with rollpack.Producer(address, pool) as p:
        p.register_model(spec)
        p.put(samples)
    import grpc
    ch = grpc.insecure_channel(address, [("grpc.max_receive_message_length", -1)])
    sched = scheduler_pb2_grpc.SchedulerStub(ch)
    info = sched.CreateStep(scheduler_pb2.CreateStepRequest(
        step_id=pool, pool=pool, num_samples=len(samples),
        topology=scheduler_pb2.Topology(dp=1, cp=1, tp=1, pp=1,
                                        max_tokens_per_rank=tokens_per_mb)), timeout=120)
    n = info.num_microbatches
    mb_bytes = tokens_per_mb * layers * k
    rows = []

    def run_ours(prefetch, compute):
        return run_client(lambda: TrainerClient(address, pool, (0, 0, 0, 0), "cuda",
                                                prefetch=prefetch),
                          (layers, tokens_per_mb, k), compute)

    def run_python():
        stub = trainer_pb2_grpc.TrainerStub(ch)
        t0 = time.perf_counter()
        waits = []
        it = iter(stub.FetchMicrobatches(trainer_pb2.FetchRequest(step_id=pool), timeout=300))
        while True:
            a = time.perf_counter()
            try:
                m = next(it)
            except StopIteration:
                break
            ex = np.frombuffer(m.replay_experts.data, np.uint8).reshape(tuple(m.replay_experts.shape))
            tok = torch.from_numpy(np.frombuffer(m.tokens.data, np.int32).copy()).pin_memory().cuda(non_blocking=True)
            ids = torch.from_numpy(ex.copy()).pin_memory().cuda(non_blocking=True).permute(1, 0, 2).to(torch.int64).contiguous()
            torch.cuda.current_stream().synchronize()
            waits.append(time.perf_counter() - a)
            del tok, ids
        return (time.perf_counter() - t0) / len(waits) * 1e3, float(np.median(waits)) * 1e3

    run_ours(2, 0)  # warm-up (pinned buffers, pool)
    r = run_ours(1, 0)
    r["what"] = "e2e %d tok/mb (%.1f MB replay), prefetch 1, back-to-back" % (tokens_per_mb, mb_bytes / 1e6)
    rows.append(r)
    r = run_ours(3, 0)
    r["what"] = "e2e %d tok/mb, prefetch 3, back-to-back" % tokens_per_mb
    rows.append(r)
    alone = compute_alone(compute_ms, n)
    r = run_ours(3, compute_ms)
    r["what"] = "e2e %d tok/mb, prefetch 3, %g ms compute per mb" % (tokens_per_mb, compute_ms)
    r["compute_alone_ms"] = alone
    r["overhead_pct"] = 100 * (r["steady_ms_per_mb"] / alone - 1)
    rows.append(r)
    per, wait = run_python()
    rows.append({"what": "e2e %d tok/mb, Python grpc+numpy+torch baseline" % tokens_per_mb,
                 "ms_per_mb": per, "next_wait_ms": wait, "steady_ms_per_mb": per,
                 "first_ms": 0.0})
    sched.ReleaseStep(scheduler_pb2.ReleaseStepRequest(step_id=pool), timeout=60)
    ch.close()
    for r in rows:
        r["microbatches"] = n
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollpackd", default=os.environ.get("ROLLPACKD", "build/bin/rollpackd"))
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--etcd", default=os.environ.get("ROLLPACK_ETCD", "/usr/bin/etcd"),
                    help="etcd binary for the cluster rows (skipped when missing)")
    ap.add_argument("--only", choices=["all", "e2e", "members"], default="all")
    args = ap.parse_args()
    dev = torch.cuda.get_device_name(0)
    d2d, h2d = copy_bandwidth()
    rows = []
    e2e = []
    members = []
    if args.only == "all":
        for r, l in ((16384, 48), (65536, 48)):
            rows.append(bench_unpack(r, l, 8, d2d))
        rows.append(bench_apply(65536, 128, 8))
        rows.append(bench_apply(65536, 256, 8))
        rows.append(bench_agreement(16384, 8, 128, 8))
    if args.only in ("all", "e2e"):
        proc, address = start_rollpackd(args.rollpackd)
        try:
            e2e = bench_e2e(address, 16384, 4 if args.quick else 12, 48, 128, 8, 20)
            e2e += bench_e2e(address, 65536, 3 if args.quick else 12, 48, 128, 8, 40)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    if args.only in ("all", "members") and os.path.exists(args.etcd):
        members = bench_members(args.rollpackd, args.etcd, 65536, 3 if args.quick else 8, 48,
                                128, 8, 40)
    print("GPU: %s, torch %s, binding ctypes" % (dev, torch.__version__))
    print("copy: device-to-device %.0f GB/s (read + write), pinned host-to-device %.1f GB/s"
          % (d2d, h2d))
    print()
    print("| measurement | ours | torch / baseline | ratio | note |")
    print("|---|---|---|---|---|")
    for r in rows:
        note = ("%.0f GB/s = %.1f %% of copy" % (r["GB/s"], r["pct_copy"]) if "GB/s" in r else
                "max err %.1e" % r["max_err"] if "max_err" in r else
                "differ %.4f" % r["fraction_differ"])
        print("| %s | %.1f µs | %.1f µs | %.2fx | %s |" % (r["what"], r["ours_us"], r["torch_us"],
                                                         r["speedup"], note))
    base = {}
    for r in e2e:
        if "baseline" in r["what"]:
            base[r["what"].split(" tok")[0]] = r["ms_per_mb"]
    for r in e2e:
        key = r["what"].split(" tok")[0]
        ratio = base[key] / r["ms_per_mb"] if "baseline" not in r["what"] else 1.0
        note = "next() waits %.2f ms (median), %d mbs; steady %.2f ms/mb, first %.1f ms" % (
            r["next_wait_ms"], r["microbatches"], r["steady_ms_per_mb"], r["first_ms"])
        if "compute_alone_ms" in r:
            note += "; compute alone %.2f ms/mb: steady +%.1f %%" % (r["compute_alone_ms"],
                                                                    r["overhead_pct"])
        if r.get("wait_after_first_ms"):
            w = r["wait_after_first_ms"]
            note += "; waits after the first: mean %.2f max %.2f ms, end %.2f ms" % (
                float(np.mean(w)), max(w), r["end_wait_ms"])
        print("| %s | %.2f ms/mb | %s | %.2fx | %s |" % (
            r["what"], r["ms_per_mb"], "%.2f ms/mb" % base[key], ratio, note))
    if members:
        print()
        print("| one rank, 65536 tok/mb | ms/mb (whole stream) | steady ms/mb | first mb ms | "
              "next() wait ms |")
        print("|---|---|---|---|---|")
        for r in members:
            print("| %s | %.2f | %.2f | %.1f | %.2f |" % (r["what"], r["ms_per_mb"],
                                                         r["steady_ms_per_mb"], r["first_ms"],
                                                         r["next_wait_ms"]))
    out = {"gpu": dev, "torch": torch.__version__, "binding": "ctypes", "d2d_GBs": d2d,
           "h2d_GBs": h2d, "kernels": rows, "e2e": e2e, "members": members}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
