"""Replay targets in one static buffer, for CUDA-graphed MoE routers
(docs/trainer.md, "Static replay buffers").

Megatron's CUDA-graphed MoE path reads replay targets from one buffer
``[max_tokens, num_layers, topk]`` that never moves
(``RouterReplay.set_global_static_buffers``: layer l reads ``[:, l, :]``),
while ``Microbatch.replay_indices`` is a new tensor per micro-batch, which a
captured graph cannot read. This module writes a micro-batch's targets into
the caller's buffer with rollpack's unpack kernel, on the caller's stream,
allocating nothing and never synchronising. Rows past the micro-batch's
router rows up to ``max_rows`` get filler ids ``(row * K + j) mod E``
(layout.md section 7's filler continued: K distinct ids, never a constant
row), so a graph sized for ``max_rows`` never routes on stale ids.

    buf = torch.empty(max_tokens, num_moe_layers, topk, dtype=torch.int64, device="cuda")
    for mb in TrainerClient(...):
        write_replay_targets(mb, buf, num_experts=E)    # one kernel, eager
        install_static_buffer(buf)                  # RouterReplay views (per forward)
        graph.replay()

or, with the write itself inside the captured graph:

    static = StaticReplayTargets(buf, num_experts=E)
    with torch.cuda.graph(g):
        static.write()                              # the captured kernel
        ...model forward...
    for mb in TrainerClient(...):
        static.stage(mb)                            # outside the graph
        install_static_buffer(static)
        g.replay()

One buffer holds one micro-batch: with pipelining and activation recompute,
keep one per micro-batch in flight (docs/trainer.md).

CPU tensors run the CPU reference (what CI tests); CUDA tensors the kernel.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch

from rollpack import _capi
from rollpack._capi import call
from rollpack.replay import _instance_list, _leave_live, _mtp_of, _split_instances

_IN = {torch.uint8: 0, torch.int16: 1}
_OUT = {torch.int32: 2, torch.int64: 3}

StreamLike = Union[None, int, "torch.cuda.Stream"]


def _need_library() -> None:
    if not _capi.has_static_targets():
        raise ImportError("rollpack: %s has no static replay buffer entry points: rebuild the "
                          "target rollpack_trainer" % _capi.library_path())


def _num_experts(num_experts: Optional[int], spec: Optional[Any]) -> int:
    if spec is not None:
        e = int(getattr(spec, "num_experts"))
        if num_experts is not None and int(num_experts) != e:
            raise ValueError("num_experts=%d but spec.num_experts=%d" % (num_experts, e))
        num_experts = e
    if num_experts is None:
        raise ValueError("num_experts (the model's E, for the filler ids) or spec is required")
    return int(num_experts)


def _buffer_shape(buffer: torch.Tensor) -> Tuple[int, int, int, int, int]:
    """(max_rows, layers, K, row_stride, layer_stride) of a [max_rows,
    layers, K] view whose K axis is contiguous."""
    if not isinstance(buffer, torch.Tensor) or buffer.dim() != 3:
        raise ValueError("buffer must be a [max_rows, layers, K] tensor, got %s"
                         % (tuple(buffer.shape) if isinstance(buffer, torch.Tensor)
                            else type(buffer).__name__,))
    if buffer.dtype not in _OUT:
        raise TypeError("buffer must be int64 or int32, got %s" % buffer.dtype)
    max_rows, layers, k = (int(x) for x in buffer.shape)
    if k > 1 and buffer.stride(2) != 1:
        raise ValueError("buffer's K axis must be contiguous (stride 1), got strides %s"
                         % (tuple(buffer.stride()),))
    return max_rows, layers, k, int(buffer.stride(0)), int(buffer.stride(1))


def _where(t: torch.Tensor, stream: StreamLike) -> Tuple[int, int]:
    """(device index or -1, raw stream handle) for work on tensor t."""
    if t.device.type == "cpu":
        return -1, 0
    if t.device.type != "cuda":
        raise ValueError("buffer must be on the CPU or a CUDA device, got %s" % t.device)
    if stream is None:
        stream = torch.cuda.current_stream(t.device)
    handle = stream if isinstance(stream, int) else stream.cuda_stream
    return t.device.index, int(handle)


def _check_batch(mb: Any, max_rows: int, layers: int, k: int, device: torch.device) -> int:
    """The micro-batch's router rows, after the checks both paths share."""
    ex = mb.replay_experts
    index = getattr(mb, "index", "?")
    if ex.dim() != 3 or ex.dtype not in _IN:
        raise ValueError("micro-batch %s has no replay_experts [rows, layers, K] uint8/int16 "
                         "(got %s %s): a dense model has nothing to write"
                         % (index, ex.dtype, tuple(ex.shape)))
    rows, mb_layers, mb_k = (int(x) for x in ex.shape)
    if rows > max_rows:
        raise ValueError("micro-batch %s has %d router rows but the static buffer holds "
                         "max_rows = %d" % (index, rows, max_rows))
    if mb_layers != layers:
        raise ValueError("micro-batch %s has %d replay layers but the static buffer has %d"
                         % (index, mb_layers, layers))
    if mb_k != k:
        raise ValueError("micro-batch %s has K = %d but the static buffer has K = %d"
                         % (index, mb_k, k))
    if ex.device != device:
        raise ValueError("micro-batch %s is on %s but the static buffer is on %s"
                         % (index, ex.device, device))
    # The kernels read raw pointers asynchronously: a contiguous copy made
    # here could be freed before they run. Received arrays are contiguous.
    if not ex.is_contiguous():
        raise ValueError("micro-batch %s: replay_experts must be contiguous, got strides %s"
                         % (index, tuple(ex.stride())))
    return rows


