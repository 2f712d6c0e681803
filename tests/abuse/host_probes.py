#!/usr/bin/python3
"""Two client hosts against one rollpackd: the per-client stream quota.

On loopback every client is 127.0.0.1, so --max-streams-per-client (keyed
by the peer's IP) cannot be told apart from a global cap there. TwoHosts
makes two network namespaces, an "attacker host" and a "trainer host", each
with a veth pair to this (root) namespace and a /30 of 10.A.0.0/16 (A picked
so that no route or address of this machine overlaps, as cli/bench/links.cc
does), and an address 10.A.0.1/32 on this namespace's lo for rollpackd to
listen on. Each namespace has one route, to 10.A.0.1 through its veth; that
address is local here, so nothing is forwarded (ip_forward is left alone)
and no packet leaves the machine. Everything is removed on exit, SIGTERM and
SIGINT included; names carry the pid (rpa<pid>a, rpa<pid>t, lo:rpa<pid>),
and those of runs no longer alive are removed at the next start.

per_client_streams loads a small step, then from the attacker host opens
many FetchMicrobatches streams on raw HTTP/2 connections that never grant
window (h2_frames, as fetch_probes.stalled_fetch) and holds them, while
the trainer host reads whole streams with a plain gRPC stub. Both clients
run as child processes of this file (`ip netns exec NS /usr/bin/python3
host_probes.py attacker|trainer ...`). Rows: before (--max-streams-per-client
0), after (the limit), loopback (the limit, both clients on 127.0.0.1).

    sudo /usr/bin/python3 tests/abuse/host_probes.py run --rollpackd build/bin/rollpackd
"""

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

FETCH = "/rollpack.v1.Trainer/FetchMicrobatches"
STEP = "hosts"
# FetchRequest{step_id: "hosts"}: rank 0, from the first micro-batch.
REQUEST = b"\x0a\x05" + STEP.encode()
RESOURCE_EXHAUSTED = 8
GRPC_CODES = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
              "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
              "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
              "UNAUTHENTICATED"]
_PROXY_VARS = ("http_proxy", "https_proxy", "grpc_proxy", "HTTP_PROXY", "HTTPS_PROXY",
               "GRPC_PROXY", "all_proxy", "ALL_PROXY")


class HostsUnavailable(Exception):
    """Not root, or the kernel refused a namespace, veth or address."""


def _tool(name):
    # Root's PATH may lack /usr/sbin (sudo, cron).
    for d in ("/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"):
        if os.access(d + name, os.X_OK):
            return d + name
    return name


IP = _tool("ip")


def _run(args, check=True):
    try:
        r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    except OSError as e:  # no iproute2
        raise HostsUnavailable("cannot run %s: %s" % (args[0], e))
    out = r.stdout.decode(errors="replace").strip()
    if check and r.returncode != 0:
        raise HostsUnavailable("`%s` exited %d: %s" % (" ".join(args), r.returncode, out))
    return r.returncode, out


def _prefixes(text):
    """Every IPv4 a.b.c.d[/n] token of `text`, as (net, length)."""
    found = []
    for token in text.split():
        addr, _, length = token.partition("/")
        parts = addr.split(".")
        if len(parts) != 4 or not all(p.isdigit() and int(p) < 256 for p in parts):
            continue
        if length and not (length.isdigit() and int(length) <= 32):
            continue
        net = 0
        for p in parts:
            net = (net << 8) | int(p)
        found.append((net, int(length) if length else 32))
    return found


