#!/usr/bin/python3
"""Wire benchmark: routed experts of an 8k-token Qwen3-30B-A3B-shaped sample
(8191 rows x 48 MoE layers x top-8 of 128 experts, int32 as the engines hold
them) and of a 64-sample batch, shipped in four formats:

  rollpack   rollpack.v1 PutSamplesRequest, NDArray uint8 (protobuf)
  npy-b64    vLLM >= 0.22: choices[i].routed_experts = base64 .npy, in JSON
  raw-b64    SGLang: meta_info.routed_experts = base64 raw int32, in JSON
  json       vLLM 0.21: nested JSON lists (prompt + choice), compact JSON

For each: bytes on the wire (the message bodies) and CPU seconds of
encode (engine side: numpy int32 -> body) + transfer (loopback TCP to a
receiver process) + decode (receiver: body -> numpy [rows, L, K] with the
rollpack adapters, as a consumer would), summed over both processes. Every
decoded array is checked bit-exact against the original (outside the
timings). With --rollpackd (default: build/bin/rollpackd when it exists) a
last row puts the same samples through Producer.put into a real rollpackd
(client CPU + rollpackd CPU; the server validates and stores them).

Run (from the repository root, after `make build`):
    PYTHONPATH=client/python /usr/bin/python3 client/python/bench/wire_bench.py
Prints a Markdown table, then one JSON line.
"""

import argparse
import json
import multiprocessing as mp
import os
import socket
import struct
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # client/python: rollpack and tests.engines

from rollpack import Producer, Sample  # noqa: E402
from rollpack import adapters as ad  # noqa: E402
from rollpack import ndarray as nd  # noqa: E402
from rollpack._proto import rollouts_pb2  # noqa: E402
from tests import engines as eng  # noqa: E402

SPEC = eng.QWEN3_30B_A3B
N_TOKENS = 8192
PROMPT = 1024  # vLLM 0.21 splits rows into prompt + completion
DISTINCT = 4  # distinct routed arrays, cycled over the batch (memory)
FORMATS = ("rollpack", "npy-b64", "raw-b64", "json")
LABELS = {
    "rollpack": "rollpack NDArray uint8 (protobuf)",
    "npy-b64": "base64 .npy int32 in JSON (vLLM >= 0.22)",
    "raw-b64": "base64 raw int32 in JSON (SGLang)",
    "json": "JSON nested lists (vLLM 0.21)",
    "rollpackd": "rollpack Producer.put -> rollpackd (validated, stored)",
}


def truths():
    return [eng.routed(N_TOKENS - 1, SPEC, seed=100 + i) for i in range(DISTINCT)]


def tokens_of(i):
    return eng.tokens(N_TOKENS, seed=200 + i % DISTINCT)


def _dumps(obj):
    # What the engines' HTTP servers emit: Starlette/FastAPI compact JSON.
    return json.dumps(obj, separators=(",", ":")).encode()


# -- engine side: int32 numpy -> body ------------------------------------------------
def encode(fmt, idxs, t, toks):
    """Bodies (bytes) for samples ``idxs``; HTTP formats: one response each."""
    if fmt == "rollpack":
        out, req, size = [], rollouts_pb2.PutSamplesRequest(pool="bench"), 0
        for i in idxs:
            s = Sample("s%d" % i, toks[i % DISTINCT], t[i % DISTINCT])
            s.to_proto(SPEC, req.samples.add())
            size += s.wire_size_hint()
            if size >= 16 << 20:
                out.append(req.SerializeToString())
                req, size = rollouts_pb2.PutSamplesRequest(pool="bench"), 0
        if len(req.samples):
            out.append(req.SerializeToString())
        return out
    out = []
    for i in idxs:
        a, tk = t[i % DISTINCT], toks[i % DISTINCT]
        if fmt == "npy-b64":
            body = {"choices": [{"index": 0, "token_ids": tk[PROMPT:].tolist(),
                                 "routed_experts": eng.npy_b64(a)}],
                    "prompt_token_ids": tk[:PROMPT].tolist()}
        elif fmt == "raw-b64":
            import base64
            body = {"output_ids": tk[PROMPT:].tolist(), "meta_info": {
                "routed_experts": base64.b64encode(a.tobytes()).decode("ascii"),
                "prompt_tokens": PROMPT}}
        else:
            body = {"prompt_token_ids": tk[:PROMPT].tolist(),
                    "prompt_routed_experts": a[:PROMPT].astype(np.int16).tolist(),
                    "choices": [{"index": 0, "token_ids": tk[PROMPT:].tolist(),
                                 "routed_experts": a[PROMPT:].astype(np.int16).tolist()}]}
        out.append(_dumps(body))
    return out