def _mask_of(mb: Any, rows: int) -> Optional[torch.Tensor]:
    m = getattr(mb, "replay_mask", None)
    if m is None:
        return None  # no mask: every row replays
    if m.dtype == torch.bool:
        m = m.view(torch.uint8)
    if m.dtype != torch.uint8 or m.numel() != rows:
        # A mask that is there but cannot be read is an error, not "replay
        # every row": masked_fill_minus_one would silently send filler ids.
        raise ValueError("micro-batch %s: replay_mask must be uint8 (or bool) with %d rows, "
                         "got %s with %d" % (getattr(mb, "index", "?"), rows, m.dtype, m.numel()))
    if not m.is_contiguous():
        raise ValueError("micro-batch %s: replay_mask must be contiguous"
                         % getattr(mb, "index", "?"))
    return m


def write_replay_targets(mb: Any, buffer: torch.Tensor, stream: StreamLike = None, *,
                         num_experts: Optional[int] = None, spec: Optional[Any] = None,
                         masked_fill_minus_one: bool = False) -> int:
    """Writes micro-batch ``mb``'s replay targets into ``buffer``.

    mb: a rollpack Microbatch (its received ``replay_experts`` [rows, layers,
    K] and ``replay_mask``, on the buffer's device). buffer: [max_rows,
    layers, K] int64 (what Megatron gathers with) or int32, any view whose K
    axis is contiguous (a slice of a larger buffer works); ``buffer[r, l]``
    becomes local layer l's target for row r, identical to
    ``mb.replay_indices[l, r]``, and rows >= rows get filler ids.
    num_experts (or a ModelSpec ``spec``): the model's E. stream: a
    torch.cuda.Stream or raw handle, default the current stream.
    masked_fill_minus_one: as TrainerClient's (rows with mask 0 become -1).

    One kernel launch on ``stream``, no allocation, no synchronisation: safe
    to call while the stream is captured, but the graph then replays this
    micro-batch's pointers; StaticReplayTargets is the reusable form.
    ValueError, naming both numbers, when the micro-batch has more router
    rows than max_rows or another layer count or K. Returns the router rows.
    """
    _need_library()
    e = _num_experts(num_experts, spec)
    max_rows, layers, k, rs, ls = _buffer_shape(buffer)
    rows = _check_batch(mb, max_rows, layers, k, buffer.device)
    ex = mb.replay_experts
    mask = _mask_of(mb, rows)
    device, handle = _where(buffer, stream)
    call(_capi.unpack_static, "write_replay_targets", device, ex.data_ptr(), _IN[ex.dtype],
         mask.data_ptr() if mask is not None else 0, rows, 0, layers, k, e, buffer.data_ptr(),
         _OUT[buffer.dtype], max_rows, rs, ls, masked_fill_minus_one, handle)
    return rows