def pick_octet(pid):
    """The A of a 10.A.0.0/16 no route or address of this host overlaps,
    from one that depends on the pid; None if every A in 100..254 does."""
    taken = _prefixes(_run([IP, "-4", "route", "show", "table", "all"], check=False)[1] + " " +
                      _run([IP, "-4", "addr", "show"], check=False)[1])

    def overlaps(net, length, other):
        n = min(length, other[1])
        mask = 0 if n == 0 else (0xFFFFFFFF << (32 - n)) & 0xFFFFFFFF
        return (net & mask) == (other[0] & mask)

    first = 100 + pid % 100
    for k in range(155):
        octet = 100 + (first - 100 + k) % 155
        net = (10 << 24) | (octet << 16)
        if not any(overlaps(net, 16, p) for p in taken):
            return octet
    return None


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def remove_stale():
    """Namespaces, veths and lo addresses of runs whose process is gone."""
    _, out = _run([IP, "netns", "list"], check=False)
    for line in out.splitlines():
        name = line.split(" ", 1)[0]
        if name.startswith("rpa") and name[-1:] in ("a", "t") and name[3:-1].isdigit():
            pid = int(name[3:-1])
            if pid != os.getpid() and not _alive(pid):
                print("host_probes: removing namespace %s of a run no longer alive" % name,
                      file=sys.stderr)
                _run([IP, "link", "del", name + "h"], check=False)
                _run([IP, "netns", "del", name], check=False)
    _, out = _run([IP, "-4", "-o", "addr", "show", "dev", "lo"], check=False)
    for line in out.splitlines():
        # "1: lo    inet 10.A.0.1/32 scope global lo:rpa<pid>\       valid_lft ..."
        words = line.replace("\\", " ").split()
        labels = [w for w in words if w.startswith("lo:rpa") and w[6:].isdigit()]
        if labels and "inet" in words:
            pid = int(labels[0][6:])
            if pid != os.getpid() and not _alive(pid):
                _run([IP, "addr", "del", words[words.index("inet") + 1], "dev", "lo"],
                     check=False)


class TwoHosts:
    """``with TwoHosts() as hosts``: hosts.server_ip (10.A.0.1, on lo here),
    hosts.prefix("attacker"|"trainer") (argv prefix running a command on
    that host), hosts.client_ip(name). Raises HostsUnavailable."""

    NAMES = ("attacker", "trainer")

    def __init__(self):
        self.pid = os.getpid()
        self.octet = None
        self.made = []          # what to undo, in order
        self._old_handlers = {}

    def netns(self, name):
        return "rpa%d%s" % (self.pid, name[0])

    def client_ip(self, name):
        return "10.%d.%d.2" % (self.octet, self.NAMES.index(name) + 1)

    def prefix(self, name):
        return [IP, "netns", "exec", self.netns(name)]

    @property
    def server_ip(self):
        return "10.%d.0.1" % self.octet

    def __enter__(self):
        if os.geteuid() != 0:
            raise HostsUnavailable("needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) for network "
                                   "namespaces; running as uid %d" % os.geteuid())
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            self._set_up()
        except BaseException:
            self.tear_down()
            raise
        return self

    def __exit__(self, *exc):
        self.tear_down()
        return False

    @staticmethod
    def _on_signal(signum, frame):
        # Unwinds through the finally blocks and __exit__ (teardown).
        raise KeyboardInterrupt("signal %d" % signum)

    def _set_up(self):
        remove_stale()
        self.octet = pick_octet(self.pid)
        if self.octet is None:
            raise HostsUnavailable("every 10.A.0.0/16 (A in 100..254) overlaps a route here")
        label = "lo:rpa%d" % self.pid
        _run([IP, "addr", "add", self.server_ip + "/32", "dev", "lo", "label", label])
        self.made.append([IP, "addr", "del", self.server_ip + "/32", "dev", "lo"])
        for i, name in enumerate(self.NAMES, 1):
            ns = self.netns(name)
            host_end, ns_end = ns + "h", ns + "n"
            host_ip = "10.%d.%d.1" % (self.octet, i)
            _run([IP, "netns", "add", ns])
            self.made.append([IP, "netns", "del", ns])
            _run([IP, "link", "add", host_end, "type", "veth", "peer", "name", ns_end])
            self.made.insert(len(self.made) - 1, [IP, "link", "del", host_end])
            _run([IP, "link", "set", ns_end, "netns", ns])
            _run([IP, "addr", "add", host_ip + "/30", "dev", host_end])
            _run([IP, "link", "set", host_end, "up"])
            _run([IP, "-n", ns, "addr", "add", self.client_ip(name) + "/30", "dev", ns_end])
            _run([IP, "-n", ns, "link", "set", ns_end, "up"])
            _run([IP, "-n", ns, "link", "set", "lo", "up"])
            # The one route out: to rollpackd's address, no default route.
            _run([IP, "-n", ns, "route", "add", self.server_ip + "/32", "via", host_ip])
            _run(self.prefix(name) + ["/bin/true"])  # `ip netns exec` works here too

    def tear_down(self):
        # Deleting a veth's host end deletes both ends; errors are expected
        # for what a failed set-up never made. A second signal meanwhile (a
        # double Ctrl-C, CTest's kill on a timeout) must not stop the
        # removal halfway: ignored until everything is gone.
        main = threading.current_thread() is threading.main_thread()
        restore = {}
        if main:
            for sig in (signal.SIGTERM, signal.SIGINT):
                current = signal.signal(sig, signal.SIG_IGN)
                restore[sig] = self._old_handlers.get(sig, current)
        try:
            for command in self.made:
                try:
                    _run(command, check=False)
                except BaseException:  # noqa: B902 - one failure must not keep the rest
                    continue
            self.made = []
        finally:
            for sig, handler in restore.items():
                signal.signal(sig, handler)
            self._old_handlers = {}


