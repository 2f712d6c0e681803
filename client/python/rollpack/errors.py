"""Exceptions raised by the rollpack producer.

Every error a server call ends with is a :class:`RollpackError` subclass that
carries the gRPC status code and the server's own message (``details``), so a
refused sample reads e.g.::

    PutSamples to pool 'p' failed: INVALID_ARGUMENT: sample "s3": routed_experts ...

Data that cannot become a valid sample on the client (an engine payload whose
shape does not fit the tokens or the model) raises :class:`PayloadError`, a
``ValueError``, before anything is sent.
"""

from __future__ import annotations

from typing import Optional

import grpc


class RollpackError(Exception):
    """An RPC to rollpackd failed. ``code`` is a ``grpc.StatusCode`` (None
    when the failure is local), ``details`` the server's message verbatim.

    ``resume_from`` (None unless a trainer stream's error): the micro-batch a
    ``TrainerClient`` whose stream ended with this error resumes from, the
    first one it did not hand out; pass it as ``start_index`` to a new
    client of the same rank (same bytes). The message says it too
    (``...; resume from micro-batch 7``)."""

    code: Optional[grpc.StatusCode]
    details: str
    method: str
    resume_from: Optional[int]

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None, details: str = "",
                 method: str = "", resume_from: Optional[int] = None) -> None:
        super().__init__(message)
        self.code = code
        self.details = details
        self.method = method
        self.resume_from = resume_from


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
    """UNAVAILABLE after the retries ran out: the server cannot be reached
    (a TrainerClient: for ``resume_timeout`` seconds; see ``resume_from``)."""


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


def from_rpc_error(err: BaseException, what: str, attempts: int = 1,
                   explained: Optional[str] = None) -> RollpackError:
    """Turns a grpc.RpcError (sync or aio) into the matching RollpackError.
    ``explained``: said instead of gRPC's text (rollpack.connect_failure:
    the cause and the fix of a call retrying cannot fix); ``details`` stays
    gRPC's."""
    code = err.code() if callable(getattr(err, "code", None)) else None
    details = err.details() if callable(getattr(err, "details", None)) else str(err)
    details = details or ""
    name = code.name if code is not None else "UNKNOWN"
    msg = "%s failed: %s: %s" % (what, name, explained or details)
    if attempts > 1:
        msg += " (after %d attempts)" % attempts
    cls = _BY_CODE.get(code, RollpackError)
    return cls(msg, code=code, details=details, method=what)
