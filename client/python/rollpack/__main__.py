"""rollpack producer CLI.

    python3 -m rollpack put --from-jsonl FILE --server HOST:PORT --pool POOL
        [--model-json JSON_OR_@FILE] [--token T | --token-file F]
        [--tls] [--root-cert PEM] [--client-cert PEM --client-key PEM]
        [--server-name NAME] [--timeout S] [--batch-bytes B] [--keep-going]

    python3 -m rollpack pool --server HOST:PORT --pool POOL [--json]
        [--token T | --token-file F] [--tls] [--root-cert PEM] ...

`put` reads captured engine responses (one JSON object per line, format in
rollpack/jsonl.py and docs/producer.md; FILE "-" = stdin), adapts them and
streams them to the pool. With --model-json the model is registered first;
otherwise the pool's registered model is used. Prints a JSON summary on
stdout. Exit status: 0 on success, 1 when a line or the server refused
(lines before it are committed), 2 on usage errors.

`pool` prints the pool's samples, groups (complete, incomplete, dropped),
policy version, stale samples and options (docs/lifecycle.md); --json prints
the PoolInfo message as JSON.
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


def _connection_flags(parser, timeout):
    """The server, pool, token and TLS flags every command takes."""
    parser.add_argument("--server", default=os.environ.get("ROLLPACK_SERVER", "127.0.0.1:50051"))
    parser.add_argument("--pool", required=True)
    parser.add_argument("--token", default=os.environ.get("ROLLPACK_TOKEN"))
    parser.add_argument("--token-file")
    parser.add_argument("--tls", action="store_true")
    parser.add_argument("--root-cert")
    parser.add_argument("--client-cert")
    parser.add_argument("--client-key")
    parser.add_argument("--server-name")
    parser.add_argument("--timeout", type=float, default=timeout)


def _token(a):
    if a.token_file:
        with open(a.token_file) as f:
            return f.read().strip()
    return a.token


def _parser():
    ap = argparse.ArgumentParser(prog="rollpack", description="rollpack producer CLI")
    sub = ap.add_subparsers(dest="command", required=True)
    put = sub.add_parser("put", help="push captured engine responses to a pool")
    put.add_argument("--from-jsonl", required=True, metavar="FILE",
                     help="captured engine responses, one JSON object per line ('-' = stdin)")
    _connection_flags(put, timeout=60.0)
    put.add_argument("--model-json", metavar="JSON|@FILE",
                     help="ModelSpec as JSON (or @file): registered before the put")
    put.add_argument("--batch-bytes", type=int, default=16 << 20)
    put.add_argument("--keep-going", action="store_true",
                     help="skip lines that cannot be adapted (reported on stderr)")
    pool = sub.add_parser("pool", help="show a pool: samples, groups, versions, options")
    _connection_flags(pool, timeout=10.0)
    pool.add_argument("--json", action="store_true", help="the PoolInfo message as JSON")
    return ap


def cmd_put(a):
    token = _token(a)
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


def _pool_lines(info):
    o = info.options
    stale = ("max_staleness %d%s" % (o.max_staleness, ", drop_stale" if o.drop_stale else "")
             if o.HasField("max_staleness") else "no staleness bound")
    lines = [
        "pool %s: model %r" % (info.pool, info.model.name),
        "  samples       %d (%d free, %d open, %d in %d live steps)" % (
            info.num_samples, info.num_free_samples, info.num_open_samples,
            info.num_samples - info.num_free_samples, info.num_live_steps),
        "  groups        %d complete, %d incomplete; %d dropped incomplete" % (
            info.num_complete_groups, info.num_incomplete_groups,
            info.num_incomplete_groups_dropped),
        "  policy        version %d, %s; %d free samples stale, %d dropped stale" % (
            info.policy_version, stale, info.num_stale_samples, info.num_stale_dropped),
        "  options       default_group_size %d, max_uses %s, incomplete_group_timeout_ms %s" % (
            o.default_group_size, o.max_uses or "unlimited",
            o.incomplete_group_timeout_ms or "never"),
        "  stored        %d bytes (server %d of %d)" % (
            info.stored_bytes, info.server_stored_bytes, info.server_max_memory_bytes),
    ]
    for m in info.members:
        lines.append("  member %s: %d samples, %d free%s" % (
            m.member, m.num_samples, m.num_free_samples,
            " (did not answer: %s)" % m.error if m.error else ""))
    return lines


def cmd_pool(a):
    token = _token(a)
    with Producer(a.server, a.pool, token=token, tls=a.tls, root_certificates=a.root_cert,
                  client_certificate=a.client_cert, client_key=a.client_key,
                  server_name=a.server_name, timeout=a.timeout) as p:
        info = p.pool_info()
    if a.json:
        from google.protobuf import json_format
        print(json_format.MessageToJson(info, preserving_proto_field_name=True, indent=None))
    else:
        print("\n".join(_pool_lines(info)))
    return 0


def main(argv=None):
    a = _parser().parse_args(argv)
    try:
        if a.command == "put":
            return cmd_put(a)
        if a.command == "pool":
            return cmd_pool(a)
    except (errors.RollpackError, errors.PayloadError, ValueError, OSError) as e:
        print("rollpack %s: %s" % (a.command, e), file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