# --- the two clients (child processes, one per host) ---------------------

def attacker_main(args):
    """Opens args.streams streams over args.connections connections that
    never grant window; prints one JSON line once every stream has its
    response headers or its status (or --settle s passed), then holds them
    until stdin closes (at most --hold-max s) and prints a second line."""
    import h2_frames
    conns = [h2_frames.H2Connection(args.address, recv_window=65535, grant_window=False)
             for _ in range(args.connections)]
    opened = []
    try:
        for i in range(args.streams):
            conn = conns[i % len(conns)]
            sid = conn.open_grpc_stream(FETCH)
            conn.send_message(sid, REQUEST, end_stream=True)
            opened.append((conn, sid))

        def tally():
            admitted = refused = undecided = ended = 0
            codes = {}
            for conn, sid in opened:
                st = conn.stream(sid)
                if st.trailers_at is not None or st.rst_code is not None:
                    code = st.grpc_status
                    if code is None:
                        name = "RST_" + h2_frames.error_name(st.rst_code)
                    else:
                        name = GRPC_CODES[code] if code < len(GRPC_CODES) else str(code)
                    codes[name] = codes.get(name, 0) + 1
                    if st.headers_at is None and code == RESOURCE_EXHAUSTED:
                        refused += 1
                    else:
                        ended += 1
                elif st.headers_at is not None:
                    admitted += 1
                else:
                    undecided += 1
            return {"streams": len(opened), "admitted": admitted, "refused": refused,
                    "ended": ended, "undecided": undecided, "codes": codes}

        deadline = time.monotonic() + args.settle
        figures = tally()
        while figures["undecided"] and time.monotonic() < deadline:
            time.sleep(0.05)
            figures = tally()
        print(json.dumps(figures), flush=True)
        end = time.monotonic() + args.hold_max
        while time.monotonic() < end:
            ready, _, _ = select.select([sys.stdin], [], [], min(1.0, end - time.monotonic()))
            if ready and not sys.stdin.buffer.read1(4096):
                break
        print(json.dumps(tally()), flush=True)
    finally:
        for conn in conns:
            conn.close()
    return 0


