#!/usr/bin/python3
"""R2 benchmark (docs/recompute.md): what recorded routing costs to put back.

A real rollpackd holds `--samples` samples of `--tokens` tokens of a
Qwen3-30B-A3B-shaped model (48 MoE layers, top-8 of 128 experts, uint8 ids);
a step over them on dp=2 pp=2 (16,384 tokens per rank) is fetched by every
rank, and each rank uploads its micro-batch's replay_experts as its recorded
routing (RoutingUploader: narrowing, protobuf, gRPC, the server's inverse
layout and checks), one upload at a time; then the step is committed.
Prints the time per upload (median and max), per (row, layer) entry, and
of the commit, as a Markdown table, then one JSON line.

Run (from the repository root, after `make build`):
    PYTHONPATH=client/python /usr/bin/python3 client/python/bench/recompute_bench.py
"""

import argparse
import json
import os
import sys
import time

import grpc
import numpy as np

import rollpack
from rollpack._proto import trainer_pb2, trainer_pb2_grpc
from rollpack.recompute import RoutingUploader

_REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", ".."))
sys.path.insert(0, os.path.join(_REPO, "client", "python"))
from tests.rollpackd import Rollpackd  # noqa: E402

N, E, K = 48, 128, 8


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--rollpackd", default=os.path.join(_REPO, "build", "bin", "rollpackd"))
    args = ap.parse_args()
    os.environ.setdefault("ROLLPACKD", args.rollpackd)
    rng = np.random.default_rng(0)
    with Rollpackd("--max-memory", str(16 << 30)) as d:
        with rollpack.Producer(d.address, "p") as p:
            p.register_model(rollpack.ModelSpec("q", num_layers=N, num_experts=E, topk=K))
            batch = []
            for i in range(args.samples):
                base = rng.integers(0, E, size=(args.tokens - 1, N, 1), dtype=np.int32)
                ex = ((base + np.arange(K, dtype=np.int32)) % E).astype(np.uint8)
                batch.append(rollpack.Sample("s%d" % i, np.ones(args.tokens, np.int32), ex))
                if len(batch) == 8:
                    p.put(batch)
                    batch = []
            if batch:
                p.put(batch)
        with rollpack.Controller(d.address) as c:
            c.create_step("a", "p", num_samples=args.samples,
                          topology=dict(dp=2, pp=2, max_tokens_per_rank=16384))
            channel = grpc.insecure_channel(d.address, [("grpc.max_receive_message_length", -1)])
            stub = trainer_pb2_grpc.TrainerStub(channel)
            times, shape = [], None
            for dp in range(2):
                for pp in range(2):
                    rank = trainer_pb2.RankCoords(dp=dp, pp=pp)
                    with RoutingUploader(d.address, "a", (dp, 0, 0, pp)) as up:
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
    out = {"uploads": len(times), "upload_shape": list(shape),
           "upload_bytes": int(np.prod(shape)), "upload_ms_median": 1e3 * median,
           "upload_ms_max": 1e3 * times[-1],
           "ns_per_row_layer": 1e9 * median / (shape[0] * shape[1]),
           "commit_ms": 1e3 * commit_s, "commit_tokens": done.tokens,
           "commit_bytes": done.stored_bytes}
    print("| uploads | upload shape | bytes | median ms | max ms | ns per (row, layer) "
          "| commit ms (tokens) |")
    print("|---|---|---|---|---|---|---|")
    print("| %d | %s | %d | %.1f | %.1f | %.1f | %.1f (%d) |"
          % (out["uploads"], "x".join(map(str, shape)), out["upload_bytes"],
             out["upload_ms_median"], out["upload_ms_max"], out["ns_per_row_layer"],
             out["commit_ms"], out["commit_tokens"]))
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
