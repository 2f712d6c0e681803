"""rollpack producer CLI.

    python3 -m rollpack put --from-jsonl FILE --server HOST:PORT --pool POOL
        [--model-json JSON_OR_@FILE] [--token T | --token-file F]
        [--tls] [--root-cert PEM] [--client-cert PEM --client-key PEM]
        [--server-name NAME] [--timeout S] [--batch-bytes B] [--keep-going]

    python3 -m rollpack pool [show] --server HOST:PORT --pool POOL [--json]
        [--token T | --token-file F] [--tls] [--root-cert PEM] ...
    python3 -m rollpack pool list [--json] ...
    python3 -m rollpack pool register --pool POOL --model-json JSON_OR_@FILE
        [--options-json JSON_OR_@FILE] [--required-scalar NAME ...] ...
    python3 -m rollpack pool annotate --pool POOL [--sample ID --scalar NAME=VALUE ...]...
        [--from-jsonl FILE] [--json] ...
    python3 -m rollpack pool delete POOL [--force] [--yes] [--json] ...
    python3 -m rollpack pool samples POOL [--state free|held|stale|open] [--group G]
        [--limit N] [--json] ...

    python3 -m rollpack step create STEP --pool POOL (--num-samples N | --num-groups G |
        --num-tokens T | --sample-ids A,B,...) --max-tokens-per-rank T [--dp D --cp C
        --tp T --pp P | --topology-json JSON] [--whole-groups] [--policy-version V]
        [--max-staleness S] [--selection oldest|newest_version] [--reuse-samples]
        [--advantage none|grpo|grpo-mean|rloo [--advantage-scalar NAME]
        [--advantage-eps EPS]] [--json]
    python3 -m rollpack step show|plan|release STEP [--json] ...
    python3 -m rollpack step plan STEP --groups ...
    python3 -m rollpack step list [--pool POOL] [--json] ...
    (rollpack/_cli_steps.py: `step show`, one step in detail with a picture of its plan)

    python3 -m rollpack cluster status [--json] ...
    python3 -m rollpack member drain|undrain HOST:PORT [--wait] [--json] ...
    (rollpack/_cli_cluster.py: the cluster's members, draining one for maintenance)

`put` reads captured engine responses (one JSON object per line, format in
rollpack/jsonl.py and docs/producer.md; FILE "-" = stdin), adapts them and
streams them to the pool. With --model-json the model is registered first;
otherwise the pool's registered model is used. Prints a JSON summary on
stdout. Exit status: 0 on success, 1 when a line or the server refused
(lines before it are committed), 2 on usage errors.

`pool` prints the pool's samples, groups (complete, incomplete, dropped),
policy version, stale samples and options (docs/lifecycle.md); `pool list`
every pool, one line each. `pool register` registers the pool's model and
options without putting samples (`--required-scalar reward`: samples are
selectable only once annotated). `pool annotate` adds scalars to stored
samples (lifecycle.md section 6): each `--sample ID` is followed by its
`--scalar NAME=VALUE`s, and `--from-jsonl FILE` ("-" = stdin) adds one
entry per line, {"sample_id": ID, "scalars": {NAME: VALUE}}; all of them go
in one request, accepted or refused whole. The pool may be given as the
argument after the action instead of --pool. `step` is the controller's side (docs/operations.md,
"Controller"): create a step, show it, print its plan, release it, and list
the live steps (with their age and trainer streams: what a restarted
controller finds). `step create --advantage` has the step compute each
sequence's advantage over its group (lifecycle.md section 6); `step plan
--groups` also prints every sequence's group, policy version, scalars and
advantage, read from the micro-batches of one rank per CP group (a trainer
token; a rank's bytes per stream read). --json prints the messages as JSON. Exit status: 0, 1 when
the server refused (its message on stderr), 2 on usage errors.
"""

import argparse
import json
import os
import sys

import time

