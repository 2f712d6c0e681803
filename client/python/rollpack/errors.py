"""Exceptions raised by the rollpack producer.

Every error a server call ends with is a :class:`RollpackError` subclass that
carries the gRPC status code and the server's own message (``details``), so a
refused sample reads e.g.::

    PutSamples to pool 'p' failed: INVALID_ARGUMENT: sample "s3": routed_experts ...

Data that cannot become a valid sample on the client (an engine payload whose
shape does not fit the tokens or the model) raises :class:`PayloadError`, a
``ValueError``, before anything is sent.
"""

import grpc


class RollpackError(Exception):
    """An RPC to rollpackd failed. ``code`` is a ``grpc.StatusCode`` (None
    when the failure is local), ``details`` the server's message verbatim."""

    def __init__(self, message, code=None, details="", method=""):
        super().__init__(message)
        self.code = code
        self.details = details
        self.method = method


class InvalidArgument(RollpackError, ValueError):
    """INVALID_ARGUMENT: the server refused a sample or a model spec."""


class AlreadyExists(RollpackError):
    """ALREADY_EXISTS: a different sample with the same id is stored."""


class FailedPrecondition(RollpackError):
    """FAILED_PRECONDITION: e.g. a different model for an existing pool."""


class NotFound(RollpackError):
    """NOT_FOUND: e.g. the pool has no model registered."""


class ResourceExhausted(RollpackError):
    """RESOURCE_EXHAUSTED after the retries ran out (server over its memory
    limit), or a message larger than the server accepts (not retried)."""


class Unavailable(RollpackError):
    """UNAVAILABLE after the retries ran out: the server cannot be reached."""


class DeadlineExceeded(RollpackError):
    """The call's deadline passed."""


class Unauthenticated(RollpackError):
    """UNAUTHENTICATED or PERMISSION_DENIED: check the token / TLS options."""


class PayloadError(ValueError):
    """An engine payload or a sample does not fit the tokens or the model.
    The message names the mismatch (shapes, row counts, offsets, dtypes)."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: Unauthenticated,
}


def from_rpc_error(err, what, attempts=1):
    """Turns a grpc.RpcError (sync or aio) into the matching RollpackError."""
    code = err.code() if callable(getattr(err, "code", None)) else None
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    details = details or ""
    name = code.name if code is not None else "UNKNOWN"
    msg = "%s failed: %s: %s" % (what, name, details)
    if attempts > 1:
        msg += " (after %d attempts)" % attempts
    cls = _BY_CODE.get(code, RollpackError)
    return cls(msg, code=code, details=details, method=what)
