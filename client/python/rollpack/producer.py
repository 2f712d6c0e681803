"""Producer: pushes samples to a rollpackd pool (Rollouts service).

    import rollpack
    from rollpack import adapters

    spec = rollpack.ModelSpec("Qwen3-30B-A3B", num_layers=48, num_experts=128, topk=8)
    with rollpack.Producer("127.0.0.1:50051", pool="grpo") as p:
        p.register_model(spec)
        p.put(rollpack.Sample(f"r{i}", toks, *adapters.from_vllm_choice(ch, toks, spec))
              for i, (toks, ch) in enumerate(rollouts))

``put`` streams samples over one PutSamples client stream, packed into
request messages of at most ``max_message_bytes`` (each validated and
committed all or nothing by the server). The messages of a stream are kept
until the server answers, so a stream is closed and a new one opened after
``max_unacked_bytes``: that bounds the client's memory whatever the size of
the iterable, and lets a failed stream be re-sent whole (identical re-sends
of stored samples are idempotent successes on the server).

RESOURCE_EXHAUSTED (the server is over its memory limit: trainers have not
released steps yet) and UNAVAILABLE are retried with exponential backoff and
jitter for up to ``retry_for`` seconds (10 minutes by default: an RL step can
keep the server full for minutes; None = for ever), logging a warning on the
"rollpack" logger every ``warn_every`` seconds meanwhile. A sample that can
never fit (larger than the server's memory limit) is FAILED_PRECONDITION, not
retried. Every other error raises the matching :mod:`rollpack.errors` class
carrying the server's message.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
from typing import (Any, AsyncIterable, Dict, Iterable, Mapping, Optional, Sequence,
                    Tuple, Union)

import grpc
from numpy.typing import ArrayLike

from rollpack import connect_failure, errors
from rollpack._feed import Feed
from rollpack._proto import rollouts_pb2, rollouts_pb2_grpc
from rollpack.annotations import AnnotationsLike, annotate_request
from rollpack.pool_options import pool_options
from rollpack.sample import Sample
from rollpack.spec import ModelSpec

#: A PEM file's path, or its contents.
PemSource = Union[str, bytes, os.PathLike]
#: What ``register_model`` takes: a ModelSpec or a dict of its fields.
SpecLike = Union[ModelSpec, Mapping[str, Any]]
#: Pool lifecycle options: a dict of PoolOptions fields or the message.
PoolOptionsLike = Union[Mapping[str, Any], rollouts_pb2.PoolOptions]

_log = logging.getLogger("rollpack")

RETRYABLE = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)


class PutResult:
    """What one ``put`` did. ``accepted``/``duplicates``/``stored_bytes`` sum
    the server's PutSamplesResponse over the streams (a retried stream's
    re-sent samples count as duplicates); ``samples``, ``messages`` and
    ``wire_bytes`` count what the client sent (retries included)."""

    __slots__ = ("accepted", "duplicates", "stored_bytes", "samples", "messages", "streams",
                 "retries", "wire_bytes")

    accepted: int
    duplicates: int
    stored_bytes: int
    samples: int
    messages: int
    streams: int
    retries: int
    wire_bytes: int

    def __init__(self) -> None:
        for k in self.__slots__:
            setattr(self, k, 0)

    def _add(self, resp):
        self.accepted += resp.accepted
        self.duplicates += resp.duplicates
        self.stored_bytes += resp.stored_bytes
        self.streams += 1

    def __repr__(self) -> str:
        return "PutResult(%s)" % ", ".join("%s=%d" % (k, getattr(self, k)) for k in self.__slots__)


def _read(x: Optional[PemSource]) -> Optional[bytes]:
    if x is None or isinstance(x, bytes):
        return x
    with open(x, "rb") as f:
        return f.read()


def _target(address):
    for prefix in ("grpc://", "http://"):
        if address.startswith(prefix):
            return address[len(prefix):]
    return address


def _details(err):
    return (err.details() or "").lower() if callable(getattr(err, "details", None)) else ""


def _is_size_error(err):
    d = _details(err)
    return "larger than max" in d or "message larger" in d or "max message size" in d


def _is_count_error(err):
    # RESOURCE_EXHAUSTED that waiting does not cure: a message over
    # rollpackd's --max-samples-per-message.
    return "--max-samples-per-message" in _details(err)


class _Backoff:
    def __init__(self, initial, maximum, multiplier, attempts):
        self.initial, self.maximum, self.multiplier, self.attempts = (
            initial, maximum, multiplier, attempts)

    def delay(self, attempt):
        base = min(self.maximum, self.initial * self.multiplier ** (attempt - 1))
        return base * (0.5 + 0.5 * random.random())


class _Retry:
    """One call's retries: backoff between attempts for at most ``retry_for``
    seconds from the first failure (None = for ever) and ``max_attempts``
    attempts (None = no cap), with a warning every ``warn_every`` seconds
    while they go on (an RL step can hold the server full for minutes)."""

    def __init__(self, owner, what):
        self.owner, self.what = owner, what
        self.attempts = 0
        self.first = self.warned = None
        self.explained = None
        self.tls_probed = False

    def next_delay(self, err):
        """The seconds to wait before the next attempt, or None to give up
        (``explained``: then what the error says, when rollpack.connect_failure
        has more to say than gRPC)."""
        o = self.owner
        self.attempts += 1
        now = time.monotonic()
        if self.first is None:
            self.first = self.warned = now
        if connect_failure.server_answered(err):
            connect_failure.note_reached(o.address)
        kind = connect_failure.classify(err)
        tls = o._creds is not None
        if kind == connect_failure.PERMANENT:
            self.explained = connect_failure.explain(err, o.address, tls)
            return None
        never_reached = (kind == connect_failure.UNREACHABLE
                         and not connect_failure.was_reached(o.address))
        if never_reached and not tls and not self.tls_probed:
            # Connections closed unanswered: asked once whether the server
            # speaks TLS, which no wait would change.
            self.tls_probed = True
            if (connect_failure.closed_before_http2(err)
                    and connect_failure.server_speaks_tls(o.address)):
                self.explained = connect_failure.explain(err, o.address, tls, speaks_tls=True)
                return None
        if never_reached and o.connect_grace is not None:
            waited = now - self.first
            if waited >= o.connect_grace:
                self.explained = connect_failure.explain(err, o.address, tls, waited)
                return None
        if not o._retryable(err):
            return None
        waited = now - self.first
        if ((o.max_attempts is not None and self.attempts >= o.max_attempts)
                or (o.retry_for is not None and waited >= o.retry_for)):
            if kind == connect_failure.UNREACHABLE:
                self.explained = connect_failure.explain(err, o.address, tls, waited)
            return None
        if o.warn_every is not None and now - self.warned >= o.warn_every:
            self.warned = now
            _log.warning("%s: %s for %.0f s, still retrying (retry_for %s)", self.what,
                         err.code().name if callable(getattr(err, "code", None)) else err,
                         waited, "forever" if o.retry_for is None else "%g s" % o.retry_for)
        delay = o.backoff.delay(self.attempts)
        if o.retry_for is not None:
            delay = min(delay, max(0.0, o.retry_for - waited))
        if never_reached and o.connect_grace is not None:
            delay = min(delay, max(0.0, o.connect_grace - waited))
        return delay

    def succeeded(self):
        connect_failure.note_reached(self.owner.address)


def _annotate_request(own_pool, pool, annotations):
    """annotate(annotations) or annotate(pool, annotations)."""
    if annotations is None:
        if isinstance(pool, str):
            raise TypeError("annotate(pool, annotations): no annotations given for pool %r"
                            % pool)
        pool, annotations = own_pool, pool
    return annotate_request(pool, annotations)


class _Base:
    """What Producer and AsyncProducer share: options, retries, errors."""

    def __init__(self, address: str, pool: str, *, token: Optional[str] = None,
                 tls: bool = False, root_certificates: Optional[PemSource] = None,
                 client_certificate: Optional[PemSource] = None,
                 client_key: Optional[PemSource] = None, server_name: Optional[str] = None,
                 timeout: Optional[float] = 60.0, max_message_bytes: int = 16 << 20,
                 max_samples_per_message: Optional[int] = 65536,
                 max_unacked_bytes: int = 64 << 20, retry_for: Optional[float] = 600.0,
                 max_attempts: Optional[int] = None, warn_every: Optional[float] = 30.0,
                 initial_backoff: float = 0.1, max_backoff: float = 5.0,
                 backoff_multiplier: float = 2.0,
                 connect_grace: Optional[float] = connect_failure.DEFAULT_CONNECT_GRACE,
                 channel_options: Sequence[Tuple[str, Any]] = ()) -> None:
        """Opens a channel to rollpackd at ``address`` ("host:port"; a
        "grpc://" or "http://" prefix is dropped) for pool ``pool``. No RPC
        is made until the first call.

        Keyword options (docs/producer.md):

        - ``token``: bearer token, sent as ``authorization: Bearer <token>``.
        - ``tls``: a TLS channel (system roots unless ``root_certificates``);
          implied by ``root_certificates`` or ``client_certificate``.
        - ``root_certificates``: PEM path or bytes of the server's CA.
        - ``client_certificate`` + ``client_key``: mutual TLS (PEM paths or
          bytes; both or neither).
        - ``server_name``: TLS name override (when ``address`` is an IP).
        - ``timeout``: seconds, the deadline of each RPC attempt (None = none);
          each method's ``timeout`` argument overrides it.
        - ``max_message_bytes``: target size of one PutSamplesRequest (a
          larger single sample goes alone).
        - ``max_samples_per_message``: at most this many samples in one
          PutSamplesRequest (0 or None: bytes alone decide); keep it at or
          under rollpackd's ``--max-samples-per-message`` (65536 by default).
        - ``max_unacked_bytes``: bytes sent on one stream before it is closed
          and acknowledged: the client's memory bound during ``put``.
        - ``retry_for``: seconds a call keeps retrying RESOURCE_EXHAUSTED and
          UNAVAILABLE from its first failure (None = for ever).
        - ``max_attempts``: a cap on attempts besides ``retry_for`` (None = none).
        - ``warn_every``: seconds between warnings on the "rollpack" logger
          while a call retries (None = never).
        - ``initial_backoff``, ``max_backoff``, ``backoff_multiplier``: the
          exponential backoff between attempts (seconds; with jitter).
        - ``connect_grace``: seconds a call keeps retrying an address that
          does not resolve or refuses connections while this process has
          never reached it (a server still starting); once reached, that is
          a restart, retried for ``retry_for`` (None = ``retry_for`` from
          the start). A failed TLS handshake or refused credentials raise at
          once, naming the cause and the fix.
        - ``channel_options``: extra ``(name, value)`` gRPC channel arguments.

        Raises ValueError for an empty pool or a certificate without its key.
        """
        if not pool:
            raise ValueError("pool must be a non-empty string")
        self.address, self.pool = _target(address), pool
        self.timeout = timeout
        self.max_message_bytes = int(max_message_bytes)
        # 0 or None: no count of its own (as the server's flag and the C++
        # client's batch_samples read 0).
        self.max_samples_per_message = int(max_samples_per_message or 0)
        if self.max_samples_per_message < 0:
            raise ValueError("max_samples_per_message is %d: >= 0 (0 = no limit)"
                             % self.max_samples_per_message)
        self.max_unacked_bytes = int(max_unacked_bytes)
        self.backoff = _Backoff(initial_backoff, max_backoff, backoff_multiplier, None)
        self.retry_for = None if retry_for is None else float(retry_for)
        self.max_attempts = None if max_attempts is None else max(1, int(max_attempts))
        self.warn_every = None if warn_every is None else float(warn_every)
        self.connect_grace = None if connect_grace is None else float(connect_grace)
        self._metadata = (("authorization", "Bearer " + token),) if token else None
        self._spec: Optional[ModelSpec] = None
        use_tls = tls or root_certificates or client_certificate
        self._creds = None
        if use_tls:
            if bool(client_certificate) != bool(client_key):
                raise ValueError("client_certificate and client_key go together (mutual TLS)")
            self._creds = grpc.ssl_channel_credentials(
                root_certificates=_read(root_certificates), private_key=_read(client_key),
                certificate_chain=_read(client_certificate))
        self._options = [("grpc.max_send_message_length", -1),
                         ("grpc.max_receive_message_length", -1)]
        if server_name:
            self._options.append(("grpc.ssl_target_name_override", server_name))
        self._options.extend(channel_options)
        self._open_channel()

    def _open_channel(self) -> None:
        raise NotImplementedError

    def _deadline(self, timeout: Optional[float]) -> Optional[float]:
        return self.timeout if timeout is None else timeout

    def _register_request(self, spec: ModelSpec, options: Optional[PoolOptionsLike]
                          ) -> rollouts_pb2.RegisterModelRequest:
        req = rollouts_pb2.RegisterModelRequest(pool=self.pool, model=spec.to_proto())
        if options is not None:
            if isinstance(options, Mapping):
                options = pool_options(options)
            req.options.CopyFrom(options)
        return req

    def _spec_arg(self, spec: Optional[SpecLike], fields: Dict[str, Any]) -> ModelSpec:
        if spec is None:
            spec = ModelSpec(**fields)
        elif fields:
            raise TypeError("register_model takes a ModelSpec or its fields, not both")
        elif isinstance(spec, Mapping):
            spec = ModelSpec.from_dict(spec)
        return spec

    def _retryable(self, err):
        return err.code() in RETRYABLE and not _is_size_error(err) and not _is_count_error(err)

    def _fail(self, err, what, retry):
        e = errors.from_rpc_error(err, what, retry.attempts, retry.explained)
        if _is_size_error(err):
            e.args = (e.args[0] + " (a request message exceeds the server's message size "
                      "limit: lower max_message_bytes, now %d, or raise the server's limit)"
                      % self.max_message_bytes,)
        elif _is_count_error(err):
            e.args = (e.args[0] + " (lower max_samples_per_message, now %d, to the server's "
                      "--max-samples-per-message)" % self.max_samples_per_message,)
        return e


class Producer(_Base):
    """Synchronous producer of one pool. Thread-safe for ``put`` from several
    threads (each call runs its own streams). A context manager (closes
    the channel).

    ``Producer(address, pool, *, token=None, tls=False, timeout=60.0,
    retry_for=600.0, ...)``: every option is a keyword, documented on
    ``__init__`` (``help(rollpack.Producer)``) and in docs/producer.md.
    """

    def _open_channel(self) -> None:
        if self._creds is not None:
            self._channel = grpc.secure_channel(self.address, self._creds, self._options)
        else:
            self._channel = grpc.insecure_channel(self.address, self._options)
        self._stub = rollouts_pb2_grpc.RolloutsStub(self._channel)
        self._lock = threading.Lock()

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, what, fn):
        retry = _Retry(self, what)
        while True:
            try:
                response = fn()
                retry.succeeded()
                return response
            except grpc.RpcError as err:
                delay = retry.next_delay(err)
                if delay is None:
                    raise self._fail(err, what, retry) from None
                time.sleep(delay)

    def register_model(self, spec: Optional[SpecLike] = None, timeout: Optional[float] = None,
                       options: Optional[PoolOptionsLike] = None, **fields: Any) -> bool:
        """Registers the pool's model (a ModelSpec, a dict, or its fields as
        keyword arguments). Returns True when created, False when the pool
        already had this exact model. Raises FailedPrecondition when the pool
        holds a different one.

        ``options``: the pool's lifecycle options (docs/lifecycle.md), a dict
        of PoolOptions fields (``default_group_size``, ``max_staleness``,
        ``drop_stale``, ``max_uses``, ``incomplete_group_timeout_ms``,
        ``token_fields``, ``required_scalars``: a sealed sample is selectable
        only once it has each, e.g. ``["reward"]`` added later by
        :meth:`annotate`) or a ``rollouts_pb2.PoolOptions``; fixed by the
        pool's first registration (other options later raise
        FailedPrecondition; None leaves them). ``token_fields`` declares the
        pool's token fields, e.g. ``{"loss_mask": "uint8", "logprobs":
        {"dtype": "float32", "allow_narrowing": True}}``: samples may then
        send them in any compatible dtype (docs/producer.md, "Token-field
        schema")."""
        spec = self._spec_arg(spec, fields)
        req = self._register_request(spec, options)
        resp = self._call("RegisterModel of pool %r" % self.pool, lambda: self._stub.RegisterModel(
            req, timeout=self._deadline(timeout), metadata=self._metadata))
        self._spec = ModelSpec.from_proto(resp.model) if resp.HasField("model") else spec
        return resp.created

    def pool_info(self, timeout: Optional[float] = None) -> rollouts_pb2.PoolInfo:
        """The server's PoolInfo message for this pool."""
        req = rollouts_pb2.GetPoolRequest(pool=self.pool)
        return self._call("GetPool of pool %r" % self.pool, lambda: self._stub.GetPool(
            req, timeout=self._deadline(timeout), metadata=self._metadata))

    def annotate(self, pool: Union[str, AnnotationsLike],
                 annotations: Optional[AnnotationsLike] = None,
                 timeout: Optional[float] = None) -> int:
        """``annotate(annotations)`` or ``annotate(pool, annotations)``: adds
        scalars (a reward, ...) to samples stored earlier and in no live step
        (lifecycle.md section 6), of this producer's pool unless another is
        named. ``annotations``: ``{sample_id: {name: value}}`` or a list of
        entries (rollpack.annotations). All or nothing, durable; returns the
        number of entries accepted (a scalar set again to its value is a
        no-op, so a retry is safe; UNAVAILABLE is retried as for ``put``).
        Raises NotFound (pool or sample id), InvalidArgument (a sample id
        twice), FailedPrecondition (a sample in a live step, or a scalar
        already set to another value), each naming it."""
        req = _annotate_request(self.pool, pool, annotations)
        return self._call("AnnotateSamples of pool %r" % req.pool,
                          lambda: self._stub.AnnotateSamples(
                              req, timeout=self._deadline(timeout),
                              metadata=self._metadata)).annotated

    def model(self, timeout: Optional[float] = None) -> ModelSpec:
        """The pool's ModelSpec (registered by this producer, or fetched once)."""
        if self._spec is None:
            info = self.pool_info(timeout)
            if not info.HasField("model") or info.model.num_layers < 1:
                raise errors.NotFound("pool %r has no model registered: call register_model"
                                      % self.pool)
            self._spec = ModelSpec.from_proto(info.model)
        return self._spec

    def put(self, samples: Union[Sample, Iterable[Sample]],
            timeout: Optional[float] = None) -> PutResult:
        """Streams ``samples`` (a Sample or an iterable of them, consumed
        lazily) to the pool. Returns a PutResult. Raises the server's error
        (e.g. InvalidArgument naming the sample, AlreadyExists) or, for a
        sample that cannot be encoded, PayloadError after the samples before
        it were committed."""
        spec = self.model(timeout)
        result = PutResult()
        feed = Feed(samples, self.pool, spec, self.max_message_bytes,
                     self.max_samples_per_message, self.max_unacked_bytes,
                     result)
        what = "PutSamples to pool %r" % self.pool
        while True:
            retry = _Retry(self, what)
            while True:
                try:
                    resp = self._stub.PutSamples(feed.stream(), timeout=self._deadline(timeout),
                                                 metadata=self._metadata)
                    break
                except grpc.RpcError as err:
                    delay = retry.next_delay(err)
                    if delay is None:
                        raise self._fail(err, what, retry) from None
                    result.retries += 1
                    time.sleep(delay)
            retry.succeeded()
            result._add(resp)
            feed.acked()
            if feed.error is not None:
                raise feed.error
            if feed.done:
                return result


    def rollout(self, sample_id: str, *, group_id: str = "", group_size: int = 0,
                scalars: Optional[Mapping[str, float]] = None) -> Rollout:
        """A :class:`Rollout` writing ``sample_id`` to this pool in pieces
        (lifecycle.md section 5): a partial rollout continued after a weight
        update, or a multi-turn trajectory, stored as it is generated and
        selectable once sealed. ``group_id``/``group_size``/``scalars`` are
        the sample's, sent with its first piece."""
        return Rollout(self, sample_id, group_id=group_id, group_size=group_size,
                       scalars=scalars)


class Rollout:
    """One sample sent in pieces through a :class:`Producer`.

    ``append(tokens, routed_experts=None, row_offset=None, *, token_fields=None,
    policy_version=0, ragged_token_fields=None)`` stores the next piece:
    ``tokens`` are the new tokens only, ``token_fields`` their rows,
    ``ragged_token_fields`` their lists, ``routed_experts`` rows in whole-sample
    positions starting at ``row_offset`` (default: where the stored rows end,
    0 for the first piece; required when no piece carried rows yet; rows
    already stored are never replaced).
    ``seal(...)`` takes the same arguments (all optional) and stores the last
    piece; the sample is then selectable. Each piece is durable once the call
    returns; a call that raised may be repeated as is (an identical re-send is
    a duplicate). A per-token policy version can travel as a token field.
    """

    def __init__(self, producer: Producer, sample_id: str, *, group_id: str = "",
                 group_size: int = 0, scalars: Optional[Mapping[str, float]] = None) -> None:
        self.producer = producer
        self.sample_id = sample_id
        self.group_id, self.group_size = group_id, int(group_size)
        self.scalars = dict(scalars or {})
        #: Pieces stored so far, tokens stored, and where the stored rows end
        #: (None while no piece carried rows).
        self.pieces = 0
        self.num_tokens = 0
        self.rows_end = None
        self.sealed = False

    def append(self, tokens: ArrayLike, routed_experts: Optional[ArrayLike] = None,
               row_offset: Optional[int] = None, *,
               token_fields: Optional[Mapping[str, ArrayLike]] = None, policy_version: int = 0,
               timeout: Optional[float] = None,
               ragged_token_fields: Optional[Mapping[str, Any]] = None) -> PutResult:
        """Stores the next piece (new ``tokens`` only; see the class doc) and
        returns its PutResult. Raises PayloadError after ``seal``."""
        return self._put(tokens, routed_experts, row_offset, token_fields, policy_version,
                         partial=True, timeout=timeout, ragged=ragged_token_fields)

    def seal(self, tokens: ArrayLike = (), routed_experts: Optional[ArrayLike] = None,
             row_offset: Optional[int] = None, *,
             token_fields: Optional[Mapping[str, ArrayLike]] = None, policy_version: int = 0,
             timeout: Optional[float] = None,
             ragged_token_fields: Optional[Mapping[str, Any]] = None) -> PutResult:
        """Stores the last piece (possibly empty); the sample becomes
        selectable. Returns its PutResult."""
        return self._put(tokens, routed_experts, row_offset, token_fields, policy_version,
                         partial=False, timeout=timeout, ragged=ragged_token_fields)

    def _put(self, tokens, routed_experts, row_offset, token_fields, policy_version, partial,
             timeout, ragged=None):
        if self.sealed:
            raise errors.PayloadError("sample %r is sealed; it cannot be extended"
                                      % self.sample_id)
        first = self.pieces == 0
        if row_offset is None:
            if self.rows_end is not None:
                row_offset = self.rows_end
            elif first or routed_experts is None:
                row_offset = 0
            else:
                # No rows stored yet: where this piece's rows start is the
                # caller's to say (any offset is accepted, and stored rows
                # are never replaced).
                raise errors.PayloadError(
                    "sample %r: no piece carried routed_experts yet; pass row_offset (the "
                    "whole-sample position of this piece's first row)" % self.sample_id)
        sample = Sample(self.sample_id, tokens, routed_experts, row_offset,
                        token_fields=token_fields, ragged_token_fields=ragged,
                        policy_version=policy_version,
                        scalars=self.scalars if first else None,
                        group_id=self.group_id if first else "",
                        group_size=self.group_size if first else 0,
                        piece=self.pieces, partial=partial)
        result = self.producer.put(sample, timeout=timeout)
        self.pieces += 1
        self.num_tokens += sample.num_tokens
        if sample.routed_experts is not None and sample.routed_experts.shape[0] > 0:
            self.rows_end = sample.row_offset + int(sample.routed_experts.shape[0])
        self.sealed = not partial
        return result


class AsyncProducer(_Base):
    """asyncio producer (grpc.aio), with the options (keywords documented on
    ``__init__``) and semantics of :class:`Producer`; ``register_model``,
    ``pool_info``, ``model``, ``put`` and ``close`` are coroutines. ``put``
    also takes an async iterable of samples. Samples are encoded on the event
    loop (about a millisecond per 8k-token sample). An async context
    manager (closes the channel)."""

    def _open_channel(self) -> None:
        if self._creds is not None:
            self._channel = grpc.aio.secure_channel(self.address, self._creds, self._options)
        else:
            self._channel = grpc.aio.insecure_channel(self.address, self._options)
        self._stub = rollouts_pb2_grpc.RolloutsStub(self._channel)

    async def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, what, make):
        retry = _Retry(self, what)
        while True:
            try:
                response = await make()
                retry.succeeded()
                return response
            except grpc.RpcError as err:
                delay = retry.next_delay(err)
                if delay is None:
                    raise self._fail(err, what, retry) from None
                await asyncio.sleep(delay)

    async def register_model(self, spec: Optional[SpecLike] = None,
                             timeout: Optional[float] = None,
                             options: Optional[PoolOptionsLike] = None, **fields: Any) -> bool:
        """As :meth:`Producer.register_model`."""
        spec = self._spec_arg(spec, fields)
        req = self._register_request(spec, options)
        resp = await self._call("RegisterModel of pool %r" % self.pool, lambda: self._stub.RegisterModel(
            req, timeout=self._deadline(timeout), metadata=self._metadata))
        self._spec = ModelSpec.from_proto(resp.model) if resp.HasField("model") else spec
        return resp.created

    async def pool_info(self, timeout: Optional[float] = None) -> rollouts_pb2.PoolInfo:
        """The server's PoolInfo message for this pool."""
        req = rollouts_pb2.GetPoolRequest(pool=self.pool)
        return await self._call("GetPool of pool %r" % self.pool, lambda: self._stub.GetPool(
            req, timeout=self._deadline(timeout), metadata=self._metadata))

    async def annotate(self, pool: Union[str, AnnotationsLike],
                       annotations: Optional[AnnotationsLike] = None,
                       timeout: Optional[float] = None) -> int:
        """As :meth:`Producer.annotate`."""
        req = _annotate_request(self.pool, pool, annotations)
        resp = await self._call("AnnotateSamples of pool %r" % req.pool,
                                lambda: self._stub.AnnotateSamples(
                                    req, timeout=self._deadline(timeout),
                                    metadata=self._metadata))
        return resp.annotated

    async def model(self, timeout: Optional[float] = None) -> ModelSpec:
        """As :meth:`Producer.model`."""
        if self._spec is None:
            info = await self.pool_info(timeout)
            if not info.HasField("model") or info.model.num_layers < 1:
                raise errors.NotFound("pool %r has no model registered: call register_model"
                                      % self.pool)
            self._spec = ModelSpec.from_proto(info.model)
        return self._spec

    async def put(self, samples: Union[Sample, Iterable[Sample], AsyncIterable[Sample]],
                  timeout: Optional[float] = None) -> PutResult:
        """As :meth:`Producer.put`; ``samples`` may also be an async iterable."""
        spec = await self.model(timeout)
        result = PutResult()
        feed = Feed(samples, self.pool, spec, self.max_message_bytes,
                     self.max_samples_per_message, self.max_unacked_bytes,
                     result)
        feed._alock = asyncio.Lock()
        what = "PutSamples to pool %r" % self.pool
        while True:
            retry = _Retry(self, what)
            while True:
                try:
                    resp = await self._stub.PutSamples(feed.astream(),
                                                       timeout=self._deadline(timeout),
                                                       metadata=self._metadata)
                    break
                except grpc.RpcError as err:
                    delay = retry.next_delay(err)
                    if delay is None:
                        raise self._fail(err, what, retry) from None
                    result.retries += 1
                    await asyncio.sleep(delay)
            retry.succeeded()
            result._add(resp)
            feed.acked()
            if feed.error is not None:
                raise feed.error
            if feed.done:
                return result
