"""`rollpack cluster status` and `rollpack member drain|undrain` (docs/cluster.md,
"Maintenance: draining a member"; docs/operations.md, "Cluster status and
draining"): the operator's view of a fleet, in the spirit of `etcdctl
endpoint status` and `kubectl drain`. Admin token.

    rollpack cluster status [--json] --server HOST:PORT ...
    rollpack member drain HOST:PORT [--wait [--wait-timeout S]] [--json] ...
    rollpack member undrain HOST:PORT [--json] ...

`cluster status` asks one member (--server) about every member: a table of
members (live in etcd, reachable, draining, pools, samples, free samples,
bytes, live steps, answer time) and a line about etcd. A drained member's
line below the table says how much it still holds, and "safe to stop" once
it has no free sample and no live step. `member drain` makes the member
refuse new samples (UNAVAILABLE; the capture port answers 503) and steps take
its free samples first; `--wait` then polls until it holds no free sample
and no live step, printing each change. `member undrain` ends it. Exit
status: 0; 1 when the server refused (its message on stderr) or --wait timed
out; 2 on usage errors.
"""

import sys
import time

from rollpack import _cli_common

COMMANDS = ("cluster", "member")


def _flags(parser, timeout):
    """The connection flags (as the other commands take), and --json."""
    _cli_common.connection_flags(parser, timeout, token_help="an admin token (with --auth-tokens)")
    parser.add_argument("--json", action="store_true", help="the messages as JSON")


def add_parsers(sub):
    """Registers `cluster` and `member` on the CLI's subparsers."""
    cluster = sub.add_parser("cluster", help="the cluster's members, samples and etcd "
                                             "(docs/cluster.md)")
    cluster.add_argument("action", nargs="?", choices=["status"], default="status")
    _flags(cluster, timeout=30.0)
    member = sub.add_parser("member", help="drain a member before maintenance, or undrain it "
                                           "(docs/cluster.md)")
    member.add_argument("action", choices=["drain", "undrain"])
    member.add_argument("member", metavar="HOST:PORT", help="the member, as cluster status "
                                                           "lists it")
    _flags(member, timeout=30.0)
    member.add_argument("--wait", action="store_true",
                        help="drain: poll until the member holds no free sample and no live step")
    member.add_argument("--wait-timeout", type=float, default=0.0, metavar="S",
                        help="give up --wait after S seconds (exit 1); 0 = never")
    member.add_argument("--poll-interval", type=float, default=1.0, metavar="S",
                        help="seconds between --wait's status reads (default 1)")


def _json(message):
    from google.protobuf import json_format
    return json_format.MessageToJson(message, preserving_proto_field_name=True, indent=None,
                                     including_default_value_fields=True)


def _yes(flag):
    return "yes" if flag else "no"


def _answer(member):
    if not member.reachable:
        return "-"
    if member.self:
        return "self"
    return "%.1fms" % (member.answer_micros / 1000.0)


def _remaining(member):
    """What a drained member still holds, and whether it may be stopped."""
    open_samples = sum(p.num_open_samples for p in member.pools)
    held = "%d free samples, %d live steps%s" % (
        member.num_free_samples, member.num_live_steps,
        ", %d open samples" % open_samples if open_samples else "")
    if not member.reachable:
        return "member %s draining: did not answer (%s)" % (member.member, member.error)
    if member.num_free_samples == 0 and member.num_live_steps == 0:
        return "member %s drained: %s: safe to stop" % (member.member, held)
    return "member %s draining: %s left" % (member.member, held)


def status_lines(status):
    """`cluster status`'s text: the member table, etcd, drains, errors."""
    rows = [("MEMBER", "LIVE", "REACHABLE", "DRAINING", "POOLS", "SAMPLES", "FREE", "BYTES",
             "LIVE STEPS", "ANSWER")]
    for m in status.members:
        known = m.reachable
        rows.append((m.member + (" *" if m.self else ""), _yes(m.live), _yes(m.reachable),
                     _yes(m.draining), str(len(m.pools)) if known else "-",
                     str(m.num_samples) if known else "-",
                     str(m.num_free_samples) if known else "-",
                     str(m.stored_bytes) if known else "-",
                     str(m.num_live_steps) if known else "-", _answer(m)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if not status.cluster_mode:
        lines.append("single server %s (no --cluster-etcd): no etcd, nothing to drain"
                     % status.answered_by)
        return lines
    e = status.etcd
    where = ",".join(e.endpoints)
    if e.reachable:
        lines.append("etcd %s: reachable, revision %d (%.1fms); cluster %r, asked %s (*)"
                     % (where, e.revision, e.answer_micros / 1000.0, status.cluster_name,
                        status.answered_by))
    else:
        lines.append("etcd %s: UNREACHABLE: %s; cluster %r, asked %s (*)"
                     % (where, e.error, status.cluster_name, status.answered_by))
    for m in status.members:
        if m.draining:
            lines.append(_remaining(m))
        elif m.error:
            lines.append("member %s: %s" % (m.member, m.error))
        if m.reachable and m.reports_draining != m.draining:
            lines.append("member %s applies draining=%s (it reads its key again at its next "
                         "lease renewal)" % (m.member, _yes(m.reports_draining)))
    return lines


def _find(status, member):
    for m in status.members:
        if m.member == member:
            return m
    return None


def _wait(controller, member, a):
    """Polls until `member` holds no free sample and no live step; prints
    each change. 0 when empty, 1 when --wait-timeout passed."""
    deadline = time.monotonic() + a.wait_timeout if a.wait_timeout > 0 else None
    last = None
    while True:
        line = _find(controller.cluster_status(), member)
        text = _remaining(line) if line is not None else \
            "member %s is no longer listed" % member
        if text != last:
            print(text, flush=True)
            last = text
        if line is not None and line.reachable and line.num_free_samples == 0 and \
                line.num_live_steps == 0:
            return 0
        if deadline is not None and time.monotonic() >= deadline:
            print("rollpack member drain: %s still holds samples after --wait-timeout %gs "
                  "(it stays drained)" % (member, a.wait_timeout), file=sys.stderr)
            return 1
        time.sleep(max(0.05, a.poll_interval))


def run(a, controller):
    """Runs `cluster` or `member` with `controller` (closed here)."""
    with controller as c:
        if a.command == "cluster":
            status = c.cluster_status()
            print(_json(status) if a.json else "\n".join(status_lines(status)))
            return 0
        if a.action == "drain":
            r = c.drain(a.member)
        else:
            r = c.undrain(a.member)
        if a.json:
            print(_json(r))
        elif not r.draining:
            print("member %s undrained: it accepts new samples" % r.member)
        else:
            print("member %s drained: it refuses new samples; steps take its free samples "
                  "first" % r.member, flush=True)
            if not a.wait:
                print(_remaining(r.status))
        if not r.status.reachable:
            print("rollpack member %s: %s did not answer (%s); it applies the change at its "
                  "next lease renewal" % (a.action, r.member, r.status.error), file=sys.stderr)
        if a.action == "drain" and a.wait:
            return _wait(c, a.member, a)
    return 0

