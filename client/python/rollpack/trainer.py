"""Trainer side: one rank's micro-batches as torch tensors (docs/trainer.md).

    from rollpack.trainer import TrainerClient, install_replay_targets
    for mb in TrainerClient("127.0.0.1:50051", step_id, rank=(dp, cp, tp, pp), device="cuda:0"):
        install_replay_targets(mb)          # RouterReplay targets, layer order
        loss = model(mb.tokens, cu_seqlens=mb.cu_seqlens_padded, ...)

The work happens in librollpack_trainer.so (C++): a background thread reads
the gRPC stream, a second one copies each micro-batch through pinned memory
to the GPU on its own CUDA stream and unpacks the replay ids with the unpack
kernel, while the training loop consumes the previous one. Tensors arrive via
DLPack (no libtorch linked, so one build serves any torch). On "cpu" the
arrays view the received bytes and the ids come from the CPU reference.

With rollpackd's token auth and TLS, pass the Producer's connection options
(``token=``, ``tls=``, ``root_certificates=``, ``client_certificate=`` +
``client_key=``, ``server_name=``). ``report_routing_agreement`` sends
``routing_agreement``'s counts back to rollpackd, which exports them as
metrics (docs/operations.md).

The C ABI is reached through ctypes (rollpack._capi).
"""

import collections
import os

import torch
import torch.utils.dlpack

from rollpack import _capi
from rollpack._capi import call
from rollpack.replay import (apply_replay, install_replay_targets,  # noqa: F401
                             recorded_routing, routing_agreement, set_replay_action)


def has_cuda():
    """Whether librollpack_trainer.so was built with CUDA."""
    return _capi.has_cuda()


def close_tp_communicators():
    """Aborts the NCCL communicators TP-leader mode keeps between steps.

    TrainerClient(tp_leader_size=...) keeps a group's communicator for its next
    step (set ROLLPACK_TP_COMM_REUSE=0 to create one per step instead); call
    this when the group will not fetch again, e.g. before destroying the
    process group or at shutdown. Idle communicators only; no-op on CPU.
    """
    _capi.close_tp_communicators()


def _coords(rank):
    if isinstance(rank, dict):
        return tuple(int(rank.get(k, 0)) for k in ("dp", "cp", "tp", "pp"))
    if hasattr(rank, "dp"):
        return tuple(int(getattr(rank, k)) for k in ("dp", "cp", "tp", "pp"))
    t = tuple(int(x) for x in rank)
    if len(t) != 4:
        raise ValueError("rank must be (dp, cp, tp, pp), got %r" % (rank,))
    return t


def _pem(x):
    """PEM bytes as given, or read from a path (the Producer's convention)."""
    if x is None or isinstance(x, bytes):
        return x
    with open(x, "rb") as f:
        return f.read()


def _connect(token=None, tls=False, root_certificates=None, client_certificate=None,
             client_key=None, server_name=None):
    """The binding's connection tuple: (auth_token, tls, root_certs_pem,
    client_cert_pem, client_key_pem, server_name)."""
    if bool(client_certificate) != bool(client_key):
        raise ValueError("client_certificate and client_key go together (mutual TLS)")
    return (token or None, bool(tls), _pem(root_certificates), _pem(client_certificate),
            _pem(client_key), server_name or None)


class ReportAck(collections.namedtuple(
        "ReportAck", "rows_compared rows_disagreeing overlapping_experts reports topk")):
    """What rollpackd holds for the step after a routing agreement report:
    sums over every rank and layer reported so far (exact counts)."""

    __slots__ = ()

    @property
    def fraction_differ(self):
        return self.rows_disagreeing / self.rows_compared if self.rows_compared else 0.0

    @property
    def mean_overlap(self):
        n = self.rows_compared * self.topk
        return self.overlapping_experts / n if n else 0.0