# -- consumer side: body -> (tokens, [rows, L, K]) ------------------------------------
def decode(fmt, body):
    if fmt == "rollpack":
        req = rollouts_pb2.PutSamplesRequest()
        req.ParseFromString(body)
        return [(nd.from_proto(s.tokens), nd.from_proto(s.routed_experts)) for s in req.samples]
    r = json.loads(body)
    if fmt == "npy-b64":
        c = r["choices"][0]
        tk = np.concatenate([np.asarray(r["prompt_token_ids"], np.int32),
                             np.asarray(c["token_ids"], np.int32)])
        return [(tk, ad.from_vllm_choice(c, tk, SPEC).array)]
    if fmt == "raw-b64":
        tk = np.asarray(r["output_ids"], np.int32)  # + the prompt the client already holds
        return [(tk, ad.from_sglang_meta_info(r, PROMPT + len(tk), SPEC).array)]
    tk = np.concatenate([np.asarray(r["prompt_token_ids"], np.int32),
                         np.asarray(r["choices"][0]["token_ids"], np.int32)])
    return [(tk, ad.from_vllm_v021_response(r, tk, SPEC).array)]


def _recv_exact(conn, n):
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = conn.recv_into(view[got:], n - got)
        if not k:
            raise EOFError
        got += k
    return bytes(buf)


def receiver(port_q, res_q, fmt, count):
    t = truths()
    toks = [tokens_of(i) for i in range(DISTINCT)]
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port_q.put(srv.getsockname()[1])
    conn, _ = srv.accept()
    c0, verify, nbytes, seen = time.process_time(), 0.0, 0, 0
    while True:
        (n,) = struct.unpack("<Q", _recv_exact(conn, 8))
        if n == 0:
            break
        body = _recv_exact(conn, n)
        nbytes += n
        got = decode(fmt, body)
        v0 = time.process_time()
        for tk, arr in got:  # bit-exact check, not timed
            j = seen % DISTINCT
            want = t[j]
            ok = np.array_equal(tk, toks[j][PROMPT:] if fmt == "raw-b64" else toks[j])
            if arr.shape[1] != want.shape[1]:
                want = want[:, list(SPEC.resolved_moe_layers)]
            if not ok or not np.array_equal(arr, want):
                res_q.put(("error", "%s: sample %d decoded differently" % (fmt, seen)))
                return
            seen += 1
        verify += time.process_time() - v0
        del got, body
    cpu = time.process_time() - c0 - verify
    res_q.put(("ok", cpu, nbytes, seen))
    conn.close()


def run_format(fmt, count, t, toks):
    ctx = mp.get_context("fork")
    port_q, res_q = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=receiver, args=(port_q, res_q, fmt, count))
    p.start()
    sock = socket.create_connection(("127.0.0.1", port_q.get(timeout=60)))
    w0, c0 = time.perf_counter(), time.process_time()
    nbytes, step = 0, 16 if fmt == "rollpack" else 1
    for start in range(0, count, step):
        for body in encode(fmt, range(start, min(count, start + step)), t, toks):
            sock.sendall(struct.pack("<Q", len(body)))
            sock.sendall(body)
            nbytes += len(body)
    sock.sendall(struct.pack("<Q", 0))
    send_cpu = time.process_time() - c0
    res = res_q.get(timeout=3600)
    wall = time.perf_counter() - w0
    sock.close()
    p.join()
    if res[0] != "ok":
        raise SystemExit(res[1])
    _, recv_cpu, rbytes, seen = res
    assert rbytes == nbytes and seen == count, (rbytes, nbytes, seen, count)
    return {"format": fmt, "samples": count, "bytes": nbytes, "cpu_s": send_cpu + recv_cpu,
            "encode_send_cpu_s": send_cpu, "recv_decode_cpu_s": recv_cpu, "wall_s": wall}


