#!/usr/bin/python3
"""Attacks on rollpackd's HTTP/2 transport, made with the raw client of
h2_frames (a stock gRPC client will not make them).

rapid_reset: the CVE-2023-44487 pattern, HEADERS + RST_STREAM(CANCEL) in a
tight loop on a few connections, without credentials;
stalled_put: PutSamples streams that declare a large message, send what flow
control lets through, then stall forever.

Each takes a started harness.Server and returns a dict of JSON-serialisable
figures (sizes in MB of 2**20 bytes, times in seconds). Every socket and
thread started here is closed and joined before the probe returns.

Manual use (arguments after `--` go to rollpackd):

    /usr/bin/python3 tests/abuse/transport_probes.py --rollpackd build/bin/rollpackd \\
        rapid_reset --seconds 5 -- --transport-memory 0
"""

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import h2_frames  # noqa: E402
import harness  # noqa: E402

GET_POOL = "/rollpack.v1.Rollouts/GetPool"
PUT_SAMPLES = "/rollpack.v1.Rollouts/PutSamples"


def _attacker_tls(server):
    """None for a plaintext server; else TLS that trusts the server's CA and
    offers no client certificate."""
    if not server.certs:
        return None
    import ssl
    context = ssl.create_default_context(cafile=server.certs["ca.crt"])
    context.set_alpn_protocols(["h2"])
    return context


def _ended(server, figures, measure_sigterm):
    """figures with server_alive and, when asked, sigterm_seconds (None: not
    stopped within 60 s, then killed)."""
    figures["server_alive"] = server.alive()
    if measure_sigterm and server.alive():
        took = server.terminate_seconds()
        figures["sigterm_seconds"] = None if took is None else round(took, 2)
    return figures


def _mb(n):
    return None if n is None else round(n / float(1 << 20), 1)


def _rss(server):
    """RSS now, or None once the process is gone."""
    try:
        return server.rss()
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None