def trainer_main(args):
    """args.fetches whole FetchMicrobatches streams, one after the other, on
    one channel (a trainer rank's); prints one JSON line."""
    import grpc
    channel = grpc.insecure_channel(args.address, options=[("grpc.enable_http_proxy", 0),
                                                           ("grpc.enable_retries", 0)])
    fetch = channel.unary_stream(FETCH)
    ok = 0
    codes = {}
    first_error = None
    microbatches = None
    slowest = 0.0
    try:
        grpc.channel_ready_future(channel).result(timeout=args.deadline)
        for _ in range(args.fetches):
            start = time.monotonic()
            try:
                n = sum(1 for _ in fetch(REQUEST, timeout=args.deadline))
                ok += 1
                microbatches = n if microbatches is None else min(microbatches, n)
            except grpc.RpcError as e:
                codes[e.code().name] = codes.get(e.code().name, 0) + 1
                first_error = first_error or "%s: %s" % (e.code().name, e.details())
            slowest = max(slowest, time.monotonic() - start)
    except grpc.FutureTimeoutError:
        first_error = "no connection to %s within %.0f s" % (args.address, args.deadline)
    finally:
        channel.close()
    print(json.dumps({"fetches": args.fetches, "ok": ok, "codes": codes,
                      "first_error": first_error, "microbatches": microbatches,
                      "slowest_s": round(slowest, 3)}), flush=True)
    return 0


# --- the probe -----------------------------------------------------------

def _child_env():
    env = {k: v for k, v in os.environ.items() if k not in _PROXY_VARS}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@contextlib.contextmanager
