"""`rollpack pool delete` and `rollpack pool samples` (docs/operations.md,
"Deleting a pool" and "A pool's samples"): the whole-pool commands of the
controller CLI, registered by __main__."""

import json
import sys

from rollpack._proto import rollouts_pb2

#: The `pool` actions this module runs.
ACTIONS = ("delete", "samples")

_STATES = {rollouts_pb2.SAMPLE_STATE_FREE: "free", rollouts_pb2.SAMPLE_STATE_HELD: "held",
           rollouts_pb2.SAMPLE_STATE_STALE: "stale", rollouts_pb2.SAMPLE_STATE_OPEN: "open"}


def add_arguments(pool_parser):
    """The flags of both actions, on the `pool` subcommand's parser."""
    g = pool_parser.add_argument_group("pool delete")
    g.add_argument("--force", action="store_true",
                   help="release the pool's live steps first (their trainers' streams fail)")
    g.add_argument("--yes", action="store_true",
                   help="delete without asking (needed when stdin is not a terminal)")
    g = pool_parser.add_argument_group("pool samples")
    g.add_argument("--state", choices=["free", "held", "stale", "open"], default="",
                   help="only samples in this state")
    g.add_argument("--group", default="", metavar="G", help="only samples of group G")
    g.add_argument("--limit", type=int, default=0, metavar="N",
                   help="at most N samples (default: all)")


def run(a, controller):
    """Runs `pool delete` or `pool samples`; `controller(a)` opens the
    Controller. The exit status."""
    if not a.pool:
        print("rollpack pool %s: the pool is required (POOL or --pool)" % a.action,
              file=sys.stderr)
        return 2
    if a.action == "delete":
        return _delete(a, controller)
    return _samples(a, controller)


def _size(n):
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if unit == "bytes" else ("%.1f %s" % (n, unit))
        n /= 1024.0


def _what(r):
    members = [m.member for m in r.members if not m.absent]
    text = "%d samples, %s" % (r.deleted_samples, _size(r.deleted_bytes))
    if r.members:
        text += " on %d of %d members%s" % (len(members), len(r.members),
                                            (" (%s)" % ", ".join(members)) if members else "")
    return text


def _delete(a, controller):
    with controller(a) as c:
        if not a.yes:
            if not sys.stdin.isatty():
                print("rollpack pool delete: stdin is not a terminal; pass --yes to delete "
                      "pool %r" % a.pool, file=sys.stderr)
                return 2
            # What the deletion would do, refused as it would be (live steps).
            preview = c.delete_pool(a.pool, force=a.force, dry_run=True)
            steps = (", releasing steps %s" % ", ".join(preview.released_steps)
                     if preview.released_steps else "")
            answer = input("delete pool %s: %s%s? [y/N] " % (a.pool, _what(preview), steps))
            if answer.strip().lower() not in ("y", "yes"):
                print("pool %s not deleted" % a.pool)
                return 1
        r = c.delete_pool(a.pool, force=a.force)
    if a.json:
        from google.protobuf import json_format
        print(json_format.MessageToJson(r, preserving_proto_field_name=True, indent=None))
        return 0
    print("pool %s deleted: %s" % (a.pool, _what(r)))
    if r.released_steps:
        print("steps released first: %s" % ", ".join(r.released_steps))
    return 0


def _samples(a, controller):
    if a.limit < 0:
        print("rollpack pool samples: --limit must be >= 0", file=sys.stderr)
        return 2
    rows = []
    with controller(a) as c:
        page = min(a.limit, 1000) if a.limit else 1000
        for info in c.samples(a.pool, state=a.state, group_id=a.group, page_size=page):
            rows.append(info)
            if a.limit and len(rows) >= a.limit:
                break
    if a.json:
        from google.protobuf import json_format
        print(json.dumps([json_format.MessageToDict(s, preserving_proto_field_name=True)
                          for s in rows]))
        return 0
    table = [("SAMPLE", "TOKENS", "GROUP", "VERSION", "STATE", "SCALARS", "OWNER")]
    for s in rows:
        state = _STATES.get(s.state, "?")
        if s.step_id:
            state += " (%s)" % s.step_id
        if s.missing_scalar:
            state += ", no %s" % s.missing_scalar
        scalars = ",".join("%s=%g" % kv for kv in sorted(s.scalars.items())) or "-"
        table.append((s.sample_id, str(s.num_tokens),
                      ("%s/%d" % (s.group_id, s.group_size)) if s.group_id else "-",
                      str(s.policy_version), state, scalars, s.member or "-"))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        print("  ".join(col.ljust(w) for col, w in zip(r, widths)).rstrip())
    return 0
