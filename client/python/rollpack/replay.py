"""Routing replay on torch tensors through rollpack's kernels
(kernels/replay_kernels.h): CUDA tensors run the CUDA kernels on the current
stream, CPU tensors the CPU reference (float64 inside). No libtorch is
linked: the kernels get pointers, shapes and dtypes from the tensors.

- apply_replay(logits, ids, ...): router probabilities at the replayed
  experts (+ routing map), differentiable w.r.t. the logits;
- routing_agreement(live, replay, ...): per-layer fraction of rows whose
  live top-K set differs from the replayed one, and the mean overlap;
- install_replay_targets(targets, instances): hands every local MoE layer
  its [rows, K] target through RouterReplay.set_target_indices, in order.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union

import torch

from rollpack import _capi
from rollpack._capi import call

_INDEX = {torch.uint8: 0, torch.int16: 1, torch.int32: 2, torch.int64: 3}
_FLOAT = {torch.float32: 0, torch.bfloat16: 1}
_SCORE = {"softmax": 0, "sigmoid": 1}


def _where(t):
    if t.is_cuda:
        return t.device.index, torch.cuda.current_stream(t.device).cuda_stream
    if t.device.type != "cpu":
        raise ValueError("tensors must be on the CPU or a CUDA device, got %s" % t.device)
    return -1, 0


def _index_code(t, what):
    if t.dtype not in _INDEX:
        raise TypeError("%s: ids must be uint8, int16 (uint16 ids), int32 or int64, got %s"
                        % (what, t.dtype))
    return _INDEX[t.dtype]


def _check_same_device(*ts):
    d = ts[0].device
    for t in ts[1:]:
        if t is not None and t.device != d:
            raise ValueError("all tensors must be on %s, got one on %s" % (d, t.device))


class _ApplyReplay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, ids, score, renormalize, scale):
        rows, e = logits.shape
        k = ids.shape[1]
        device, stream = _where(logits)
        probs = torch.empty((rows, k), dtype=torch.float32, device=logits.device)
        rmap = torch.empty((rows, e), dtype=torch.uint8, device=logits.device)
        call(_capi.apply_forward, "apply_replay", device, logits.data_ptr(),
             _FLOAT[logits.dtype], ids.data_ptr(), _index_code(ids, "apply_replay"),
             ids.stride(0), rows, e, k, score, renormalize, float(scale), probs.data_ptr(),
             rmap.data_ptr(), 0, stream)
        ctx.save_for_backward(logits, ids)
        ctx.args = (score, renormalize, float(scale))
        ctx.mark_non_differentiable(rmap)
        return probs, rmap

    @staticmethod
    def backward(ctx, grad_probs, grad_map):
        logits, ids = ctx.saved_tensors
        score, renormalize, scale = ctx.args
        rows, e = logits.shape
        g = grad_probs.to(torch.float32).contiguous()
        grad_logits = torch.empty_like(logits)
        device, stream = _where(logits)
        call(_capi.apply_backward, "apply_replay backward", device, logits.data_ptr(),
             _FLOAT[logits.dtype], ids.data_ptr(), _index_code(ids, "apply_replay"),
             ids.stride(0), rows, e, ids.shape[1], score, renormalize, scale, g.data_ptr(),
             grad_logits.data_ptr(), stream)
        return grad_logits, None, None, None, None


def apply_replay(logits: torch.Tensor, ids: torch.Tensor, *, score: str = "softmax",
                 renormalize: bool = True, scale: float = 1.0, dense: bool = False
                 ) -> Union[Tuple[torch.Tensor, torch.Tensor],
                            Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Router outputs for replayed experts.

    logits: [rows, E] float32 or bfloat16 (live router logits); ids: [rows, K]
    replayed expert ids (uint8 / int16 / int32 / int64; rows may be strided).
    score "softmax" (over all E) or "sigmoid"; renormalize divides by the sum
    over the K picks (softmax + renormalize = Megatron's top-k-then-softmax,
    sigmoid + renormalize = DeepSeek-V3). Returns (probs [rows, K] float32,
    routing_map [rows, E] bool), plus probs_dense [rows, E] float32 with
    dense=True. probs (and probs_dense) are differentiable w.r.t. logits; the
    backward is the analytic kernel.
    """
    if score not in _SCORE:
        raise ValueError("score must be softmax or sigmoid, got %r" % (score,))
    if logits.dim() != 2 or ids.dim() != 2 or ids.shape[0] != logits.shape[0]:
        raise ValueError("logits [rows, E] and ids [rows, K] expected, got %s and %s"
                         % (tuple(logits.shape), tuple(ids.shape)))
    if logits.dtype not in _FLOAT:
        raise TypeError("logits must be float32 or bfloat16, got %s" % logits.dtype)
    _check_same_device(logits, ids)
    logits_c = logits.contiguous()
    if ids.stride(1) != 1:
        ids = ids.contiguous()
    probs, rmap = _ApplyReplay.apply(logits_c, ids, _SCORE[score], bool(renormalize), scale)
    rmap = rmap.view(torch.bool)
    if not dense:
        return probs, rmap
    dense_probs = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device)
    dense_probs = dense_probs.scatter(1, ids.long(), probs)
    return probs, rmap, dense_probs