def _default_rss_limit():
    """60% of the machine's memory: a flood stops there rather than take the
    host down (the figure then says so)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 * 6 // 10
    except OSError:
        pass
    return 16 << 30


def _auth_headers(token):
    return [("authorization", "Bearer " + token)] if token else []


def _normal_token(server, token, normal_token):
    """The NormalClient's token: `normal_token`, else the attack's `token`,
    else (a server with --auth-tokens) the harness's trainer token, so the
    normal client is a legitimate one even when the attacker has none."""
    if normal_token is not None:
        return normal_token or None
    if token:
        return token
    return harness.TRAINER_TOKEN if "--auth-tokens" in server.args else None


def _close_all(conns):
    for conn in conns:
        try:
            conn.close()
        except Exception:  # closing must go on for the others
            pass


def rapid_reset(server, seconds=10, connections=4, token=None, settle_seconds=20,
                measure_sigterm=True, batch=100, path=GET_POOL, close_after_flood=False,
                rss_limit=None, max_streams=None, normal_token=None, source=None,
                reconnect=False):
    """`connections` connections each send, for `seconds`, batches of `batch`
    (HEADERS for a new `path` stream, no END_STREAM, then RST_STREAM(CANCEL)),
    one write per batch, with `token` if given. A NormalClient (with
    `normal_token`; by default `token`, or on a server with --auth-tokens the
    trainer token) calls GetPool during the flood and during the
    `settle_seconds` after it (the flood's connections stay open then, unless
    `close_after_flood`, so a late GOAWAY is seen). Last, with
    `measure_sigterm`, SIGTERM: the seconds the process took to exit (this
    ends the server). The flood stops early if the server's RSS passes
    `rss_limit` bytes (default 60% of the host's memory), and with
    `max_streams` once that many streams were sent in all (split evenly over
    the connections): a fixed count compares servers whose read rate differs
    (on a loaded host the rate varies by 2x from run to run). `source` is
    the attacker's own address (e.g. "127.0.0.2": another host to a server
    that keys its budgets on the client's IP, as the HTTP/2 guard does),
    the normal client keeps 127.0.0.1. With `reconnect`, a connection the
    server closes is replaced by a new one until the flood's time is up, as
    a determined attacker would (reconnects and refused_reconnects count
    them; a connection the server closes before its SETTINGS is refused).

    Returns: streams_opened, streams_reset (written to the socket; the server
    may read the last of them after the flood), streams_per_s, flood_s,
    stopped_by (per connection: "time", "max_streams", "rss_limit",
    "closed", "timeout" (a write was still blocked at the end: the server had
    stopped reading), or an error), last_write_s (per connection, when its
    last batch was fully written: well before `seconds`, the server stopped
    reading it), rss_start_mb, peak_rss_flood_mb, rss_end_mb (at the end of
    the flood), rss_settled_mb (`settle_seconds` later), peak_rss_mb (flood
    and settle), rss_timeline ([[s since the flood started, MB]] each
    second), goaways ([{conn, t, error, last_stream_id, debug}]),
    rst_received ({code: n}), connections_closed_by_server, server_settings
    (the first connection's SETTINGS from the server, e.g.
    MAX_CONCURRENT_STREAMS), normal_client_during, normal_client_after
    (harness.NormalClient summaries), server_alive, sigterm_seconds (None:
    not within 60 s, then killed; absent without measure_sigterm)."""
    rss_limit = _default_rss_limit() if rss_limit is None else rss_limit
    normal_token = _normal_token(server, token, normal_token)
    extra = _auth_headers(token)
    figures = {"connections": connections, "seconds": seconds, "batch": batch,
               "max_streams": max_streams, "source": source}
    rss_start = _rss(server)
    conns = []
    threads = []
    stopped_by = [None] * connections
    last_write = [None] * connections
    stop = threading.Event()
    timeline = []
    try:
        for _ in range(connections):
            # Against a mutual-TLS server the attacker speaks TLS, trusting the
            # server, but has no client certificate.
            try:
                conns.append(h2_frames.H2Connection(server.address, tls=_attacker_tls(server),
                                                    source=source))
            except (OSError, h2_frames.ConnectionClosed, h2_frames.H2Error, TimeoutError) as e:
                figures.setdefault("connect_refused", []).append("%s: %s" % (type(e).__name__, e))

        per_conn = None if max_streams is None else -(-max_streams // connections)

        reconnects = [0] * connections
        refused_reconnects = [0] * connections

        def replacement(i):
            """A new connection for flood i, or None when the server refused it."""
            reconnects[i] += 1
            try:
                c = h2_frames.H2Connection(server.address, tls=_attacker_tls(server),
                                           source=source, wait_settings=1.0)
            except (OSError, h2_frames.ConnectionClosed, h2_frames.H2Error, TimeoutError):
                refused_reconnects[i] += 1
                return None
            if c.closed or not c.settings_received.is_set():
                refused_reconnects[i] += 1
                c.close()
                return None
            conns.append(c)
            return c

        def flood(i, conn, deadline):
            try:
                while not stop.is_set():
                    if conn is None and not reconnect:
                        stopped_by[i] = "connect_refused"
                        return
                    if reconnect and (conn is None or conn.closed):
                        if time.monotonic() >= deadline:
                            stopped_by[i] = "time"
                            return
                        conn = replacement(i)
                        if conn is None:
                            time.sleep(0.01)
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        stopped_by[i] = "time"
                        return
                    if per_conn is not None and conn.streams_opened >= per_conn:
                        stopped_by[i] = "max_streams"
                        return
                    if server.peak > rss_limit:
                        stopped_by[i] = "rss_limit"
                        return
                    if conn.closed and not reconnect:
                        stopped_by[i] = "closed"
                        return
                    try:
                        conn.send_rapid_reset_batch(batch, path, extra, timeout=remaining)
                    except h2_frames.ConnectionClosed:
                        if not reconnect:
                            raise
                        conn.closed = True
                        continue
                    last_write[i] = time.monotonic()
                stopped_by[i] = "stopped"
            except h2_frames.ConnectionClosed:
                stopped_by[i] = "closed"
            except TimeoutError:
                stopped_by[i] = "timeout"
            except Exception as e:  # reported, not raised: the figures still count
                stopped_by[i] = "%s: %s" % (type(e).__name__, e)

        server.reset_peak()
        start = time.monotonic()
        with harness.NormalClient(server.address, token=normal_token, certs=server.certs) as during:
            deadline = start + seconds
            first = list(conns) + [None] * (connections - len(conns))
            threads = [threading.Thread(target=flood, args=(i, c, deadline), daemon=True)
                       for i, c in enumerate(first)]
            for t in threads:
                t.start()
            next_sample = start
            while any(t.is_alive() for t in threads):
                now = time.monotonic()
                if now >= next_sample:
                    timeline.append([round(now - start, 1), _mb(_rss(server))])
                    next_sample += 1.0
                time.sleep(0.05)
            for t in threads:
                t.join()
            flood_s = time.monotonic() - start
        figures["normal_client_during"] = during.summary()
        figures["peak_rss_flood_mb"] = _mb(server.peak)
        rss_end = _rss(server)
        figures["rss_end_mb"] = _mb(rss_end)
        opened = sum(c.streams_opened for c in conns)
        figures.update(reconnects=sum(reconnects), refused_reconnects=sum(refused_reconnects))
        figures.update(streams_opened=opened, streams_reset=sum(c.streams_reset for c in conns),
                       flood_s=round(flood_s, 2), streams_per_s=int(opened / max(flood_s, 1e-3)),
                       stopped_by=stopped_by,
                       last_write_s=[None if t is None else round(t - start, 2)
                                     for t in last_write])

        if close_after_flood:
            _close_all(conns)
        settle_end = time.monotonic() + settle_seconds
        with harness.NormalClient(server.address, token=normal_token, certs=server.certs) as after:
            while time.monotonic() < settle_end and server.alive():
                timeline.append([round(time.monotonic() - start, 1), _mb(_rss(server))])
                if server.peak > rss_limit:
                    figures["settle_stopped_by"] = "rss_limit"
                    break
                time.sleep(min(1.0, max(0.0, settle_end - time.monotonic())))
        figures["normal_client_after"] = after.summary()
        figures["rss_settled_mb"] = _mb(_rss(server))
        figures["peak_rss_mb"] = _mb(server.peak)
        figures["rss_start_mb"] = _mb(rss_start)
        figures["rss_timeline"] = timeline
        goaways, rst, closed = [], {}, 0
        for i, c in enumerate(conns):
            for g in c.goaways:
                goaways.append(dict(g, conn=i))
            for code, n in c.rst_received.items():
                rst[code] = rst.get(code, 0) + n
            closed += bool(c.closed_by_peer)
        figures.update(goaways=goaways, rst_received=rst, connections_closed_by_server=closed,
                       server_settings=dict(conns[0].peer_settings) if conns else {})
    finally:
        stop.set()
        _close_all(conns)  # unblocks a flood thread stuck in a write
        for t in threads:
            t.join()
    return _ended(server, figures, measure_sigterm)


def stalled_put(server, streams=4, declared_bytes=400 << 20, send_bytes=300 << 20,
                hold_seconds=30, token=None, stall_seconds=3.0, sample_every=2.0,
                send_limit_seconds=120.0, path=PUT_SAMPLES, measure_sigterm=False,
                normal_token=None):
    """`streams` PutSamples streams, each on its own connection, each sending
    a message prefix declaring `declared_bytes` and then zeros for as long as
    flow control lets them through, up to `send_bytes` (a stream stops once
    the server granted no window for `stall_seconds`, or after
    `send_limit_seconds`); then nothing more, for `hold_seconds` after the
    last sender stopped: the message never completes and no END_STREAM is
    sent. A NormalClient calls GetPool all along (with `normal_token`; by
    default `token`, or on a server with --auth-tokens the trainer token).

    Returns: accepted_mb (body bytes the server let through, all streams),
    peak_rss_mb, rss_start_mb, rss_end_mb, timeline ([{t, rss_mb, sent_mb,
    reset, answered, goaways}] every `sample_every` s, from the first byte
    sent), send_s (when the last sender stopped), streams_detail (per
    stream: sent_mb, stop_reason ("stalled", "done" (send_bytes reached),
    "reset", "answered" (the server sent trailers), "closed", "timeout"),
    rst and rst_s (the server's RST_STREAM code and when), trailers_s,
    grpc_status, grpc_message, goaways, closed_by_server, closed_s), resets
    ({RST_STREAM code: streams}), answered ({grpc-status: streams}),
    goaways ({error: connections}), normal_client_during, server_alive,
    sigterm_seconds (with measure_sigterm: this ends the server)."""
    extra = _auth_headers(token)
    normal_token = _normal_token(server, token, normal_token)
    figures = {"streams": streams, "declared_mb": _mb(declared_bytes),
               "send_mb": _mb(send_bytes)}
    figures["rss_start_mb"] = _mb(_rss(server))
    conns, sids, threads = [], [], []
    stop = threading.Event()
    stopped_at = [None] * streams
    errors = [None] * streams
    timeline = []
    try:
        server.reset_peak()
        start = time.monotonic()
        for _ in range(streams):
            conn = h2_frames.H2Connection(server.address)
            conns.append(conn)
            sids.append(conn.open_grpc_stream(path, extra_headers=extra))

        def sender(i):
            conn, sid = conns[i], sids[i]
            try:
                conn.send_message_prefix(sid, declared_bytes, timeout=30.0)
                conn.send_data(sid, send_bytes, stall_timeout=stall_seconds,
                               timeout=send_limit_seconds, stop=stop)
            except Exception as e:  # reported with the stream (unless it was refused)
                if conn.stream(sid).stop_reason not in ("reset", "answered", "closed"):
                    errors[i] = "%s: %s" % (type(e).__name__, e)
            stopped_at[i] = time.monotonic()

        with harness.NormalClient(server.address, token=normal_token, certs=server.certs) as during:
            threads = [threading.Thread(target=sender, args=(i,), daemon=True)
                       for i in range(streams)]
            for t in threads:
                t.start()
            hold_end = None
            next_sample = start
            while True:
                now = time.monotonic()
                if hold_end is None and not any(t.is_alive() for t in threads):
                    hold_end = max(s for s in stopped_at) + hold_seconds
                    figures["send_s"] = round(max(stopped_at) - start, 2)
                if now >= next_sample:
                    sts = [c.stream(s) for c, s in zip(conns, sids)]
                    timeline.append({
                        "t": round(now - start, 1), "rss_mb": _mb(_rss(server)),
                        "sent_mb": _mb(sum(max(0, st.sent_bytes - 5) for st in sts)),
                        "reset": sum(st.rst_code is not None for st in sts),
                        "answered": sum(st.trailers_at is not None for st in sts),
                        "goaways": sum(len(c.goaways) for c in conns)})
                    next_sample += sample_every
                if hold_end is not None and now >= hold_end:
                    break
                if not server.alive():
                    figures["server_died_s"] = round(now - start, 1)
                    break
                time.sleep(min(0.05, max(0.0, next_sample - time.monotonic())))
            stop.set()
            for t in threads:
                t.join()
        figures["normal_client_during"] = during.summary()
        figures["peak_rss_mb"] = _mb(server.peak)
        figures["rss_end_mb"] = _mb(_rss(server))
        figures["timeline"] = timeline
        detail, resets, answered, goaways = [], {}, {}, {}
        accepted = 0
        for i, (c, sid) in enumerate(zip(conns, sids)):
            st = c.stream(sid)
            s = st.summary(t0=start)
            body = max(0, st.sent_bytes - 5)
            accepted += body
            if st.stop_reason == "done" and st.trailers_at is not None:
                s["stop_reason"] = "answered"
            d = {"sent_mb": _mb(body), "stop_reason": s["stop_reason"], "rst": s["rst"],
                 "rst_s": s["rst_s"], "trailers_s": s["trailers_s"],
                 "grpc_status": s["grpc_status"], "grpc_message": s["grpc_message"],
                 "goaways": [g["error"] for g in c.goaways],
                 "closed_by_server": c.closed_by_peer,
                 "closed_s": None if c.closed_at is None else round(c.closed_at - start, 2)}
            if errors[i]:
                d["error"] = errors[i]
            detail.append(d)
            if s["rst"]:
                resets[s["rst"]] = resets.get(s["rst"], 0) + 1
            if s["grpc_status"] is not None:
                key = str(s["grpc_status"])
                answered[key] = answered.get(key, 0) + 1
            for g in c.goaways:
                goaways[g["error"]] = goaways.get(g["error"], 0) + 1
        figures.update(accepted_mb=_mb(accepted), streams_detail=detail, resets=resets,
                       answered=answered, goaways=goaways)
    finally:
        stop.set()
        _close_all(conns)
        for t in threads:
            t.join()
    return _ended(server, figures, measure_sigterm)


def _token(value):
    roles = {"producer": harness.PRODUCER_TOKEN, "trainer": harness.TRAINER_TOKEN,
             "admin": harness.ADMIN_TOKEN}
    return roles.get(value, value)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    server_args = []
    if "--" in argv:
        cut = argv.index("--")
        argv, server_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollpackd", required=True, help="the rollpackd binary to attack")
    parser.add_argument("--auth", action="store_true",
                        help="start it with --auth-tokens (harness tokens)")
    parser.add_argument("--token", help="send this token (producer, trainer, admin, or literal)")
    parser.add_argument("--json", help="also write the figures here")
    sub = parser.add_subparsers(dest="probe", required=True)
    rr = sub.add_parser("rapid_reset")
    rr.add_argument("--seconds", type=float, default=10)
    rr.add_argument("--connections", type=int, default=4)
    rr.add_argument("--settle-seconds", type=float, default=20)
    rr.add_argument("--batch", type=int, default=100)
    rr.add_argument("--path", default=GET_POOL)
    rr.add_argument("--close-after-flood", action="store_true")
    rr.add_argument("--no-sigterm", action="store_true")
    rr.add_argument("--rss-limit-mb", type=int)
    rr.add_argument("--max-streams", type=int)
    rr.add_argument("--source", help="the attacker's source address, e.g. 127.0.0.2")
    rr.add_argument("--reconnect", action="store_true")
    sp = sub.add_parser("stalled_put")
    sp.add_argument("--streams", type=int, default=4)
    sp.add_argument("--declared-mb", type=int, default=400)
    sp.add_argument("--send-mb", type=int, default=300)
    sp.add_argument("--hold-seconds", type=float, default=30)
    sp.add_argument("--stall-seconds", type=float, default=3)
    sp.add_argument("--sample-every", type=float, default=2)
    sp.add_argument("--sigterm", action="store_true")
    args = parser.parse_args(argv)
    token = _token(args.token) if args.token else None
    with harness.Server(args.rollpackd, server_args, auth=args.auth) as server:
        if args.probe == "rapid_reset":
            figures = rapid_reset(
                server, seconds=args.seconds, connections=args.connections, token=token,
                settle_seconds=args.settle_seconds, measure_sigterm=not args.no_sigterm,
                batch=args.batch, path=args.path, close_after_flood=args.close_after_flood,
                rss_limit=None if args.rss_limit_mb is None else args.rss_limit_mb << 20,
                max_streams=args.max_streams, source=args.source, reconnect=args.reconnect)
        else:
            figures = stalled_put(
                server, streams=args.streams, declared_bytes=args.declared_mb << 20,
                send_bytes=args.send_mb << 20, hold_seconds=args.hold_seconds, token=token,
                stall_seconds=args.stall_seconds, sample_every=args.sample_every,
                measure_sigterm=args.sigterm)
        figures["flags"] = server_args
        try:
            figures["server_log_tail"] = server.output().strip().splitlines()[-5:]
        except (OSError, ValueError):
            pass
    text = json.dumps(figures, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