from rollpack import _cli_cluster, _cli_common, _cli_pools, _cli_steps, errors
from rollpack.controller import Controller
from rollpack.jsonl import read_samples
from rollpack.producer import Producer
from rollpack.spec import ModelSpec


def _json_arg(arg):
    if arg.startswith("@"):
        with open(arg[1:]) as f:
            arg = f.read()
    elif os.path.exists(arg) and not arg.lstrip().startswith("{"):
        with open(arg) as f:
            arg = f.read()
    return arg


def _model(arg):
    return ModelSpec.from_json(_json_arg(arg))


def _connection_flags(parser, timeout, pool_required=True):
    """The server, pool, token and TLS flags every command takes."""
    _cli_common.connection_flags(parser, timeout)
    parser.add_argument("--pool", required=pool_required, default="",
                        help="the pool" + ("" if pool_required else " (step list: filter)"))


class _SampleAction(argparse.Action):
    """--sample ID: starts an annotation entry; the --scalar flags after it
    are its scalars."""

    def __call__(self, parser, namespace, value, option_string=None):
        entries = list(getattr(namespace, self.dest, None) or [])
        entries.append((value, {}))
        setattr(namespace, self.dest, entries)


class _ScalarAction(argparse.Action):
    """--scalar NAME=VALUE: a scalar of the last --sample."""

    def __call__(self, parser, namespace, value, option_string=None):
        entries = getattr(namespace, self.dest, None)
        if not entries:
            parser.error("--scalar %s: give --sample ID before its scalars" % value)
        name, sep, number = value.partition("=")
        try:
            number = float(number)
        except ValueError:
            sep = ""
        if not sep or not name:
            parser.error("--scalar %r: NAME=VALUE with a number, e.g. reward=1.0" % value)
        if name in entries[-1][1]:
            parser.error("--scalar %s: sample %r has scalar %r already" % (value, entries[-1][0],
                                                                          name))
        entries[-1][1][name] = number