def _proc_cpu(pid):
    with open("/proc/%d/stat" % pid) as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def run_rollpackd(exe, count, t, toks):
    from tests.rollpackd import Rollpackd
    os.environ.setdefault("ROLLPACKD", exe)
    with Rollpackd() as d:
        with Producer(d.address, "bench", timeout=600) as p:
            p.register_model(SPEC)
            # warm the channel and the server
            p.put(Sample("warm", toks[0][:16], t[0][:15]))
            s0, c0, w0 = _proc_cpu(d.proc.pid), time.process_time(), time.perf_counter()
            r = p.put(Sample("s%d" % i, toks[i % DISTINCT], t[i % DISTINCT]) for i in range(count))
            wall = time.perf_counter() - w0
            cli, srv = time.process_time() - c0, _proc_cpu(d.proc.pid) - s0
    if r.accepted != count:
        raise SystemExit("rollpackd accepted %d of %d" % (r.accepted, count))
    return {"format": "rollpackd", "samples": count, "bytes": r.wire_bytes, "cpu_s": cli + srv,
            "encode_send_cpu_s": cli, "recv_decode_cpu_s": srv, "wall_s": wall,
            "server_exit": d.returncode}


def table(rows):
    out = []
    for count in sorted({r["samples"] for r in rows}):
        rs = [r for r in rows if r["samples"] == count]
        base = next(r for r in rs if r["format"] == "rollpack")
        out.append("\n**%d sample%s** (%d tokens each)\n" % (count, "s" if count > 1 else "",
                                                              N_TOKENS))
        out.append("| format | wire bytes | bytes / rollpack | CPU s (enc+xfer+dec) | "
                   "CPU / rollpack | enc+send CPU s | recv+dec CPU s | wall s |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rs:
            out.append("| %s | %s | %.2fx | %.4f | %.1fx | %.4f | %.4f | %.3f |" % (
                LABELS[r["format"]], "{:,}".format(r["bytes"]), r["bytes"] / base["bytes"],
                r["cpu_s"], r["cpu_s"] / base["cpu_s"], r["encode_send_cpu_s"],
                r["recv_decode_cpu_s"], r["wall_s"]))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--formats", default=",".join(FORMATS))
    default_exe = os.path.join(HERE, "..", "..", "..", "build", "bin", "rollpackd")
    ap.add_argument("--rollpackd", default=os.path.abspath(default_exe) if os.access(
        default_exe, os.X_OK) else "", help="rollpackd binary for the end-to-end row ('' = skip)")
    a = ap.parse_args()
    t = truths()
    toks = [tokens_of(i) for i in range(DISTINCT)]
    rows = []
    for count in (1, a.batch):
        for fmt in a.formats.split(","):
            rows.append(run_format(fmt, count, t, toks))
            print("  %-9s x%-3d %12d bytes %8.3f CPU s" % (fmt, count, rows[-1]["bytes"],
                                                           rows[-1]["cpu_s"]), file=sys.stderr)
        if a.rollpackd:
            rows.append(run_rollpackd(a.rollpackd, count, t, toks))
    print("Sample: %d tokens, routed experts [%d, %d, %d] int32 (Qwen3-30B-A3B: %d layers, "
          "%d experts, top-%d); each id uniform over the experts." % (
              N_TOKENS, N_TOKENS - 1, SPEC.num_layers, SPEC.topk, SPEC.num_layers,
              SPEC.num_experts, SPEC.topk))
    print(table(rows))
    print(json.dumps({"spec": SPEC.to_dict(), "tokens": N_TOKENS, "rows": rows}))


if __name__ == "__main__":
    main()
