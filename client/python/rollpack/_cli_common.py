"""What every `rollpack` controller command shares (docs/operations.md,
"Controller"): the connection flags, and how ages and topologies print."""

import os


def connection_flags(parser, timeout, token_help=None):
    """The server, token and TLS flags every command takes."""
    parser.add_argument("--server", default=os.environ.get("ROLLPACK_SERVER", "127.0.0.1:50051"),
                        help="rollpackd's (any member's) HOST:PORT (default $ROLLPACK_SERVER or "
                             "127.0.0.1:50051)")
    parser.add_argument("--token", default=os.environ.get("ROLLPACK_TOKEN"), help=token_help)
    parser.add_argument("--token-file")
    parser.add_argument("--tls", action="store_true")
    parser.add_argument("--root-cert")
    parser.add_argument("--client-cert")
    parser.add_argument("--client-key")
    parser.add_argument("--server-name")
    parser.add_argument("--timeout", type=float, default=timeout)


def age(unix_nanos, now):
    """How long ago `unix_nanos` was, for a table cell ("-": never)."""
    if unix_nanos <= 0:
        return "-"
    s = max(0.0, now - unix_nanos / 1e9)
    if s < 120:
        return "%.0fs" % s
    if s < 7200:
        return "%.0fm" % (s / 60)
    return "%.1fh" % (s / 3600)


def topology(t):
    return "dp%d cp%d tp%d pp%d" % (t.dp, t.cp, t.tp or 1, t.pp or 1)