def _read_annotations(path):
    """Entries of a JSON lines file ("-" = stdin): {"sample_id", "scalars"}."""
    f = sys.stdin if path == "-" else open(path, "r", encoding="utf-8")
    out = []
    try:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError as e:
                raise ValueError("%s:%d: not JSON (%s)" % (path, n, e)) from None
            if not isinstance(entry, dict) or not isinstance(entry.get("sample_id"), str) or \
                    not isinstance(entry.get("scalars"), dict) or set(entry) - {"sample_id",
                                                                               "scalars"}:
                raise ValueError("%s:%d: not {\"sample_id\": ID, \"scalars\": {NAME: VALUE}}"
                                 % (path, n))
            out.append(entry)
    finally:
        if f is not sys.stdin:
            f.close()
    return out


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
    put.add_argument("--options-json", metavar="JSON|@FILE",
                     help="the pool's PoolOptions as JSON (or @file), registered with --model-json, "
                          "e.g. {\"token_fields\": {\"loss_mask\": \"uint8\"}} "
                          "(docs/producer.md#token-field-schema)")
    put.add_argument("--required-scalar", action="append", default=[], metavar="NAME",
                     help="with --model-json: a sealed sample is selectable only once it has "
                          "scalar NAME (given with it, or later by `pool annotate`); repeatable")
    put.add_argument("--batch-bytes", type=int, default=16 << 20)
    put.add_argument("--keep-going", action="store_true",
                     help="skip lines that cannot be adapted (reported on stderr)")
    pool = sub.add_parser("pool", help="show a pool (samples, groups, versions, options), or "
                                       "list every pool")
    pool.add_argument("action", nargs="?",
                      choices=["show", "list", "register", "annotate"] + list(_cli_pools.ACTIONS),
                      default="show")
    pool.add_argument("pool_name", nargs="?", metavar="POOL", help="the pool (or --pool)")
    _connection_flags(pool, timeout=10.0, pool_required=False)
    pool.add_argument("--json", action="store_true", help="the PoolInfo message(s) as JSON")
    g = pool.add_argument_group("pool register")
    g.add_argument("--model-json", metavar="JSON|@FILE", help="the ModelSpec as JSON (or @file)")
    g.add_argument("--options-json", metavar="JSON|@FILE", help="PoolOptions as JSON (or @file)")
    g.add_argument("--required-scalar", action="append", default=[], metavar="NAME",
                   help="PoolOptions.required_scalars: selectable once annotated; repeatable")
    g = pool.add_argument_group("pool annotate (lifecycle.md section 6)")
    g.add_argument("--sample", action=_SampleAction, dest="annotations", metavar="ID",
                   help="a stored sample; the --scalar flags after it are its scalars")
    g.add_argument("--scalar", action=_ScalarAction, dest="annotations", metavar="NAME=VALUE",
                   help="a scalar of the --sample before it, e.g. reward=1.0")
    g.add_argument("--from-jsonl", metavar="FILE",
                   help="more entries, one JSON object per line: {\"sample_id\": ID, "
                        "\"scalars\": {NAME: VALUE}} ('-' = stdin)")
    _cli_pools.add_arguments(pool)
    step = sub.add_parser("step", help="create, show, plan, release and list steps "
                                       "(the controller's side)")
    step.add_argument("action", choices=["create", "show", "plan", "release", "list"])
    step.add_argument("step_id", nargs="?", help="the step (all but list)")
    _connection_flags(step, timeout=30.0, pool_required=False)
    step.add_argument("--json", action="store_true", help="the messages as JSON")
    g = step.add_argument_group("step create: what to take (exactly one)")
    g.add_argument("--num-samples", type=int, default=0)
    g.add_argument("--num-groups", type=int, default=0)
    g.add_argument("--num-tokens", type=int, default=0)
    g.add_argument("--sample-ids", default="", help="comma-separated sample ids")
    g = step.add_argument_group("step create: how (docs/lifecycle.md)")
    g.add_argument("--whole-groups", action="store_true")
    g.add_argument("--policy-version", type=int, default=0)
    g.add_argument("--max-staleness", type=int)
    g.add_argument("--selection", choices=["oldest", "newest_version"], default="oldest")
    g.add_argument("--reuse-samples", action="store_true",
                   help="release returns the samples to the free set")
    g.add_argument("--advantage", choices=["none", "grpo", "grpo-mean", "rloo"], default="none",
                   help="advantages computed per group and sent with every micro-batch "
                        "(lifecycle.md section 6)")
    g.add_argument("--advantage-scalar", default="", metavar="NAME",
                   help="the scalar the estimator reads (default reward)")
    g.add_argument("--advantage-eps", type=float, default=0.0, metavar="EPS",
                   help="GRPO's epsilon (default 1e-6)")
    g = step.add_argument_group("step plan")
    g.add_argument("--groups", action="store_true",
                   help="also every sequence's group, version, scalars and advantage, read "
                        "from the micro-batches of one rank per CP group")
    g = step.add_argument_group("step create: topology")
    for name in ("dp", "cp", "tp", "pp"):
        g.add_argument("--" + name, type=int, default=1)
    g.add_argument("--max-tokens-per-rank", type=int, default=0)
    g.add_argument("--topology-json", metavar="JSON|@FILE",
                   help="a Topology message as JSON (instead of the flags above)")
    _cli_cluster.add_parsers(sub)
    return ap


def _with_progress(samples, pool, every=5.0):
    """Passes samples through, with a line on stderr every few seconds: a
    large file takes minutes, and the summary only comes at its end."""
    start = last = time.monotonic()
    count = 0
    for s in samples:
        count += 1
        now = time.monotonic()
        if now - last >= every:
            last = now
            print("rollpack put: %d samples read and sent to pool %r in %.0f s" % (
                count, pool, now - start), file=sys.stderr, flush=True)
        yield s