def _report(client, step_id, rank, agreement, layers):
    if hasattr(layers, "replay_layers"):
        layers = layers.replay_layers
    layers = [int(x) for x in layers]
    counts = [agreement.rows_counted, agreement.rows_differ, agreement.overlap_sum]
    n = int(counts[0].numel())
    if len(layers) != n:
        raise ValueError("agreement has %d layers but %d layer ids were given (%s)"
                         % (n, len(layers), layers))
    stats = torch.stack([c.reshape(-1).to("cpu", torch.int64) for c in counts], 1)
    dp, cp, tp, pp = rank
    totals = call(_capi.report_routing_agreement,
                  "report routing agreement of %s rank %s" % (step_id, rank), client, step_id,
                  dp, cp, tp, pp, int(agreement.k), layers, stats.reshape(-1).tolist())
    return ReportAck(*[int(x) for x in totals], int(agreement.k))


def report_routing_agreement(address, step_id, rank, agreement, layers, **connection):
    """Sends one rank's ``routing_agreement`` result to rollpackd (metrics
    rollpack_routing_*). layers: the global MoE layer ids of the agreement's
    layer axis (a Microbatch's ``replay_layers``, or the Microbatch itself).
    connection: ``token``, ``tls``, ``root_certificates``,
    ``client_certificate``, ``client_key``, ``server_name`` as for
    TrainerClient. Returns a ReportAck. Reports add up on the server: send
    each comparison once (not retried here)."""
    client = call(_capi.client_open, "connect to %s" % address, address, _connect(**connection))
    try:
        return _report(client, step_id, _coords(rank), agreement, layers)
    finally:
        _capi.client_close(client)


_INT32_MAX = 2**31 - 1