class Agreement:
    """Per-layer agreement counts (int64 CPU tensors [layers]) and ratios."""

    __slots__ = ("rows_counted", "rows_differ", "overlap_sum", "k")

    rows_counted: torch.Tensor
    rows_differ: torch.Tensor
    overlap_sum: torch.Tensor
    k: int

    def __init__(self, stats: torch.Tensor, k: int) -> None:
        self.rows_counted, self.rows_differ, self.overlap_sum = stats.cpu().unbind(1)
        self.k = k

    @property
    def fraction_differ(self) -> float:
        """Over all layers: rows whose sets differ / rows counted."""
        n = int(self.rows_counted.sum())
        return float(self.rows_differ.sum()) / n if n else 0.0

    @property
    def mean_overlap(self) -> float:
        """Over all layers: |live & replay| / (rows counted * K) (1.0 = identical)."""
        n = int(self.rows_counted.sum())
        return float(self.overlap_sum.sum()) / (n * self.k) if n else 0.0

    @property
    def agreement(self) -> float:
        """1 - fraction_differ: the fraction of rows routed exactly as replayed."""
        return 1.0 - self.fraction_differ

    def per_layer_fraction_differ(self) -> torch.Tensor:
        """float64 [layers]: rows whose sets differ / rows counted, per layer."""
        n = self.rows_counted.double()
        return torch.where(n > 0, self.rows_differ.double() / n.clamp(min=1), torch.zeros_like(n))

    def __repr__(self) -> str:
        return "Agreement(layers=%d, rows=%d, fraction_differ=%.6f, mean_overlap=%.6f)" % (
            self.rows_counted.numel(), int(self.rows_counted.sum()), self.fraction_differ,
            self.mean_overlap)


def _as_layers(t, what):
    if t.dim() == 2:
        return t.unsqueeze(0)
    if t.dim() != 3:
        raise ValueError("%s must be [rows, X] or [layers, rows, X], got %s"
                         % (what, tuple(t.shape)))
    return t