def cmd_put(a):
    token = _token(a)
    spec = _model(a.model_json) if a.model_json else None
    if a.options_json and spec is None:
        raise SystemExit("rollpack put: --options-json needs --model-json (options come with "
                         "the pool's registration)")
    options = json.loads(_json_arg(a.options_json)) if a.options_json else None
    if a.required_scalar:
        if spec is None:
            raise SystemExit("rollpack put: --required-scalar needs --model-json (options come "
                             "with the pool's registration)")
        options = _with_required(options, a.required_scalar)
    p = Producer(a.server, a.pool, token=token, tls=a.tls, root_certificates=a.root_cert,
                 client_certificate=a.client_cert, client_key=a.client_key,
                 server_name=a.server_name, timeout=a.timeout, max_message_bytes=a.batch_bytes)
    bad = [] if a.keep_going else None
    with p:
        created = p.register_model(spec, options=options) if spec is not None else None
        spec = p.model()
        f = sys.stdin if a.from_jsonl == "-" else open(a.from_jsonl, "r", encoding="utf-8")
        try:
            r = p.put(_with_progress(read_samples(f, spec, errors=bad, name=a.from_jsonl),
                                     a.pool))
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


def _with_required(options, names):
    """PoolOptions as a dict with ``names`` added to its required_scalars."""
    options = dict(options or {})
    have = list(options.get("required_scalars", []))
    options["required_scalars"] = have + [n for n in names if n not in have]
    return options


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
    if o.required_scalars or info.num_unannotated_samples:
        lines.insert(-1, "  scalars       required %s; %d sealed free samples still missing one"
                     % (", ".join(o.required_scalars) or "none", info.num_unannotated_samples))
    fields = ["%s %s" % (name, _dtype_name(dtype))
              for name, dtype in sorted(info.token_field_dtypes.items())]
    fields += ["%s ragged" % name for name in getattr(info, "ragged_token_fields", [])]
    if fields:
        lines.insert(-1, "  token fields  %s" % ", ".join(fields))
    stale_membership = getattr(info, "stale_membership", "")  # stubs older than the field
    if stale_membership:
        lines.insert(1, "  STALE         %s" % stale_membership)
    for m in info.members:
        lines.append("  member %s: %d samples, %d free%s" % (
            m.member, m.num_samples, m.num_free_samples,
            " (did not answer: %s)" % m.error if m.error else ""))
    return lines


def _dtype_name(code):
    from rollpack.v1 import ndarray_pb2
    return (ndarray_pb2.DType.Name(code).lower() if code in ndarray_pb2.DType.values()
            else "dtype %d" % code)


def cmd_pool(a):
    if a.pool_name:
        if a.pool and a.pool != a.pool_name:
            print("rollpack pool %s: pool %r and --pool %r differ" % (a.action, a.pool_name,
                                                                    a.pool), file=sys.stderr)
            return 2
        a.pool = a.pool_name
    if a.action in ("register", "annotate"):
        return _pool_write(a)
    if a.action in _cli_pools.ACTIONS:
        return _cli_pools.run(a, _controller)
    if a.action == "list":
        with _controller(a) as c:
            pools = [p for p in c.pools() if not a.pool or p.pool == a.pool]
        if a.json:
            print(_json(pools))
        else:
            for info in pools:
                print("%s: model %r, %d samples (%d free, %d open), %d live steps, %d bytes, "
                      "policy version %d" % (info.pool, info.model.name, info.num_samples,
                                             info.num_free_samples, info.num_open_samples,
                                             info.num_live_steps, info.stored_bytes,
                                             info.policy_version))
        return 0
    if not a.pool:
        print("rollpack pool show: --pool is required", file=sys.stderr)
        return 2
    # One call within --timeout, never the producer's retries for minutes:
    # a member that cannot reach etcd answers at once (marked stale) or
    # UNAVAILABLE naming etcd (docs/cluster.md, "When etcd is away").
    with _controller(a) as c:
        info = c.pool(a.pool)
    if a.json:
        from google.protobuf import json_format
        print(json_format.MessageToJson(info, preserving_proto_field_name=True, indent=None))
    else:
        print("\n".join(_pool_lines(info)))
    return 0


