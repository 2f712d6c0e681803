"""rollpack producer CLI.

    python3 -m rollpack put --from-jsonl FILE --server HOST:PORT --pool POOL
        [--model-json JSON_OR_@FILE] [--token T | --token-file F]
        [--tls] [--root-cert PEM] [--client-cert PEM --client-key PEM]
        [--server-name NAME] [--timeout S] [--batch-bytes B] [--keep-going]

Reads captured engine responses (one JSON object per line, format in
rollpack/jsonl.py and docs/producer.md; FILE "-" = stdin), adapts them and
streams them to the pool. With --model-json the model is registered first;
otherwise the pool's registered model is used. Prints a JSON summary on
stdout. Exit status: 0 on success, 1 when a line or the server refused
(lines before it are committed), 2 on usage errors.
"""

import argparse
import json
import os
import sys

from rollpack import errors
from rollpack.jsonl import read_samples
from rollpack.producer import Producer
from rollpack.spec import ModelSpec


def _model(arg):
    if arg.startswith("@"):
        with open(arg[1:]) as f:
            arg = f.read()
    elif os.path.exists(arg) and not arg.lstrip().startswith("{"):
        with open(arg) as f:
            arg = f.read()
    return ModelSpec.from_json(arg)


def _parser():
    ap = argparse.ArgumentParser(prog="rollpack", description="rollpack producer CLI")
    sub = ap.add_subparsers(dest="command", required=True)
    put = sub.add_parser("put", help="push captured engine responses to a pool")
    put.add_argument("--from-jsonl", required=True, metavar="FILE",
                     help="captured engine responses, one JSON object per line ('-' = stdin)")
    put.add_argument("--server", default=os.environ.get("ROLLPACK_SERVER", "127.0.0.1:50051"))
    put.add_argument("--pool", required=True)
    put.add_argument("--model-json", metavar="JSON|@FILE",
                     help="ModelSpec as JSON (or @file): registered before the put")
    put.add_argument("--token", default=os.environ.get("ROLLPACK_TOKEN"))
    put.add_argument("--token-file")
    put.add_argument("--tls", action="store_true")
    put.add_argument("--root-cert")
    put.add_argument("--client-cert")
    put.add_argument("--client-key")
    put.add_argument("--server-name")
    put.add_argument("--timeout", type=float, default=60.0)
    put.add_argument("--batch-bytes", type=int, default=16 << 20)
    put.add_argument("--keep-going", action="store_true",
                     help="skip lines that cannot be adapted (reported on stderr)")
    return ap


def cmd_put(a):
    token = a.token
    if a.token_file:
        with open(a.token_file) as f:
            token = f.read().strip()
    spec = _model(a.model_json) if a.model_json else None
    p = Producer(a.server, a.pool, token=token, tls=a.tls, root_certificates=a.root_cert,
                 client_certificate=a.client_cert, client_key=a.client_key,
                 server_name=a.server_name, timeout=a.timeout, max_message_bytes=a.batch_bytes)
    bad = [] if a.keep_going else None
    with p:
        created = p.register_model(spec) if spec is not None else None
        spec = p.model()
        f = sys.stdin if a.from_jsonl == "-" else open(a.from_jsonl, "r", encoding="utf-8")
        try:
            r = p.put(read_samples(f, spec, errors=bad, name=a.from_jsonl))
        finally:
            if f is not sys.stdin:
                f.close()
    for e in bad or ():
        print("rollpack put: skipped %s" % e, file=sys.stderr)
    print(json.dumps({"pool": a.pool, "model_created": created, "accepted": r.accepted,
                      "duplicates": r.duplicates, "stored_bytes": r.stored_bytes,
                      "skipped": len(bad or ()), "messages": r.messages,
                      "wire_bytes": r.wire_bytes, "retries": r.retries}))
    return 0


def main(argv=None):
    a = _parser().parse_args(argv)
    try:
        if a.command == "put":
            return cmd_put(a)
    except (errors.RollpackError, errors.PayloadError, ValueError, OSError) as e:
        print("rollpack %s: %s" % (a.command, e), file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