def _resume_limits(resume_timeout, max_resumes):
    """(resume_timeout_ms, max_resumes) as rpt_stream_options reads them."""
    if resume_timeout is None:
        ms = -1
    elif resume_timeout < 0 or resume_timeout * 1000 > _INT32_MAX:
        raise ValueError("resume_timeout is %r: seconds in [0, %d], or None for no limit"
                         % (resume_timeout, _INT32_MAX // 1000))
    else:
        ms = max(1, int(round(resume_timeout * 1000)))
    if max_resumes is None:
        cap = 0
    elif max_resumes < 0 or max_resumes > _INT32_MAX:
        raise ValueError("max_resumes is %r: an int >= 0, or None for no cap" % (max_resumes,))
    else:
        cap = int(max_resumes) if max_resumes > 0 else -1
    if resume_timeout is not None and resume_timeout == 0:
        cap = -1  # 0 s: not a single resume
    return ms, cap


def _device_index(device):
    if device is None:
        return -1
    d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if d.type == "cpu":
        return -1
    if d.type != "cuda":
        raise ValueError("device must be cpu or cuda, got %s" % d)
    return d.index if d.index is not None else torch.cuda.current_device()


class Microbatch:
    """One micro-batch of one rank (layout.md section 7) as tensors on the
    client's device. ``replay_indices`` is [layers, rows, K] int64 (int32 with
    index_dtype=torch.int32): ``replay_indices[l]`` is local MoE layer l's
    RouterReplay target. ``replay_experts`` is the received [rows, layers, K]
    buffer (uint8, or int16 holding the uint16 ids). Empty arrays (e.g. tokens
    off the first pipeline stage) are tensors with 0 elements.

    Per sequence, in the order of ``sample_ids``, on every rank
    (lifecycle.md section 6): ``group_ids`` (list of str, "" for an
    ungrouped sample), ``policy_versions`` (int64 CPU tensor [S]),
    ``scalars`` (dict name -> float64 tensor [S] on the client's device, the
    scalars every sample of the step has) and ``advantages`` (float32 tensor
    [S] on the device, None when the step was created without an advantage
    estimator). From a rollpackd older than these fields, ``group_ids`` and
    ``policy_versions`` are None and ``scalars`` is empty.

    ``ragged_token_fields`` (layout.md section 13; e.g. ``sampling_mask``,
    the ids the engine's sampler kept at each position): dict name ->
    RaggedTensors(values, offsets) on the client's device, delivered with
    ``token_fields`` (the last pipeline stage, every stage with
    all_fields); empty when the step has none."""

    __slots__ = ("step_id", "index", "num_microbatches", "local_cp_size", "local_cp_rank",
                 "max_seqlen", "workload", "sample_ids", "replay_layers", "tokens", "cu_seqlens",
                 "cu_seqlens_padded", "replay_experts", "replay_mask", "replay_indices",
                 "token_fields", "ragged_token_fields", "group_ids", "policy_versions",
                 "scalars", "advantages", "device")

    def __repr__(self):
        return ("Microbatch(step=%r, index=%d/%d, samples=%d, tokens=%s, replay=%s, device=%s)"
                % (self.step_id, self.index, self.num_microbatches, len(self.sample_ids),
                   tuple(self.tokens.shape), tuple(self.replay_indices.shape), self.device))

    def replay_targets(self):
        """List of per-layer [rows, K] tensors (views), in local layer order."""
        return list(self.replay_indices.unbind(0))


class RaggedTensors(collections.namedtuple("RaggedTensors", "values offsets")):
    """One ragged token field of a micro-batch (layout.md section 13), on the
    client's device: ``values`` int32 [num_values] (ids; the wire's uint16 ids
    are widened to int32 as they are staged) and ``offsets`` int64
    [rows + 1], over the rows of ``tokens``: row r's list is
    ``values[offsets[r]:offsets[r + 1]]`` (empty on padding and prompt rows),
    ``offsets[0] == 0`` and ``offsets[-1] == len(values)``, checked on
    receipt. Unpacks as ``values, offsets = mb.ragged_token_fields[name]``."""

    __slots__ = ()

    @property
    def rows(self):
        return int(self.offsets.numel()) - 1

    def lengths(self):
        """int64 [rows]: the length of each row's list."""
        return self.offsets[1:] - self.offsets[:-1]


def _from_batch(b, device, replay_ids=True):
    mb = Microbatch()
    mb.step_id = _capi.batch_step_id(b)
    for k in ("index", "num_microbatches", "local_cp_size", "local_cp_rank", "max_seqlen"):
        setattr(mb, k, int(_capi.batch_int(b, k)))
    mb.workload = _capi.batch_workload(b)
    mb.sample_ids = _capi.batch_sample_ids(b)
    mb.replay_layers = _capi.batch_layers(b)
    mb.device = device

    def t(name):
        return _capi.batch_tensor(b, name, torch.utils.dlpack.from_dlpack)

    mb.tokens = t("tokens")
    mb.cu_seqlens = t("cu_seqlens")
    mb.cu_seqlens_padded = t("cu_seqlens_padded")
    mb.replay_experts = t("replay_experts")
    mb.replay_mask = t("replay_mask")
    mb.replay_indices = t("replay_ids") if replay_ids else None
    mb.token_fields = {n: t("field:" + n) for n in _capi.batch_fields(b)}
    mb.ragged_token_fields = {
        n: RaggedTensors(t("ragged_values:" + n), t("ragged_offsets:" + n))
        for n in _capi.batch_ragged_fields(b)}
    mb.group_ids, mb.policy_versions, mb.scalars, mb.advantages = None, None, {}, None
    if _capi.has_sequence_info():  # else a library older than them
        mb.group_ids = _capi.batch_group_ids(b)
        versions = _capi.batch_policy_versions(b)
        if versions is not None:
            mb.policy_versions = torch.tensor(versions, dtype=torch.int64)
        mb.scalars = {n: t("scalar:" + n) for n in _capi.batch_scalar_names(b)}
        if _capi.batch_has_array(b, "advantages"):
            mb.advantages = t("advantages")
    return mb


def _grace_ms(connect_grace):
    """connect_grace (seconds, None = no grace) as rpt_stream_options reads it."""
    if connect_grace is None:
        return -1
    if connect_grace < 0 or connect_grace * 1000 > _INT32_MAX:
        raise ValueError("connect_grace is %r: seconds in [0, %d], or None for no grace"
                         % (connect_grace, _INT32_MAX // 1000))
    return max(1, int(round(connect_grace * 1000)))


class TrainerClient:
    """Iterates one rank's micro-batches of a step as torch tensors.

    rank: (dp, cp, tp, pp), a dict or an object with those attributes.
    device: "cpu", "cuda", "cuda:N", an int or a torch.device.
    prefetch: micro-batches read ahead from the network and (on a GPU)
    staged ahead on the device. tp_leader=True with tp_size=<topology tp>:
    TP-leader mode (every rank of the TP group creates its client the same
    way; rank tp 0 fetches for the group and distributes over NCCL, whose id
    is exchanged through rollpackd under (step, dp, cp, pp, start_index,
    rendezvous_tag): pass a fresh rendezvous_tag when a group opens the same
    step again). NCCL is found through
    $ROLLPACK_NCCL_LIBRARY, else torch's bundled libnccl, else libnccl.so.2.

    Connection (as rollpack.Producer): ``token`` (sent as ``authorization:
    Bearer <token>``, rollpackd --auth-tokens, trainer role), ``tls`` /
    ``root_certificates`` / ``client_certificate`` + ``client_key`` (paths
    or PEM bytes; any of them turns TLS on, no root certificates = the
    default roots) / ``server_name`` (TLS name override).

    Restarts: a broken stream (UNAVAILABLE, transport errors) resumes at
    the next micro-batch with exponential backoff (100 ms doubling, at most
    5 s per wait, jittered) for up to ``resume_timeout`` seconds from its
    first failure with no micro-batch received since (None = no limit, 0 =
    never resume); ``max_resumes`` (None = no cap) also caps the failed
    attempts in a row. An error that ends the stream has ``resume_from``:
    the first micro-batch not handed out, for a new client's
    ``start_index``. Errors that retrying cannot fix end the stream at once
    with a message naming the cause and the fix: a failed TLS handshake,
    refused credentials; an address that does not resolve or refuses
    connections after ``connect_grace`` seconds (10; None = the whole
    ``resume_timeout``) unless this process has reached it before (then it
    is a restart, ridden out for ``resume_timeout``).

    ``delivery``: "auto" (default) pulls each micro-batch's rows straight
    from the cluster members holding them when rollpackd serves that, else
    takes whole micro-batches from ``address``; "direct" only the former,
    "proxy" only the latter. The micro-batches are the same either way.

    ``replay_ids=False``: micro-batches carry no ``replay_indices`` (None),
    and no device memory or unpack kernel is spent on them: for ranks that
    write targets into a static buffer from ``replay_experts``
    (``rollpack.static_targets``, CUDA graphs).

    Tensors handed out stay valid while referenced; on a GPU they are
    ordered on the current CUDA stream at the time of ``next`` (use
    ``Tensor.record_stream`` before using them on another stream).
    """

    def __init__(self, address, step_id, rank, device="cpu", *, prefetch=2, all_fields=False,
                 start_index=0, index_dtype=torch.int64, masked_fill_minus_one=False,
                 tp_leader=False, tp_size=None, rendezvous_timeout_s=300, rendezvous_tag="",
                 token=None, tls=False, root_certificates=None, client_certificate=None,
                 client_key=None, server_name=None, resume_timeout=60.0, max_resumes=None,
                 delivery="auto", replay_ids=True, connect_grace=10.0):
        _capi.abi_version()  # loads the library, or raises ImportError
        self._stream = 0
        self._client = 0
        self._replay_layers = None
        if delivery not in _capi.DELIVERY:
            raise ValueError("delivery is %r: one of %s" % (delivery, ", ".join(
                repr(d) for d in _capi.DELIVERY)))
        self.address = address
        self._connect = _connect(token, tls, root_certificates, client_certificate, client_key,
                                 server_name)
        self.device_index = _device_index(device)
        self.device = torch.device("cpu") if self.device_index < 0 else torch.device(
            "cuda", self.device_index)
        if index_dtype not in (torch.int64, torch.int32):
            raise ValueError("index_dtype must be torch.int64 or torch.int32")
        tp_leader_size = 0
        if tp_leader:
            if not tp_size or tp_size < 1:
                raise ValueError("tp_leader needs tp_size (the topology's tp)")
            tp_leader_size = int(tp_size)
            _find_nccl()
        resume_timeout_ms, max_resumes = _resume_limits(resume_timeout, max_resumes)
        dp, cp, tp, pp = _coords(rank)
        self.rank = (dp, cp, tp, pp)
        self.step_id = step_id
        options = _capi.stream_options(
            dp, cp, tp, pp, self.device_index, prefetch=int(prefetch), all_fields=all_fields,
            start_index=int(start_index), ids_int32=index_dtype == torch.int32,
            fill=masked_fill_minus_one, tp_leader_size=tp_leader_size,
            rendezvous_timeout_s=int(rendezvous_timeout_s), rendezvous_tag=str(rendezvous_tag),
            resume_timeout_ms=resume_timeout_ms, max_resumes=max_resumes,
            delivery=_capi.DELIVERY[delivery], replay_ids=bool(replay_ids),
            connect_grace_ms=_grace_ms(connect_grace))
        self._replay_ids = bool(replay_ids)
        self._stream = call(_capi.open, "open %s rank %s" % (step_id, self.rank), address,
                            step_id, options, self._connect)

    def __iter__(self):
        return self

    def __next__(self):
        if not self._stream:
            raise StopIteration
        consumer = 0
        if self.device_index >= 0:
            consumer = torch.cuda.current_stream(self.device).cuda_stream
        b = call(_capi.next, "fetch %s rank %s" % (self.step_id, self.rank), self._stream,
                 consumer)
        if not b:
            self._close_stream()
            raise StopIteration
        try:
            mb = _from_batch(b, self.device, self._replay_ids)
        finally:
            _capi.batch_free(b)  # the tensors keep the memory alive
        self._replay_layers = mb.replay_layers
        return mb

    def report_routing_agreement(self, agreement, layers=None):
        """Sends ``agreement`` (a ``routing_agreement`` result computed on
        this rank's micro-batch) to rollpackd as this rank's counts; the
        server sums ranks exactly and exports rollpack_routing_* metrics.
        layers: global MoE layer ids of the agreement's layer axis, or a
        Microbatch; default the ``replay_layers`` of the last micro-batch this
        client returned. Returns a ReportAck (the step's totals so far).
        Works while iterating and after; the connection opens at the first
        report and ``close`` releases it. Each call adds: report a
        comparison once."""
        if layers is None:
            if self._replay_layers is None:
                raise ValueError("report_routing_agreement: no micro-batch received yet; "
                                 "pass layers (the micro-batch's replay_layers)")
            layers = self._replay_layers
        if not self._client:
            self._client = call(_capi.client_open, "connect to %s" % self.address,
                                self.address, self._connect)
        return _report(self._client, self.step_id, self.rank, agreement, layers)

    def _close_stream(self):
        if self._stream:
            s, self._stream = self._stream, 0
            _capi.close(s)

    def close(self):
        self._close_stream()
        if self._client:
            c, self._client = self._client, 0
            _capi.client_close(c)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _find_nccl():
    """Points ROLLPACK_NCCL_LIBRARY at the libnccl torch uses: the one
    already mapped in this process, else one under the nvidia pip packages."""
    if os.environ.get("ROLLPACK_NCCL_LIBRARY"):
        return
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "/libnccl.so" in path and os.path.exists(path):
                    os.environ["ROLLPACK_NCCL_LIBRARY"] = path
                    return
    except OSError:
        pass
    try:
        import nvidia  # torch's pip dependencies (nvidia-nccl-cu*)
        for root in list(getattr(nvidia, "__path__", [])):
            for d, _, files in os.walk(root):
                if "libnccl.so.2" in files:
                    os.environ["ROLLPACK_NCCL_LIBRARY"] = os.path.join(d, "libnccl.so.2")
                    return
    except ImportError:
        pass