def _pool_write(a):
    """`pool register` and `pool annotate`."""
    if not a.pool:
        print("rollpack pool %s: the pool is required (POOL or --pool)" % a.action,
              file=sys.stderr)
        return 2
    if a.action == "register":
        if not a.model_json:
            print("rollpack pool register: --model-json is required", file=sys.stderr)
            return 2
        spec = _model(a.model_json)
        options = json.loads(_json_arg(a.options_json)) if a.options_json else None
        if a.required_scalar:
            options = _with_required(options, a.required_scalar)
    else:
        entries = list(a.annotations or [])
        if a.from_jsonl:
            entries += _read_annotations(a.from_jsonl)
        if not entries:
            print("rollpack pool annotate: nothing to add: --sample ID --scalar NAME=VALUE or "
                  "--from-jsonl FILE", file=sys.stderr)
            return 2
    with Producer(a.server, a.pool, token=_token(a), tls=a.tls, root_certificates=a.root_cert,
                  client_certificate=a.client_cert, client_key=a.client_key,
                  server_name=a.server_name, timeout=a.timeout) as p:
        if a.action == "register":
            created = p.register_model(spec, options=options)
            result = {"pool": a.pool, "created": created}
            text = "pool %s: model %r %s" % (a.pool, spec.name, "registered" if created else
                                            "was registered already (unchanged)")
        else:
            n = p.annotate(entries)
            result = {"pool": a.pool, "annotated": n}
            text = "pool %s: %d annotations accepted" % (a.pool, n)
    print(json.dumps(result) if a.json else text)
    return 0


def _controller(a):
    return Controller(a.server, token=_token(a), tls=a.tls, root_certificates=a.root_cert,
                      client_certificate=a.client_cert, client_key=a.client_key,
                      server_name=a.server_name, timeout=a.timeout)


def _json(messages):
    from google.protobuf import json_format
    if isinstance(messages, list):
        return json.dumps([json_format.MessageToDict(m, preserving_proto_field_name=True)
                           for m in messages])
    return json_format.MessageToJson(messages, preserving_proto_field_name=True, indent=None)


_age = _cli_common.age
_topology = _cli_common.topology