class StaticReplayTargets:
    """A static buffer and the fixed staging memory a captured graph reads
    the current micro-batch from.

    ``write()`` is the capturable part: one kernel that reads the staging
    (ids, mask, and the row count as a device scalar) and writes every row of
    ``buffer``. ``stage(mb)`` runs outside the capture before each replay:
    two device-to-device copies of the micro-batch's received bytes (1 or 2
    bytes per id, against 8 per target) and a one-thread kernel storing its
    row count. Both are stream-ordered; neither allocates or synchronises.

    buffer: as write_replay_targets. in_dtype: the received ids' dtype,
    torch.uint8 (E <= 256, the default then) or torch.int16 (uint16 ids).
    The staging (max_rows * layers * K bytes or twice that) is allocated
    here, once. Until the first stage the row count is 0: write() fills the
    buffer with filler ids.
    """

    def __init__(self, buffer: torch.Tensor, num_experts: Optional[int] = None, *,
                 spec: Optional[Any] = None, in_dtype: Optional[torch.dtype] = None,
                 masked_fill_minus_one: bool = False) -> None:
        _need_library()
        self.num_experts = _num_experts(num_experts, spec)
        self.buffer = buffer
        self.max_rows, self.layers, self.k, self._rs, self._ls = _buffer_shape(buffer)
        if in_dtype is None:
            in_dtype = torch.uint8 if self.num_experts <= 256 else torch.int16
        if in_dtype not in _IN:
            raise TypeError("in_dtype must be torch.uint8 or torch.int16, got %s" % in_dtype)
        self.masked_fill_minus_one = bool(masked_fill_minus_one)
        dev = buffer.device
        self.experts = torch.zeros((self.max_rows, self.layers, self.k), dtype=in_dtype,
                                   device=dev)
        self.mask = torch.ones((self.max_rows,), dtype=torch.uint8, device=dev)
        self.rows = torch.zeros((1,), dtype=torch.int64, device=dev)
        self.staged_rows = 0  # host copy of what the last stage() stored

    def stage(self, mb: Any, stream: StreamLike = None) -> int:
        """Copies ``mb``'s received ids and mask into the staging and stores
        its row count, on ``stream`` (default current). Not capturable (the
        source pointers are the micro-batch's). Refused (ValueError naming both
        numbers) like write_replay_targets, or when mb's id dtype differs from
        the staging's. Returns the router rows."""
        rows = _check_batch(mb, self.max_rows, self.layers, self.k, self.buffer.device)
        ex = mb.replay_experts
        if ex.dtype != self.experts.dtype:
            raise ValueError("micro-batch %s holds %s ids but the staging is %s"
                             % (getattr(mb, "index", "?"), ex.dtype, self.experts.dtype))
        device, handle = _where(self.buffer, stream)
        mask = _mask_of(mb, rows)
        index = getattr(mb, "index", -1)
        # One library call: two device-to-device copies and the row count's
        # one-thread kernel (torch copies from Python cost more than the
        # copies themselves at these sizes).
        call(_capi.stage_static, "StaticReplayTargets.stage", device, ex.data_ptr(),
             _IN[ex.dtype], mask.data_ptr() if mask is not None else 0, rows, self.layers, self.k,
             index if isinstance(index, int) else -1, self.experts.data_ptr(),
             _IN[self.experts.dtype], self.mask.data_ptr(), self.rows.data_ptr(), self.max_rows,
             handle)
        self.staged_rows = rows
        return rows

    def write(self, stream: StreamLike = None) -> None:
        """The capturable kernel: ``buffer`` from the staging, for the row
        count stored on the device when it runs."""
        device, handle = _where(self.buffer, stream)
        call(_capi.unpack_static, "StaticReplayTargets.write", device, self.experts.data_ptr(),
             _IN[self.experts.dtype], self.mask.data_ptr(), 0, self.rows.data_ptr(), self.layers,
             self.k, self.num_experts, self.buffer.data_ptr(), _OUT[self.buffer.dtype],
             self.max_rows, self._rs, self._ls, self.masked_fill_minus_one, handle)

    def __call__(self, mb: Any, stream: StreamLike = None) -> int:
        """stage(mb) then write(): the eager form, same result."""
        rows = self.stage(mb, stream)
        self.write(stream)
        return rows


def install_static_buffer(buffer: Union[torch.Tensor, StaticReplayTargets],
                          instances: Optional[Any] = None, *, rows: Optional[int] = None,
                          action: Optional[Any] = None, num_mtp_layers: Optional[int] = None,
                          mtp_routing: Optional[bool] = None, spec: Optional[Any] = None) -> int:
    """Points each local MoE layer's RouterReplay at its view of ``buffer``.

    buffer: [max_rows, layers, K] (or a StaticReplayTargets). Each replaying
    instance gets ``view = buffer[:, l, :]`` through ``set_static_buffer``
    (what Megatron's ``RouterReplay.set_global_static_buffers`` does; a
    RECORD pass then records into the same memory) and as its target through
    ``set_target_indices(view[:rows])`` (rows None = all max_rows rows, the
    shape a graph captured for max_rows tokens routes), plus ``action`` if
    given. Views only: nothing is copied or allocated, so later writes into
    the buffer are what the routers read. Megatron appends each target to a
    list the recompute backward pops: call this once per micro-batch forward,
    as install_replay_targets. instances, num_mtp_layers, mtp_routing, spec:
    as install_replay_targets (MTP routers without MTP routing are left in
    live routing). Returns the number of layers set.
    """
    if isinstance(buffer, StaticReplayTargets):
        buffer = buffer.buffer
    max_rows, layers, _, _, _ = _buffer_shape(buffer)
    if rows is not None and not 0 <= int(rows) <= max_rows:
        raise ValueError("rows=%d is outside the static buffer's [0, max_rows = %d]"
                         % (rows, max_rows))
    d, routing = _mtp_of(spec, num_mtp_layers, mtp_routing)
    replayed, live = _split_instances("install_static_buffer", layers, _instance_list(instances),
                                      d, routing)
    for l, inst in enumerate(replayed):
        view = buffer[:, l, :]
        set_static = getattr(inst, "set_static_buffer", None)
        if set_static is not None:
            set_static(view)
        inst.set_target_indices(view if rows is None else view[:int(rows)])
        if action is not None:
            inst.set_router_replay_action(action)
    for inst in live:
        _leave_live(inst)
        clear = getattr(inst, "clear_static_buffer", None)
        if clear is not None:
            clear()
    return len(replayed)
