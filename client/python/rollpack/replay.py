"""Routing replay on torch tensors through rollpack's kernels
(kernels/replay_kernels.h): CUDA tensors run the CUDA kernels on the current
stream, CPU tensors the CPU reference (float64 inside). No libtorch is
linked: the kernels get pointers, shapes and dtypes from the tensors.

- apply_replay(logits, ids, ...): router probabilities at the replayed
  experts (+ routing map), differentiable w.r.t. the logits;
- routing_agreement(live, replay, ...): per-layer fraction of rows whose
  live top-K set differs from the replayed one, and the mean overlap;
- install_replay_targets(targets, instances): hands every local MoE layer
  its [rows, K] target through RouterReplay.set_target_indices, in order,
  leaving MTP routers live when the samples carry no MTP routing
  (docs/layout.md section 10); set_replay_action sets an action (e.g.
  REPLAY_BACKWARD) on the same instances;
- recorded_routing(instances, layers=mb): the rank's RECORD-mode routing as
  one [rows, layers, K] tensor in replay_layers order, for a recompute
  routing (R2) upload (docs/layout.md section 11).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

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


def _instance_list(instances: Optional[Any]) -> List[Any]:
    if instances is None:
        instances = _default_instances()
    elif hasattr(instances, "global_router_replay_instances"):
        instances = instances.global_router_replay_instances
    return list(instances)


def _mtp_of(spec: Optional[Any], num_mtp_layers: Optional[int],
            mtp_routing: Optional[bool]) -> Tuple[int, Optional[bool]]:
    """(D, mtp_routing) from the keywords and/or a ModelSpec; mtp_routing None
    = not known (both MTP cases are accepted then)."""
    if spec is not None:
        # getattr: ModelSpecs of packages without MTP fields mean D = 0.
        spec_d = int(getattr(spec, "num_mtp_layers", 0) or 0)
        spec_routing = bool(getattr(spec, "mtp_routing", False))
        if num_mtp_layers is not None and int(num_mtp_layers) != spec_d:
            raise ValueError("num_mtp_layers=%d but spec.num_mtp_layers=%d"
                             % (num_mtp_layers, spec_d))
        if mtp_routing is not None and bool(mtp_routing) != spec_routing:
            raise ValueError("mtp_routing=%s but spec.mtp_routing=%s" % (mtp_routing, spec_routing))
        num_mtp_layers, mtp_routing = spec_d, spec_routing
    d = int(num_mtp_layers or 0)
    if d < 0:
        raise ValueError("num_mtp_layers must be >= 0, got %d" % d)
    if mtp_routing and d == 0:
        raise ValueError("mtp_routing=True needs num_mtp_layers >= 1, got 0")
    return d, mtp_routing


def _split_instances(what: str, num_targets: int, instances: List[Any], d: int,
                     mtp_routing: Optional[bool]) -> Tuple[List[Any], List[Any]]:
    """(instances that get targets, MTP instances left in live routing), by
    layout.md section 10: the last stage's RouterReplay instances are its
    decoder replay layers, then its D MTP routers."""
    n = len(instances)
    if num_targets == n:
        return instances, []
    if d > 0 and num_targets + d == n:
        if mtp_routing:
            raise ValueError(
                "%s: %d replay layers and %d RouterReplay instances on this rank with "
                "num_mtp_layers=%d and mtp_routing: the last stage's replay layers should include "
                "its %d MTP layers (is the pool registered with mtp_routing?)"
                % (what, num_targets, n, d, d))
        return instances[:num_targets], instances[num_targets:]
    raise ValueError(
        "%s: %d replay layers but %d RouterReplay instances on this rank (num_mtp_layers=%d: "
        "expected %d instances, or %d on the last stage with its MTP routers in live routing)"
        % (what, num_targets, n, d, num_targets, num_targets + d) if d > 0 else
        "%s: %d replay layers but %d RouterReplay instances on this rank (num_mtp_layers=0)"
        % (what, num_targets, n))


def _check_mtp_layers(what: str, layers: Sequence[int], spec: Optional[Any], d: int) -> None:
    """With a spec, the replay layers >= N are the MTP layers: none or all D."""
    if spec is None or not layers:
        return
    n = int(getattr(spec, "num_layers", 0) or 0)
    mtp = [l for l in layers if l >= n]
    if mtp and mtp != list(range(n, n + d)):
        raise ValueError("%s: replay_layers %s hold MTP layers %s but the model has "
                         "num_layers=%d and num_mtp_layers=%d"
                         % (what, list(layers), mtp, n, d))


def _leave_live(inst: Any) -> None:
    # Clears a target and action left by an earlier install or a global
    # set_router_replay_action: an MTP router without MTP routing must route
    # live, never replay a stale target (nor pop from an empty backward list).
    clear_action = getattr(inst, "clear_router_replay_action", None)
    if clear_action is not None:
        clear_action()
    else:
        inst.set_router_replay_action(None)
    clear = getattr(inst, "clear_indices", None)
    if clear is not None:
        clear()
    else:
        if hasattr(inst, "target_topk_idx"):
            inst.target_topk_idx = None
        if hasattr(inst, "replay_backward_list"):
            inst.replay_backward_list = []


def install_replay_targets(targets: Union[Any, torch.Tensor, Sequence[torch.Tensor]],
                           instances: Optional[Any] = None, *, action: Optional[Any] = None,
                           dtype: torch.dtype = torch.int64, num_mtp_layers: Optional[int] = None,
                           mtp_routing: Optional[bool] = None, spec: Optional[Any] = None) -> int:
    """Gives each local MoE layer's router its replay target, in layer order.

    targets: a rollpack Microbatch (its replay_indices), a [layers, rows, K]
    tensor, or a sequence of [rows, K] tensors. instances: a list of objects
    with ``set_target_indices(tensor)`` (Megatron's RouterReplay instances of
    this rank, in instantiation order = ascending MoE layer id, then the MTP
    routers), or a class with ``global_router_replay_instances``; default
    Megatron's RouterReplay. action: optional value passed to each target
    instance's ``set_router_replay_action``. Targets are converted to
    ``dtype`` (Megatron gathers with them, which needs int64).

    MTP routers (docs/layout.md section 10): ``num_mtp_layers`` D and
    ``mtp_routing``, or a ``spec`` (rollpack.ModelSpec) holding them. When the
    targets and instances are as many, every instance gets its target (with
    mtp_routing the last stage's targets end with MTP layers N..N+D-1). When
    targets + D == instances (the last stage, samples without MTP routing),
    the decoder routers get theirs and the last D instances are left in live
    routing: their target and action are cleared. Anything else is refused
    naming the three numbers. Returns the number of layers set.
    """
    d, routing = _mtp_of(spec, num_mtp_layers, mtp_routing)
    if hasattr(targets, "replay_layers"):
        _check_mtp_layers("install_replay_targets", list(targets.replay_layers), spec, d)
    if hasattr(targets, "replay_indices"):
        targets = targets.replay_indices
    if isinstance(targets, torch.Tensor):
        if targets.dim() != 3:
            raise ValueError("targets must be [layers, rows, K], got %s" % (tuple(targets.shape),))
        per_layer = list(targets.unbind(0))
    else:
        per_layer = list(targets)
    for t in per_layer:
        if t.dim() != 2:
            raise ValueError("each target must be [rows, K], got %s" % (tuple(t.shape),))
    replayed, live = _split_instances("install_replay_targets", len(per_layer),
                                      _instance_list(instances), d, routing)
    for inst, t in zip(replayed, per_layer):
        inst.set_target_indices(t if t.dtype == dtype else t.to(dtype))
        if action is not None:
            inst.set_router_replay_action(action)
    for inst in live:
        _leave_live(inst)
    return len(per_layer)


def _num_layers_of(layers: Any) -> int:
    if hasattr(layers, "replay_layers"):
        return len(layers.replay_layers)
    if isinstance(layers, torch.Tensor):
        if layers.dim() != 3:
            raise ValueError("layers as a tensor must be [layers, rows, K], got %s"
                             % (tuple(layers.shape),))
        return int(layers.shape[0])
    if isinstance(layers, int):
        return layers
    return len(list(layers))


def set_replay_action(action: Any, layers: Any, instances: Optional[Any] = None, *,
                      num_mtp_layers: Optional[int] = None, mtp_routing: Optional[bool] = None,
                      spec: Optional[Any] = None) -> int:
    """Sets ``action`` on the instances that replay and leaves MTP routers
    without targets in live routing, with the split rule of
    install_replay_targets. Use it where Megatron's
    ``RouterReplay.set_global_router_replay_action`` would reach MTP routers
    that have no target, e.g. before the activation-recompute backward:
    ``set_replay_action(RouterReplayAction.REPLAY_BACKWARD, mb)``.

    layers: the Microbatch, its replay_layers, a [layers, rows, K] tensor or
    the number of replay layers. Returns the number of instances set.
    """
    d, routing = _mtp_of(spec, num_mtp_layers, mtp_routing)
    replayed, live = _split_instances("set_replay_action", _num_layers_of(layers),
                                      _instance_list(instances), d, routing)
    for inst in replayed:
        inst.set_router_replay_action(action)
    for inst in live:
        clear_action = getattr(inst, "clear_router_replay_action", None)
        if clear_action is not None:
            clear_action()
        else:
            inst.set_router_replay_action(None)
    return len(replayed)


def recorded_routing(instances: Optional[Any] = None, *, layers: Optional[Any] = None,
                     num_mtp_layers: Optional[int] = None, mtp_routing: Optional[bool] = None,
                     spec: Optional[Any] = None, dtype: Optional[torch.dtype] = None,
                     sort_ids: bool = False) -> torch.Tensor:
    """The routing this rank's routers recorded, as one [rows, layers, K]
    tensor in ``replay_layers`` order: what a recompute-routing (R2) upload
    takes (docs/layout.md section 11).

    Run the micro-batch's forward with RouterReplayAction.RECORD, then call
    this before the next micro-batch's forward overwrites the recordings.
    instances: as install_replay_targets (default Megatron's RouterReplay).
    layers: the Microbatch (its router rows and K are checked too), its
    replay_layers, or their number: with num_mtp_layers D and no
    mtp_routing, the last D instances of the last stage are MTP routers that
    are not part of the upload, and only ``layers`` tells the stages apart.
    Without ``layers``, every instance is taken (D = 0 or mtp_routing).
    The recorded dtype is kept unless ``dtype`` is given.

    sort_ids: sort each row's K ids ascending. The order within K carries no
    routing meaning (replay gathers the scores at the K ids; the routing map
    is a set), and Megatron's top-k is unsorted under no_grad (a recompute
    forward), so the order on CUDA is whatever torch.topk left: sorting
    makes two ranks' copies of the same rows byte-identical.
    """
    d, routing = _mtp_of(spec, num_mtp_layers, mtp_routing)
    insts = _instance_list(instances)
    if layers is not None:
        if hasattr(layers, "replay_layers"):
            _check_mtp_layers("recorded_routing", list(layers.replay_layers), spec, d)
        insts, _ = _split_instances("recorded_routing", _num_layers_of(layers), insts, d, routing)
    elif d > 0 and not routing:
        raise ValueError("recorded_routing: num_mtp_layers=%d without mtp_routing: pass layers= "
                         "(the micro-batch or its replay_layers) to tell MTP routers apart" % d)
    mb_shape = None
    if layers is not None and hasattr(layers, "replay_indices"):
        mb_shape = tuple(layers.replay_indices.shape[1:])  # (router rows, K)
    recorded = []
    for i, inst in enumerate(insts):
        r = inst.get_recorded_indices()
        if r is None:
            raise ValueError("recorded_routing: RouterReplay instance %d of %d recorded nothing "
                             "(run the forward with RouterReplayAction.RECORD first)"
                             % (i, len(insts)))
        if r.dim() != 2:
            raise ValueError("recorded_routing: instance %d recorded %s, expected [rows, K]"
                             % (i, tuple(r.shape)))
        if recorded and tuple(r.shape) != tuple(recorded[0].shape):
            raise ValueError("recorded_routing: instance %d recorded %s but instance 0 %s"
                             % (i, tuple(r.shape), tuple(recorded[0].shape)))
        if mb_shape is not None and tuple(r.shape) != mb_shape:
            raise ValueError("recorded_routing: instance %d recorded %s but the micro-batch has "
                             "[router_rows, K] = %s" % (i, tuple(r.shape), list(mb_shape)))
        recorded.append(r)
    if not recorded:
        if mb_shape is None:
            raise ValueError("recorded_routing: no RouterReplay instances: pass layers= (the "
                             "micro-batch) for a stage without MoE layers")
        ref = layers.replay_indices
        return torch.empty((mb_shape[0], 0, mb_shape[1]), dtype=dtype or torch.int64,
                           device=ref.device)
    out = torch.stack(recorded, dim=1)
    if sort_ids:
        out = torch.sort(out, dim=2)[0]
    return out if dtype is None or out.dtype == dtype else out.to(dtype)