def routing_agreement(live: torch.Tensor, replay: torch.Tensor, *,
                      mask: Optional[torch.Tensor] = None, k: Optional[int] = None
                      ) -> Agreement:
    """Routing agreement of live routing vs the replayed ids, per layer.

    live: router logits [rows, E] / [layers, rows, E] (float32 / bfloat16;
    the live set is their top-K, ties to the lower id) or live ids [rows, K] /
    [layers, rows, K]. replay: ids [rows, K] / [layers, rows, K], any strides
    with the K axis contiguous (so ``mb.replay_experts.permute(1, 0, 2)``
    works without a copy). mask: uint8/bool [rows], rows with 0 are not
    counted. Returns an Agreement.
    """
    replay3 = _as_layers(replay, "replay")
    live3 = _as_layers(live, "live")
    layers, rows, kk = replay3.shape
    if k is not None and k != kk:
        raise ValueError("k=%d but replay has K=%d" % (k, kk))
    if live3.shape[0] != layers or live3.shape[1] != rows:
        raise ValueError("live %s and replay %s disagree on layers/rows"
                         % (tuple(live3.shape), tuple(replay3.shape)))
    _check_same_device(live3, replay3, mask)
    if replay3.stride(2) != 1:
        replay3 = replay3.contiguous()
    m = None
    if mask is not None:
        if mask.shape != (rows,):
            raise ValueError("mask must be [rows]=[%d], got %s" % (rows, tuple(mask.shape)))
        m = mask.to(torch.uint8).contiguous()
    device, stream = _where(replay3)
    stats = torch.zeros((layers, 3), dtype=torch.int64, device=replay3.device)
    if live3.is_floating_point():
        if live3.dtype not in _FLOAT:
            live3 = live3.float()
        e = live3.shape[2]
        if live3.stride(2) != 1 or live3.stride(1) != e:
            live3 = live3.contiguous()
        call(_capi.agreement_logits, "routing_agreement", device, live3.data_ptr(),
             _FLOAT[live3.dtype], live3.stride(0), replay3.data_ptr(),
             _index_code(replay3, "replay"), replay3.stride(1), replay3.stride(0),
             m.data_ptr() if m is not None else 0, rows, layers, e, kk, stats.data_ptr(),
             stream)
    else:
        if live3.shape[2] != kk:
            raise ValueError("live ids have K=%d, replay K=%d" % (live3.shape[2], kk))
        if live3.stride(2) != 1:
            live3 = live3.contiguous()
        call(_capi.agreement_ids, "routing_agreement", device, live3.data_ptr(),
             _index_code(live3, "live"), live3.stride(1), live3.stride(0), replay3.data_ptr(),
             _index_code(replay3, "replay"), replay3.stride(1), replay3.stride(0),
             m.data_ptr() if m is not None else 0, rows, layers, kk, stats.data_ptr(), stream)
    return Agreement(stats, kk)


def _default_instances():
    try:
        from megatron.core.transformer.moe.router_replay import RouterReplay
    except ImportError:
        raise ValueError("install_replay_targets: pass `instances` (Megatron is not importable)")
    return RouterReplay.global_router_replay_instances


def install_replay_targets(targets: Union[Any, torch.Tensor, Sequence[torch.Tensor]],
                           instances: Optional[Any] = None, *, action: Optional[Any] = None,
                           dtype: torch.dtype = torch.int64) -> int:
    """Gives each local MoE layer's router its replay target, in layer order.

    targets: a rollpack Microbatch (its replay_indices), a [layers, rows, K]
    tensor, or a sequence of [rows, K] tensors. instances: a list of objects
    with ``set_target_indices(tensor)`` (Megatron's RouterReplay instances of
    this rank, in instantiation order = ascending MoE layer id), or a class
    with ``global_router_replay_instances``; default Megatron's RouterReplay.
    action: optional value passed to each instance's
    ``set_router_replay_action``. Targets are converted to ``dtype`` (Megatron
    gathers with them, which needs int64). Returns the number of layers set.
    """
    if hasattr(targets, "replay_indices"):
        targets = targets.replay_indices
    if isinstance(targets, torch.Tensor):
        if targets.dim() != 3:
            raise ValueError("targets must be [layers, rows, K], got %s" % (tuple(targets.shape),))
        per_layer = list(targets.unbind(0))
    else:
        per_layer = list(targets)
    if instances is None:
        instances = _default_instances()
    elif hasattr(instances, "global_router_replay_instances"):
        instances = instances.global_router_replay_instances
    instances = list(instances)
    if len(per_layer) != len(instances):
        raise ValueError("%d replay layers but %d RouterReplay instances on this rank"
                         % (len(per_layer), len(instances)))
    for inst, t in zip(instances, per_layer):
        if t.dim() != 2:
            raise ValueError("each target must be [rows, K], got %s" % (tuple(t.shape),))
        inst.set_target_indices(t if t.dtype == dtype else t.to(dtype))
        if action is not None:
            inst.set_router_replay_action(action)
    return len(per_layer)