def _step_lines(steps):
    now = time.time()
    rows = [("STEP", "POOL", "SAMPLES", "TOKENS", "MBS", "TOPOLOGY", "AGE", "STREAMS", "IDLE")]
    for s in steps:
        last = s.last_stream_unix_nanos or s.created_unix_nanos
        rows.append((s.step_id, s.pool, str(s.num_samples), str(s.num_tokens),
                     str(s.num_microbatches), _topology(s.topology),
                     _age(s.created_unix_nanos, now),
                     "%d open / %d" % (s.streams_open, s.streams_started),
                     "-" if s.streams_open else _age(last, now)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def cmd_step(a):
    if a.action != "list" and not a.step_id:
        print("rollpack step %s: the step id is required" % a.action, file=sys.stderr)
        return 2
    with _controller(a) as c:
        if a.action == "create":
            if not a.pool:
                print("rollpack step create: --pool is required", file=sys.stderr)
                return 2
            if a.topology_json:
                from google.protobuf import json_format
                from rollpack._proto import scheduler_pb2
                text = a.topology_json
                if text.startswith("@"):
                    with open(text[1:]) as f:
                        text = f.read()
                try:
                    topology = json_format.Parse(text, scheduler_pb2.Topology())
                except json_format.ParseError as e:
                    print("rollpack step create: --topology-json: %s" % e, file=sys.stderr)
                    return 2
            else:
                if a.max_tokens_per_rank <= 0:
                    print("rollpack step create: --max-tokens-per-rank (or --topology-json) is "
                          "required", file=sys.stderr)
                    return 2
                topology = {"dp": a.dp, "cp": a.cp, "tp": a.tp, "pp": a.pp,
                            "max_tokens_per_rank": a.max_tokens_per_rank}
            ids = [i for i in a.sample_ids.split(",") if i]
            info = c.create_step(a.step_id, a.pool, topology=topology, sample_ids=ids,
                                 num_samples=a.num_samples, num_groups=a.num_groups,
                                 num_tokens=a.num_tokens, whole_groups=a.whole_groups,
                                 policy_version=a.policy_version, max_staleness=a.max_staleness,
                                 selection=a.selection, reuse_samples=a.reuse_samples,
                                 advantage=a.advantage, advantage_scalar=a.advantage_scalar,
                                 advantage_eps=a.advantage_eps)
            advantage = "" if a.advantage == "none" else ", advantage %s of %s" % (
                a.advantage, a.advantage_scalar or "reward")
            print(_json(info) if a.json else
                  "step %s: %d samples (%d tokens, %d groups), %d micro-batches per rank, %s%s"
                  % (info.step_id, info.num_samples, info.num_tokens, info.num_groups,
                     info.num_microbatches, _topology(info.topology), advantage))
        elif a.action == "show":
            return _cli_steps.run_show(c, a.step_id, a.json)
        elif a.action == "list":
            steps = c.steps(a.pool)
            print(_json(steps) if a.json else "\n".join(_step_lines(steps)))
        elif a.action == "plan":
            plan = c.plan(a.step_id)
            sequences = c.sequences(a.step_id) if a.groups else None
            if a.json and sequences is not None:
                from google.protobuf import json_format
                print(json.dumps({"plan": json_format.MessageToDict(
                    plan, preserving_proto_field_name=True),
                    "sequences": [s._asdict() for s in sequences]}))
            elif a.json:
                print(_json(plan))
            else:
                st = plan.stats
                print("step %s (pool %s, %s): %d micro-batches per rank (lower bound %d), "
                      "imbalance %.3f, padding %.1f%%, planned in %.1f ms"
                      % (plan.step_id, plan.pool, _topology(plan.topology), st.num_microbatches,
                         st.min_microbatches, st.rank_imbalance, 100 * st.padding_overhead,
                         st.plan_ms))
                for i, mb in enumerate(plan.microbatches):
                    ids = [sid for g in mb.groups for sid in g.sample_ids]
                    print("  micro-batch %d: %d CP groups, %d samples" % (i, len(mb.groups),
                                                                         len(ids)))
                if sequences is not None:
                    from rollpack.step_sequences import by_group, table
                    print("groups: %d, sequences: %d" % (len(by_group(sequences)),
                                                         len(sequences)))
                    print("\n".join("  " + line for line in table(sequences)))
        else:  # release
            r = c.release(a.step_id)
            print(_json(r) if a.json else
                  "step %s released: %d samples deleted, %d returned to the free set, "
                  "%d bytes freed" % (a.step_id, r.released_samples, r.returned_samples,
                                      r.freed_bytes))
    return 0


def main(argv=None):
    parser = _parser()
    # `step create --pool p s7`: the step id may follow the options.
    a, extra = parser.parse_known_args(argv)
    if a.command == "step" and a.step_id is None and len(extra) == 1 and \
            not extra[0].startswith("-"):
        a.step_id, extra = extra[0], []
    if a.command == "pool" and a.pool_name is None and len(extra) == 1 and \
            not extra[0].startswith("-"):
        a.pool_name, extra = extra[0], []
    if extra:
        parser.error("unrecognized arguments: %s" % " ".join(extra))
    try:
        if a.command == "put":
            return cmd_put(a)
        if a.command == "pool":
            return cmd_pool(a)
        if a.command == "step":
            return cmd_step(a)
        if a.command in _cli_cluster.COMMANDS:
            return _cli_cluster.run(a, _controller(a))
    except (errors.RollpackError, errors.PayloadError, ValueError, OSError) as e:
        print("rollpack %s: %s" % (a.command, e), file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