def _no_proxy():
    saved = {k: os.environ.pop(k) for k in _PROXY_VARS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _server_counts(server):
    m = server.metrics()
    return {"active": int(m.get("rollpack_active_streams", 0)),
            "refused_global": int(m.get("rollpack_streams_refused_total", 0)),
            "refused_per_client": int(m.get("rollpack_client_streams_refused_total", 0))}


def _wait_counts(server, total, timeout):
    """Until the server has admitted or refused `total` streams (its
    metrics), at most `timeout` s: the last counts."""
    deadline = time.monotonic() + timeout
    while True:
        counts = _server_counts(server)
        if (counts["active"] + counts["refused_global"] + counts["refused_per_client"] >= total
                or time.monotonic() > deadline):
            return counts
        time.sleep(0.05)


def measure(server, attacker_prefix, trainer_prefix, streams, connections, fetches,
            deadline=20.0, settle=30.0):
    """The attacker holds `streams` non-reading streams while the trainer
    makes `fetches` whole fetches. {attacker, trainer, server} figures."""
    me = os.path.abspath(__file__)
    py = "/usr/bin/python3"
    attacker = subprocess.Popen(
        attacker_prefix + [py, me, "attacker", "--address", server.address,
                           "--streams", str(streams), "--connections", str(connections),
                           "--settle", str(settle), "--hold-max", str(settle + 4 * deadline +
                                                                     fetches * deadline)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_child_env())
    try:
        line = _readline(attacker, settle + 30)
        held = json.loads(line)
        counts = _wait_counts(server, streams, settle)
        held["server"] = counts
        trainer = subprocess.run(
            trainer_prefix + [py, me, "trainer", "--address", server.address,
                              "--fetches", str(fetches), "--deadline", str(deadline)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_child_env(),
            timeout=deadline * (fetches + 2) + 30)
        if trainer.returncode != 0 or not trainer.stdout.strip():
            raise RuntimeError("trainer exited %d: %s" % (
                trainer.returncode, trainer.stderr.decode(errors="replace")[-2000:]))
        fetched = json.loads(trainer.stdout.decode().strip().splitlines()[-1])
        after = _server_counts(server)
        attacker.stdin.close()
        final = json.loads(_readline(attacker, 30))
    finally:
        if attacker.poll() is None:
            try:
                attacker.stdin.close()
            except OSError:
                pass
            try:
                attacker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                attacker.kill()
                attacker.wait()
        else:
            attacker.wait()
        attacker.stdout.close()
        attacker.stderr.close()
    return {"attacker": held, "attacker_at_end": {k: final[k] for k in ("admitted", "ended")},
            "trainer": fetched, "server_after": after}


def _readline(proc, timeout):
    """A line of the child's stdout within `timeout` s (its stderr if it died)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else b""
    if not line:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise RuntimeError("child printed nothing within %.0f s: %s"
                           % (timeout, err.decode(errors="replace")[-2000:]))
    return line.decode()


def _load(server):
    import fetch_probes
    # 8 samples x 512 tokens, 16 layers x top-4: 2 micro-batches of ~140 KB
    # at rank 0, more than a non-reading connection's 64 KiB window.
    with _no_proxy():
        return fetch_probes._load_step(server, STEP, samples=8, tokens=512, layers=16, topk=4,
                                       experts=32, max_tokens_per_rank=2048)


def per_client_streams(binary, baseline="", streams=60, connections=4, fetches=30,
                       max_concurrent=50, per_client=8, deadline=20.0, loopback=True):
    """Rows before / after (two hosts) and loopback: {label: figures}.
    Raises HostsUnavailable where namespaces cannot be made."""
    import harness
    rows = {}
    configs = [("before", baseline or binary, 0), ("after", binary, per_client)]
    with TwoHosts() as hosts:
        for label, exe, limit in configs:
            flags = ["--max-concurrent-streams", str(max_concurrent)]
            if limit or not baseline:  # an older binary may not have the flag
                flags += ["--max-streams-per-client", str(limit)]
            rows[label] = _row(harness, exe, flags, hosts.server_ip, hosts.prefix("attacker"),
                               hosts.prefix("trainer"), streams, connections, fetches, deadline,
                               "two hosts (%s, %s)" % (hosts.client_ip("attacker"),
                                                       hosts.client_ip("trainer")))
    if loopback:
        flags = ["--max-concurrent-streams", str(max_concurrent),
                 "--max-streams-per-client", str(per_client)]
        rows["loopback"] = _row(harness, binary, flags, "127.0.0.1", [], [], streams, connections,
                                fetches, deadline, "one host (127.0.0.1)")
    return rows


def _row(harness, exe, flags, host, attacker_prefix, trainer_prefix, streams, connections,
         fetches, deadline, clients):
    start = time.monotonic()
    try:
        with harness.Server(exe, flags, host=host, metrics=True) as server:
            microbatch = _load(server)
            figures = measure(server, attacker_prefix, trainer_prefix, streams, connections,
                              fetches, deadline)
            figures["server_alive"] = server.alive()
    except HostsUnavailable:
        raise
    except Exception as e:  # a probe that breaks the server is a result
        figures = {"error": "%s: %s" % (type(e).__name__, e)}
    else:
        figures["microbatch_kb"] = round(microbatch / 1024)
        a, t = figures["attacker"], figures["trainer"]
        figures["attacker_admitted"] = a["admitted"]
        figures["attacker_refused"] = a["refused"]
        figures["trainer_ok"] = "%d/%d" % (t["ok"], t["fetches"])
        figures["trainer_refused"] = t["codes"]
    figures["clients"] = clients
    figures["flags"] = flags
    figures["wall_s"] = round(time.monotonic() - start, 1)
    return figures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("attacker", help="(child) hold non-reading streams")
    a.add_argument("--address", required=True)
    a.add_argument("--streams", type=int, default=60)
    a.add_argument("--connections", type=int, default=4)
    a.add_argument("--settle", type=float, default=30.0)
    a.add_argument("--hold-max", type=float, default=600.0)
    t = sub.add_parser("trainer", help="(child) whole fetches, one after the other")
    t.add_argument("--address", required=True)
    t.add_argument("--fetches", type=int, default=30)
    t.add_argument("--deadline", type=float, default=20.0)
    r = sub.add_parser("run", help="the before / after / loopback rows, as JSON")
    r.add_argument("--rollpackd", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "bin", "rollpackd"))
    r.add_argument("--baseline", default="")
    r.add_argument("--streams", type=int, default=60)
    r.add_argument("--fetches", type=int, default=30)
    r.add_argument("--max-concurrent-streams", type=int, default=50)
    r.add_argument("--max-streams-per-client", type=int, default=8)
    args = parser.parse_args(argv)
    if args.command == "attacker":
        return attacker_main(args)
    if args.command == "trainer":
        return trainer_main(args)
    rows = per_client_streams(args.rollpackd, args.baseline, streams=args.streams,
                              fetches=args.fetches, max_concurrent=args.max_concurrent_streams,
                              per_client=args.max_streams_per_client)
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
