"""Attacks made of whole gRPC messages, sent by a stock gRPC client.

oversized_unauthenticated: calls without a token whose request is as large
as --max-message-bytes allows (the server must not buffer them all);
compressed_bomb: one small gzip request that inflates to far more than the
server's message limit.
"""

import threading
import time

import grpc

import harness


def _call_all(address, method, payload, count, metadata=None, compression=None, deadline=120.0):
    """`count` concurrent unary calls of `payload` bytes, each on its own
    channel: [(status code name, seconds, details)]."""
    results = [None] * count

    def one(i):
        channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1)])
        try:
            stub = channel.unary_unary(method)
            start = time.monotonic()
            try:
                stub(payload, metadata=metadata, timeout=deadline, compression=compression)
                results[i] = ("OK", time.monotonic() - start, "")
            except grpc.RpcError as e:
                results[i] = (e.code().name, time.monotonic() - start, (e.details() or "")[:120])
        finally:
            channel.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _string_field_1(value):
    """A protobuf message whose field 1 (a string) holds `value`."""
    varint = bytearray()
    length = len(value)
    while True:
        byte = length & 0x7F
        length >>= 7
        varint.append(byte | (0x80 if length else 0))
        if not length:
            break
    return b"\x0a" + bytes(varint) + value


def _codes(results):
    codes = {}
    for code, _, _ in results:
        codes[code] = codes.get(code, 0) + 1
    return codes


def oversized_unauthenticated(server, calls=8, request_bytes=530 << 20, token=None):
    """`calls` concurrent GetPool calls without a token (or with `token`),
    each carrying `request_bytes`. The server runs with --auth-tokens and a
    --max-message-bytes above request_bytes."""
    # A GetPoolRequest whose pool field holds the bytes: valid protobuf, so
    # only the token (or a limit) refuses it.
    payload = _string_field_1(b"p" * (request_bytes - 8))
    metadata = [("authorization", "Bearer " + token)] if token else None
    server.reset_peak()
    before = server.rss()
    with harness.NormalClient(server.address, token=harness.PRODUCER_TOKEN) as normal:
        results = _call_all(server.address, "/rollpack.v1.Rollouts/GetPool", payload, calls,
                            metadata=metadata)
        time.sleep(1.0)
    after_ok, after_s, after_error = normal.call_once()
    return {
        "calls": calls,
        "request_mb": round(request_bytes / 2**20, 1),
        "codes": _codes(results),
        "slowest_refusal_s": round(max(r[1] for r in results), 2),
        "rss_before_mb": round(before / 2**20),
        "peak_rss_mb": round(server.peak / 2**20),
        "server_alive": server.alive(),
        "normal_client_during": normal.summary(),
        "normal_client_after": {"ok": after_ok, "seconds": round(after_s, 3), "error": after_error},
    }


def compressed_bomb(server, inflated_bytes=1250 << 20):
    """One GetPool request of `inflated_bytes` zeros sent gzip-compressed
    (about 1/1000 of that on the wire)."""
    payload = b"\x00" * inflated_bytes
    server.reset_peak()
    before = server.rss()
    results = _call_all(server.address, "/rollpack.v1.Rollouts/GetPool", payload, 1,
                        compression=grpc.Compression.Gzip)
    del payload
    time.sleep(1.0)
    after_ok, after_s, after_error = harness.NormalClient(server.address).call_once()
    code, seconds, details = results[0]
    return {
        "inflated_mb": round(inflated_bytes / 2**20),
        "code": code,
        "details": details,
        "seconds": round(seconds, 2),
        "rss_before_mb": round(before / 2**20),
        "peak_rss_mb": round(server.peak / 2**20),
        "server_alive": server.alive(),
        "normal_client_after": {"ok": after_ok, "seconds": round(after_s, 3), "error": after_error},
    }


def long_names(server, name_bytes=10 << 20):
    """GetPool and RegisterModel naming a pool of `name_bytes` bytes: the
    codes, and how many bytes of the name came back in the status."""
    field1 = _string_field_1(b"n" * name_bytes)  # pool: field 1 of both requests
    out = {"name_mb": round(name_bytes / 2**20, 1)}
    channel = grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", -1),
                                                             ("grpc.max_metadata_size", 64 << 20)])
    try:
        for method in ("/rollpack.v1.Rollouts/GetPool", "/rollpack.v1.Rollouts/RegisterModel"):
            try:
                channel.unary_unary(method)(field1, timeout=30)
                out[method.rsplit("/", 1)[1]] = {"code": "OK", "details_bytes": 0}
            except grpc.RpcError as e:
                out[method.rsplit("/", 1)[1]] = {"code": e.code().name,
                                                 "details_bytes": len(e.details() or "")}
    finally:
        channel.close()
    out["server_alive"] = server.alive()
    return out
