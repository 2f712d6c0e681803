"""Which failed calls retrying cannot fix, and what the error then says
(docs/operations.md, "Client errors"); the C++ client's
client/cpp/connect_failure.h is the same rule, and the two are kept alike.

- PERMANENT: the TLS handshake failed (certificate not signed by the CA
  given, name not in the certificate, TLS to a plaintext server), or the
  server refused the credentials (UNAUTHENTICATED, PERMISSION_DENIED). The
  call ends at once.
- UNREACHABLE: the address does not resolve, nothing listens on the port,
  or the connection closed before HTTP/2 started. A server that has not
  started yet looks the same (a sidecar started a moment after its
  producer), so a client that never reached the address waits out its
  ``connect_grace`` before ending; one that reached it in this process is
  riding out a restart and retries for its whole budget.
- RETRYABLE: everything else a retry loop retried before.

gRPC 1.51 reports the connection failures as UNAVAILABLE and tells them
apart only in the message ("Ssl handshake failed: ... certificate verify
failed", "Connection refused", "DNS resolution failed", "Socket closed"):
the texts matched here were read from a real rollpackd
(tests/test_connect_failure.py).
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import grpc

RETRYABLE, UNREACHABLE, PERMANENT = "retryable", "unreachable", "permanent"

#: Seconds a client that never reached its server keeps trying an address
#: that does not resolve or refuses connections, unless told otherwise.
DEFAULT_CONNECT_GRACE = 10.0

_RETRY_CANNOT_FIX = "; retrying cannot fix this"
_LOCAL_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.CANCELLED)

_reached_lock = threading.Lock()
_reached: set = set()


def _code(err: Any) -> Optional[grpc.StatusCode]:
    return err.code() if callable(getattr(err, "code", None)) else None


def _details(err: Any) -> str:
    d = err.details() if callable(getattr(err, "details", None)) else None
    return d or ""


def _has(err: Any, text: str) -> bool:
    return text.lower() in _details(err).lower()


def _own_connection_failed(err: Any) -> bool:
    """Whether the failure is this client's own connection attempt, which
    gRPC words "failed to connect to all addresses; last error: ..." or "DNS
    resolution failed for ...", and not a server's answer quoting one of its
    own (a member whose etcd or peer refused it says "Connection refused"
    too, and the client reached that member)."""
    details = _details(err).lower()
    return (details.startswith("failed to connect to all addresses")
            or details.startswith("dns resolution failed"))


def _tls_failed(err: Any) -> bool:
    return (_has(err, "handshake failed") or _has(err, "SSL_ERROR")
            or _has(err, "is not in peer certificate"))


def _refused(err: Any) -> bool:
    return _has(err, "Connection refused") or _has(err, "Failed to connect to remote host")


def _unresolved(err: Any) -> bool:
    return _has(err, "DNS resolution failed")


def closed_before_http2(err: Any) -> bool:
    """The connection was made and closed during the handshakes: what a
    plaintext client sees from a TLS server, and a client without the
    certificate a mutual-TLS server asks for."""
    return _has(err, "failed to connect") and _has(err, "Socket closed")


def classify(err: Any) -> str:
    """RETRYABLE, UNREACHABLE or PERMANENT for a grpc.RpcError."""
    code = _code(err)
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return PERMANENT
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN,
                grpc.StatusCode.INTERNAL):
        if not _own_connection_failed(err):
            return RETRYABLE
        if _tls_failed(err):
            return PERMANENT
        if _refused(err) or _unresolved(err) or closed_before_http2(err):
            return UNREACHABLE
    return RETRYABLE


def server_answered(err: Optional[Any]) -> bool:
    """Whether a call's outcome (None = success) came from a server."""
    return err is None or _code(err) not in _LOCAL_CODES


def note_reached(target: str) -> None:
    """Records that a server at ``target`` answered in this process."""
    with _reached_lock:
        _reached.add(target)


def was_reached(target: str) -> bool:
    with _reached_lock:
        return target in _reached


def server_speaks_tls(target: str, timeout: float = 2.0) -> bool:
    """Whether the server at ``target`` (which closed a plaintext connection
    before HTTP/2 started) speaks TLS: one handshake with the default roots;
    a certificate it cannot verify proves TLS as well as one it can."""
    channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(),
                                  options=[("rollpack.tls_probe", target)])
    try:
        channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=timeout)
        return True
    except grpc.RpcError as err:
        if _code(err) != grpc.StatusCode.UNAVAILABLE:
            return True
        return _has(err, "certificate verify failed") or _has(err, "is not in peer certificate")
    finally:
        channel.close()


def _for(waited: float) -> str:
    return " for %.1f s" % waited if waited > 0 else ""


def explain(err: Any, target: str, tls: bool, waited: float = 0.0,
            speaks_tls: bool = False) -> Optional[str]:
    """What a client giving up on ``err`` says instead of gRPC's text: the
    cause, the fix and whether retrying can fix it (gRPC's text in
    parentheses); None when there is nothing to add."""
    code = _code(err)
    cause = " (%s)" % _details(err)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return ("rollpackd at %s refused the credentials%s: pass a token its --auth-tokens file "
                "lists (token / --token)%s" % (target, cause, _RETRY_CANNOT_FIX))
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return ("rollpackd at %s denied the call%s: the token's role may not make it "
                "(docs/operations.md, \"Authentication\")%s" % (target, cause, _RETRY_CANNOT_FIX))
    if _tls_failed(err):
        if _has(err, "certificate verify failed"):
            why = ("the server's certificate is not signed by the CA this client trusts (the "
                   "one given as root_certificates / --root-cert; none given: the system's "
                   "roots): pass the CA that signed rollpackd's --tls-cert")
        elif _has(err, "is not in peer certificate"):
            why = ("the server's certificate does not name the host dialled: dial a name it "
                   "lists, or set the TLS server name (server_name / --server-name)")
        elif _has(err, "wrong version number") or _has(err, "packet length"):
            why = ("the server does not speak TLS (rollpackd without --tls-cert): connect "
                   "without TLS, or start rollpackd with --tls-cert")
        else:
            why = ("check the CA (root_certificates / --root-cert) and, for mutual TLS, the "
                   "client certificate and key")
        return "TLS handshake with %s failed%s: %s%s" % (target, cause, why, _RETRY_CANNOT_FIX)
    if closed_before_http2(err) and not tls and speaks_tls:
        return ("%s speaks TLS (rollpackd --tls-cert) and this client does not%s: connect "
                "with TLS (tls or root_certificates / --tls, --root-cert)%s"
                % (target, cause, _RETRY_CANNOT_FIX))
    if closed_before_http2(err):
        hint = (": a mutual-TLS rollpackd (--tls-client-ca) does so without a client "
                "certificate signed by that CA (client_certificate and client_key / "
                "--client-cert, --client-key)" if tls else
                ": it may expect TLS (connect with TLS: tls / --tls)")
        return ("%s closed every connection before HTTP/2 started%s%s%s, or it refuses this "
                "client (connection limits)" % (target, _for(waited), cause, hint))
    if _refused(err):
        return ("nothing accepts connections at %s (connection refused)%s%s: is rollpackd "
                "running there, and listening on that port (--listen)?%s"
                % (target, _for(waited), cause,
                   " A client waits this long (connect_grace) for a server it never reached"
                   if waited > 0 else ""))
    if _unresolved(err):
        return "the host of %s does not resolve%s%s: check the address" % (
            target, _for(waited), cause)
    return None
