#!/usr/bin/python3
"""R2 benchmark (docs/recompute.md): what recorded routing costs to put back.

`--samples` samples of `--tokens` tokens of a Qwen3-30B-A3B-shaped model (48
MoE layers, top-8 of 128 experts, uint8 ids) are held by one rollpackd, or
spread round-robin over the members of a cluster (`--members 1,3`: each
count is one row, measured one after the other in the same run). A step
over them on dp=2 pp=2 (16,384 tokens per rank) is fetched by every rank,
and each rank uploads its micro-batch's replay_experts as its recorded
routing (RoutingUploader: narrowing, protobuf, gRPC, the server's inverse
layout and checks; in a cluster also the split by owner and the owners'
stages), one upload at a time, through the member it fetched from; then the
step is committed (in a cluster: both phases over every owner).
Prints the time per upload (median and max), per (row, layer) entry, and
of the commit, as a Markdown table, then one JSON line.

Run (from the repository root, after `make build`):
    PYTHONPATH=client/python /usr/bin/python3 client/python/bench/recompute_bench.py
"""

import argparse
import json
import os
import signal
import sys
import time

import grpc
import numpy as np

import rollpack
from rollpack._proto import trainer_pb2, trainer_pb2_grpc
from rollpack.recompute import RoutingUploader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import start_etcd, start_rollpackd  # noqa: E402

_REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", ".."))
N, E, K = 48, 128, 8


def put_samples(addresses, num_samples, tokens):
    rng = np.random.default_rng(0)
    samples = []
    for i in range(num_samples):
        base = rng.integers(0, E, size=(tokens - 1, N, 1), dtype=np.int32)
        ex = ((base + np.arange(K, dtype=np.int32)) % E).astype(np.uint8)
        samples.append(rollpack.Sample("s%d" % i, np.ones(tokens, np.int32), ex))
    for m, address in enumerate(addresses):
        with rollpack.Producer(address, "p") as p:
            if m == 0:
                p.register_model(rollpack.ModelSpec("q", num_layers=N, num_experts=E, topk=K))
            mine = samples[m::len(addresses)]
            for i in range(0, len(mine), 8):
                p.put(mine[i:i + 8])


def run(addresses, num_samples, tokens):
    """Times every upload and the commit; rank (dp, pp) goes through member
    (2 dp + pp) mod members."""
    put_samples(addresses, num_samples, tokens)
    with rollpack.Controller(addresses[0]) as c:
        c.create_step("a", "p", num_samples=num_samples,
                      topology=dict(dp=2, pp=2, max_tokens_per_rank=16384))
        times, shape = [], None
        for dp in range(2):
            for pp in range(2):
                address = addresses[(2 * dp + pp) % len(addresses)]
                channel = grpc.insecure_channel(address, [("grpc.max_receive_message_length", -1)])
                stub = trainer_pb2_grpc.TrainerStub(channel)
                rank = trainer_pb2.RankCoords(dp=dp, pp=pp)
                with RoutingUploader(address, "a", (dp, 0, 0, pp)) as up:
                    for mb in stub.FetchMicrobatches(
                            trainer_pb2.FetchRequest(step_id="a", rank=rank)):
                        a = mb.replay_experts
                        ex = np.frombuffer(a.data, np.uint8).reshape(tuple(a.shape))
                        start = time.perf_counter()
                        up.upload(mb.index, ex)
                        times.append(time.perf_counter() - start)
                        shape = ex.shape
                channel.close()
        start = time.perf_counter()
        done = c.commit_routing("a")
        commit_s = time.perf_counter() - start
    times.sort()
    median = times[len(times) // 2]
    return {"members": len(addresses), "uploads": len(times), "upload_shape": list(shape),
            "upload_bytes": int(np.prod(shape)), "upload_ms_median": 1e3 * median,
            "upload_ms_max": 1e3 * times[-1],
            "ns_per_row_layer": 1e9 * median / (shape[0] * shape[1]),
            "commit_ms": 1e3 * commit_s, "commit_tokens": done.tokens,
            "commit_bytes": done.stored_bytes}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--members", default="1,3",
                    help="comma-separated member counts; 1: a single rollpackd (no cluster)")
    ap.add_argument("--rollpackd", default=os.path.join(_REPO, "build", "bin", "rollpackd"))
    ap.add_argument("--etcd", default=os.environ.get("ROLLPACK_ETCD", "/usr/bin/etcd"))
    args = ap.parse_args()
    rows = []
    for members in [int(m) for m in args.members.split(",")]:
        procs, etcd = [], None
        try:
            extra = ["--max-memory", str(16 << 30)]
            if members > 1:
                etcd, etcd_url = start_etcd(args.etcd)
                extra += ["--cluster-etcd", etcd_url, "--cluster-lease-seconds", "5"]
            addresses = []
            for _ in range(members):
                proc, address = start_rollpackd(args.rollpackd, extra)
                procs.append(proc)
                addresses.append(address)
            rows.append(run(addresses, args.samples, args.tokens))
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=30)
            if etcd is not None:
                etcd.send_signal(signal.SIGTERM)
                etcd.wait(timeout=30)
    print("| members | uploads | upload shape | bytes | median ms | max ms | ns per (row, layer) "
          "| commit ms (tokens) |")
    print("|---|---|---|---|---|---|---|---|")
    for out in rows:
        print("| %d | %d | %s | %d | %.1f | %.1f | %.1f | %.1f (%d) |"
              % (out["members"], out["uploads"], "x".join(map(str, out["upload_shape"])),
                 out["upload_bytes"], out["upload_ms_median"], out["upload_ms_max"],
                 out["ns_per_row_layer"], out["commit_ms"], out["commit_tokens"]))
    print(json.dumps({"runs": rows}, sort_keys=True))


if __name__ == "__main__":
    main()
