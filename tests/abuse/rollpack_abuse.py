#!/usr/bin/python3
"""rollpack_abuse: the attacks of issue 18, each measured before and after
its mitigation, side by side in one run.

    /usr/bin/python3 tests/abuse/rollpack_abuse.py --rollpackd build/bin/rollpackd
    ... --only compressed_bomb,rapid_reset --scale 0.25 --json out.json
    ... --baseline /path/to/an/older/rollpackd

"before" is the same binary with the mitigation's flags turned off, or
--baseline's binary; "after" is --rollpackd with its defaults and the
experiment's own flags (its table row shows them); "mtls" the same behind
mutual TLS. stalled_fetch and per_client_streams load their step with
client/python's producer: they need numpy and the stubs a build generates.
Prints a table and one JSON document (also to --json). Each experiment
starts its own servers on 127.0.0.1 and stops them, but per_client_streams:
it needs root for two network namespaces (host_probes.py; its row says so
when they cannot be made) and adds a "loopback" row. The full
scale reproduces the figures of the issue: an unprotected server may take
most of the machine's memory (the oversized experiment reached 18 GB and
was killed by the kernel on a 24 GB host); run it on a machine with
nothing else to lose, or lower --scale.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fetch_probes  # noqa: E402
import harness  # noqa: E402
import host_probes  # noqa: E402
import message_probes  # noqa: E402

try:
    import transport_probes  # noqa: E402
except ImportError:  # pragma: no cover - kept runnable without it
    transport_probes = None


def _mb(n):
    return int(n) << 20


# name -> how to run it. `args`: flags both servers get; `unprotected`: the
# flags that turn the mitigation off on the same binary; `headline`: the
# figures the table shows.
EXPERIMENTS = {
    "oversized_unauthenticated": {
        "what": "8 concurrent 530 MB GetPool requests without a token (--auth-tokens on)",
        "auth": True,
        "args": ["--max-message-bytes", str(600 << 20), "--h2-guard=true"],
        "unprotected": ["--transport-memory", "0", "--h2-guard=false"],
        "mitigation": "plaintext: the HTTP/2 guard checks each call's token from its headers and "
                      "closes a connection whose refused calls sent 1 MiB; TLS: the token gate "
                      "refuses from the headers; --transport-memory bounds the rest",
        "run": lambda s, scale: message_probes.oversized_unauthenticated(
            s, calls=8, request_bytes=int(_mb(530) * scale)),
        "headline": ["peak_rss_mb", "codes", "server_alive", "normal_client_during"],
    },
    "compressed_bomb": {
        "what": "one gzip GetPool request inflating to 1250 MB",
        "args": [],
        "unprotected": ["--accept-compressed-requests", "--transport-memory", "0"],
        "mitigation": "compressed requests refused from their headers (--accept-compressed-requests "
                      "off by default)",
        "run": lambda s, scale: message_probes.compressed_bomb(
            s, inflated_bytes=int(_mb(1250) * scale)),
        "headline": ["peak_rss_mb", "code", "seconds"],
    },
    "long_names": {
        "what": "GetPool and RegisterModel naming a 10 MB pool",
        "args": [],
        "unprotected": None,  # a code change: only --baseline shows "before"
        "mitigation": "pool names and step ids of at most 128 printable UTF-8 bytes, refused without echoing them",
        "run": lambda s, scale: message_probes.long_names(s, name_bytes=max(1024, int(_mb(10) * scale))),
        "headline": ["GetPool", "RegisterModel"],
    },
}

if transport_probes is not None:
    EXPERIMENTS["rapid_reset"] = {
        "what": "HTTP/2 rapid reset (HEADERS + RST_STREAM in a loop, 4 connections from "
                "127.0.0.2 that reconnect when closed, no token)",
        # The guard's default (auto) leaves loopback ports alone.
        "args": ["--h2-guard=true"],
        # gRPC 1.51 cannot refuse it, quota or not: "before" is the same
        # server without the HTTP/2 guard.
        "unprotected": ["--h2-guard=false"],
        "mutual_tls": True,
        # Rows tls-before / tls: TLS without client certificates, where the
        # guard ends TLS itself.
        "server_tls": True,
        "mitigation": "the HTTP/2 guard in front of plaintext ports and TLS ports without client "
                      "certificates (it ends TLS itself): a stream-reset budget per client host, "
                      "GOAWAY(ENHANCE_YOUR_CALM) and a cool-down past it; on mutual-TLS ports "
                      "the handshake refuses the attacker",
        "run": lambda s, scale: transport_probes.rapid_reset(
            s, seconds=max(2.0, 10 * scale), connections=4, settle_seconds=max(2.0, 20 * scale),
            source="127.0.0.2", reconnect=True),
        "headline": ["streams_opened", "refused_reconnects", "peak_rss_mb", "rss_settled_mb",
                     "normal_client_during", "normal_client_after", "sigterm_seconds"],
    }
    EXPERIMENTS["stalled_put"] = {
        "what": "4 PutSamples streams declaring 400 MB messages, sending 300 MB, then stalling",
        "args": [],
        "unprotected": ["--transport-memory", "0"],
        "mitigation": "--transport-memory: gRPC resets streams and closes connections past it",
        "run": lambda s, scale: transport_probes.stalled_put(
            s, streams=4, declared_bytes=_mb(400), send_bytes=int(_mb(300) * scale),
            hold_seconds=max(4.0, 30 * scale)),
        "headline": ["peak_rss_mb", "accepted_mb", "resets", "goaways"],
    }


EXPERIMENTS["stalled_fetch"] = {
    "what": "200 FetchMicrobatches streams that never read, ~9.4 MB micro-batches, "
            "--max-memory 200000000",
    "args": ["--max-memory", "200000000"],
    "unprotected": ["--stream-buffer-memory", "0"],
    "mitigation": "--stream-buffer-memory (by default --max-memory, here 200 MB): streams past "
                  "it wait holding nothing; --stream-write-timeout ends the stalled ones",
    "run": lambda s, scale: fetch_probes.stalled_fetch(
        s, streams=max(8, int(200 * scale)), hold_seconds=max(4.0, 20 * scale)),
    "headline": ["peak_rss_mb", "microbatch_mb", "normal_client_during"],
}


EXPERIMENTS["per_client_streams"] = {
    "what": "60 FetchMicrobatches streams that never read from one client host (4 raw "
            "connections) while a trainer on another host makes 30 whole fetches, one after "
            "the other, --max-concurrent-streams 50 (two network namespaces, root only)",
    "mitigation": "--max-streams-per-client 8: streams in flight per client IP; the other "
                  "host keeps the rest of --max-concurrent-streams (on one host the trainer "
                  "shares the attacker's 8: row loopback)",
    # Makes its own namespaces and servers: before (--max-streams-per-client
    # 0, or --baseline), after, loopback.
    "rows": lambda binary, baseline, scale: host_probes.per_client_streams(
        binary, baseline, streams=max(12, int(60 * scale)), fetches=max(5, int(30 * scale)),
        max_concurrent=max(10, int(50 * scale)), per_client=8 if scale >= 0.5 else 4),
    "headline": ["attacker_admitted", "attacker_refused", "trainer_ok", "trainer_refused",
                 "clients"],
}


def run_one(name, spec, binary, baseline, scale):
    if "rows" in spec:
        try:
            return spec["rows"](binary, baseline, scale)
        except host_probes.HostsUnavailable as e:
            return {"skipped": {"error": "no network namespaces here: %s" % e}}
    rows = {}
    configs = []  # (label, binary, flags, TLS: None, "server" or "mutual")
    if baseline:
        configs.append(("before", baseline, spec["args"], None))
    elif spec["unprotected"] is not None:
        configs.append(("before", binary, spec["args"] + spec["unprotected"], None))
    configs.append(("after", binary, spec["args"], None))
    if spec.get("server_tls"):
        if baseline:
            configs.append(("tls-before", baseline, spec["args"], "server"))
        elif spec["unprotected"] is not None:
            configs.append(("tls-before", binary, spec["args"] + spec["unprotected"], "server"))
        configs.append(("tls", binary, spec["args"], "server"))
    if spec.get("mutual_tls"):
        configs.append(("mtls", binary, spec["args"], "mutual"))
    for label, exe, args, tls in configs:
        start = time.monotonic()
        try:
            with harness.Server(exe, args, auth=spec.get("auth", False),
                                mutual_tls=tls == "mutual", tls=tls == "server") as server:
                figures = spec["run"](server, scale)
                figures.setdefault("server_alive", server.alive())
        except Exception as e:  # an experiment that breaks the server is a result
            figures = {"error": "%s: %s" % (type(e).__name__, e)}
        figures["wall_s"] = round(time.monotonic() - start, 1)
        figures["flags"] = args + {None: [], "server": ["--tls-cert", "--tls-key"],
                                   "mutual": ["--tls-cert", "--tls-key", "--tls-client-ca"]}[tls]
        rows[label] = figures
    return rows


def _short(value):
    if isinstance(value, dict):
        if not value:
            return "none"
        if "failed" in value and "calls" in value:
            return "%d/%d failed, worst %.2fs" % (value["failed"], value["calls"], value["worst_s"])
        return ",".join("%s=%s" % (k, _short(v)) for k, v in value.items())
    return str(value)


def print_table(results):
    print("%-26s %-8s %s" % ("experiment", "server", "figures"))
    for name, rows in results.items():
        for label, figures in rows.items():
            keys = EXPERIMENTS[name]["headline"]
            shown = figures.get("error") or "  ".join(
                "%s=%s" % (k, _short(figures.get(k))) for k in keys)
            print("%-26s %-8s %s" % (name, label, shown))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollpackd", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "bin", "rollpackd"))
    parser.add_argument("--baseline", default="", help="an older rollpackd for the 'before' rows")
    parser.add_argument("--only", default="", help="comma-separated experiments (default: all)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="sizes and durations relative to the issue's (1.0)")
    parser.add_argument("--json", default="", help="also write the JSON document here")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(EXPERIMENTS)
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        parser.error("unknown experiment(s) %s; known: %s" % (unknown, ", ".join(EXPERIMENTS)))
    results = {}
    for name in names:
        print("running %s: %s" % (name, EXPERIMENTS[name]["what"]), file=sys.stderr, flush=True)
        results[name] = run_one(name, EXPERIMENTS[name], args.rollpackd, args.baseline, args.scale)
    print_table(results)
    document = {"scale": args.scale, "rollpackd": args.rollpackd, "baseline": args.baseline,
                "experiments": {n: dict(what=EXPERIMENTS[n]["what"],
                                        mitigation=EXPERIMENTS[n]["mitigation"], **results[n])
                                for n in results}}
    print(json.dumps(document))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(document, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
