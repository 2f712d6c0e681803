#!/usr/bin/env python3
"""TP-leader mode, 2 GPUs: per-step latency with and without NCCL
communicator reuse across steps (DeviceStreamOptions::reuse_tp_communicator),
against each TP rank fetching its own stream.

Starts rollpackd ($ROLLPACKD), creates --steps steps of a tp=2 layout (each
from its own pool), then two processes, one per GPU, open every step in
TP-leader mode and read it to the end: first with ROLLPACK_TP_COMM_REUSE=0
(a new communicator every step, as before), then with reuse, then without
TP-leader mode (each rank fetches the same steps itself). Per step and
rank: `open` = TrainerClient() construction (stream start, rendezvous,
communicator), `step` = open to the last micro-batch synchronised. One
warm-up step (CUDA context, NCCL load) runs before either mode.

    python3 client/python/bench/tp_leader_bench.py [--steps 8] [--json PATH]
"""

import argparse
import json
import os
import statistics
import sys
import time
import uuid

import numpy as np
import torch
import torch.multiprocessing as mp

os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast on the shared machine

import rollpack  # noqa: E402
from rollpack._proto import scheduler_pb2, scheduler_pb2_grpc  # noqa: E402
from tests.rollpackd import Rollpackd  # noqa: E402
from tests.test_trainer import make_samples  # noqa: E402

TOPO = dict(dp=1, cp=1, tp=2, pp=1)


def setup(address, n):
    import grpc
    ch = grpc.insecure_channel(address)
    sched = scheduler_pb2_grpc.SchedulerStub(ch)
    spec = rollpack.ModelSpec("m", num_layers=6, moe_layers=[1, 2, 4, 5], num_experts=64, topk=6)
    for i in range(n):
        pool = "p%d" % i
        with rollpack.Producer(address, pool) as p:
            p.register_model(spec)
            p.put(make_samples(np.random.default_rng(i), 24, 6, [1, 2, 4, 5], 64, 6, max_len=900))
        sched.CreateStep(scheduler_pb2.CreateStepRequest(
            step_id="s%d" % i, pool=pool, num_samples=24,
            topology=scheduler_pb2.Topology(max_tokens_per_rank=1024, **TOPO)), timeout=60)
    ch.close()


def worker(tp, address, n, tag, queue):
    try:
        torch.cuda.set_device(tp)
        from rollpack.trainer import TrainerClient
        dev = "cuda:%d" % tp
        out = {}

        def run(step, mode_tag, tp_leader=True):
            t0 = time.perf_counter()
            if tp_leader:
                tc = TrainerClient(address, step, (0, 0, tp, 0), dev, tp_leader=True, tp_size=2,
                                   rendezvous_tag=mode_tag, rendezvous_timeout_s=60)
            else:
                tc = TrainerClient(address, step, (0, 0, tp, 0), dev)
            t1 = time.perf_counter()
            mbs = list(tc)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            return (t1 - t0) * 1e3, (t2 - t0) * 1e3, len(mbs)

        os.environ["ROLLPACK_TP_COMM_REUSE"] = "0"
        run("s0", tag + "/warm")
        for mode, env in (("new", "0"), ("reuse", "1")):
            os.environ["ROLLPACK_TP_COMM_REUSE"] = env
            out[mode] = [run("s%d" % i, "%s/%s" % (tag, mode)) for i in range(1, n)]
        out["self"] = [run("s%d" % i, "", tp_leader=False) for i in range(1, n)]
        queue.put((tp, "ok", out))
    except BaseException as e:  # report, never hang the parent
        import traceback
        queue.put((tp, "fail", "%s\n%s" % (e, traceback.format_exc())))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=9, help="steps created (one is the warm-up)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if torch.cuda.device_count() < 2:
        print("SKIP: needs 2 GPUs")
        return 0
    with Rollpackd() as d:
        setup(d.address, args.steps)
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        tag = uuid.uuid4().hex
        procs = [ctx.Process(target=worker, args=(t, d.address, args.steps, tag, q)) for t in range(2)]
        for p in procs:
            p.start()
        results = dict((r[0], r) for r in (q.get(timeout=300) for _ in procs))
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    bad = [r for r in results.values() if r[1] != "ok"]
    if bad:
        for r in bad:
            print("tp %d failed: %s" % (r[0], r[2]))
        return 1
    print("GPU: %s x2; %d timed steps per mode, tp=2, %s micro-batches per step"
          % (torch.cuda.get_device_name(0), args.steps - 1,
             sorted(set(x[2] for x in results[0][2]["new"]))))
    print("| mode | tp rank | open ms, first step | open ms, median of the rest | step ms, first | step ms, median of the rest |")
    print("|---|---|---|---|---|---|")
    summary = {}
    names = {"new": "TP leader, new communicator every step", "reuse": "TP leader, reuse",
             "self": "each rank fetches itself"}
    for mode in ("new", "reuse", "self"):
        for tp in (0, 1):
            xs = results[tp][2][mode]
            opens, steps = [x[0] for x in xs], [x[1] for x in xs]
            row = dict(open_first=opens[0], open_median=statistics.median(opens[1:]),
                       step_first=steps[0], step_median=statistics.median(steps[1:]),
                       opens=opens, steps=steps)
            summary["%s tp%d" % (mode, tp)] = row
            print("| %s | %d | %.1f | %.1f | %.1f | %.1f |" % (
                names[mode], tp, row["open_first"],
                row["open_median"], row["step_first"], row["step_median"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
