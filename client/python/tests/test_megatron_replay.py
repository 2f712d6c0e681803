"""Replay targets driven through Megatron-core's RouterReplay interface, on
CPU torch, with micro-batches from a real rollpackd (issue 22):

- every rank of a cp=2 tp=2 (sequence parallel) pp=2 step of a model with
  one MTP layer (D=1), with and without the samples' MTP routing
  (docs/layout.md section 10), each rank running a 1F1B schedule: forward
  with REPLAY_FORWARD under activation checkpointing, then the recompute
  backward with REPLAY_BACKWARD, which pops the same targets;
- every replayed row equals the sample's routing where replay_mask is 1
  (an independent reference of layout.md sections 2 to 6 written here, from
  the samples put), the filler elsewhere; MTP routers replay MTP layer N
  with mtp_routing, and route live without it, even after a stale target;
- recorded_routing (RECORD) gives back exactly the micro-batch's
  replay_experts, the array an R2 upload takes (section 11);
- the same through static buffers (rollpack.static_targets), one per
  micro-batch in flight, and why: with a single buffer the recompute of a
  warm-up micro-batch replays the next one's ids;
- refusals naming the numbers.

LocalRouterReplay has exactly the interface of Megatron-core's
megatron/core/transformer/moe/router_replay.py (class-level instance list,
set_target_indices, get_recorded_indices, set_router_replay_action,
replay_backward_list, get_replay_topk with RECORD / REPLAY_FORWARD /
REPLAY_BACKWARD / None, set_static_buffer), written from that interface;
local_topk_routing is topk_routing_with_score_function's softmax path.
tests/gpu_megatron.py runs the same driver (StepFixture, drive_rank) with
Megatron-core's own classes on a GPU.
"""

import enum
import unittest
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import grpc
import numpy as np

try:
    import torch
    import torch.utils.checkpoint
except ImportError:  # pragma: no cover
    torch = None

import rollpack
from rollpack._proto import scheduler_pb2, scheduler_pb2_grpc
from tests.layout_rows import router_positions
from tests.test_trainer import _need_trainer  # noqa: F401 (skip or fail without the binding)
from tests.rollpackd import Rollpackd


# The model: N decoder layers (layer 0 dense), one MTP layer, E experts, top-K.
N, MOE, D, E, K = 4, (1, 2, 3), 1, 16, 4
TOPO = dict(dp=1, cp=2, tp=2, pp=2)
MAX_TOKENS = 256
NUM_SAMPLES = 16




# -- Megatron-core's RouterReplay interface, written from its documentation --

class LocalAction(enum.Enum):
    RECORD = "record"
    REPLAY_FORWARD = "replay_forward"
    REPLAY_BACKWARD = "replay_backward"


class LocalRouterReplay:
    """One router's replay state; every instance joins the class-level list
    in construction order (Megatron: one per TopKRouter, decoder then MTP)."""

    global_router_replay_instances: List["LocalRouterReplay"] = []

    def __init__(self) -> None:
        self.target_topk_idx = None
        self.recorded_topk_idx = None
        self.router_replay_action = None
        self.replay_backward_list = []
        self.static_buffer = None
        LocalRouterReplay.global_router_replay_instances.append(self)

    @staticmethod
    def set_global_router_replay_action(action) -> None:
        for r in LocalRouterReplay.global_router_replay_instances:
            r.set_router_replay_action(action)

    @staticmethod
    def get_recorded_data():
        return [r.get_recorded_indices() for r in LocalRouterReplay.global_router_replay_instances]

    def set_target_indices(self, topk_indices) -> None:
        self.target_topk_idx = topk_indices
        self.replay_backward_list.append(topk_indices)  # consumed FIFO by REPLAY_BACKWARD

    def get_recorded_indices(self):
        return self.recorded_topk_idx

    def clear_indices(self) -> None:
        self.target_topk_idx = None
        self.recorded_topk_idx = None
        self.replay_backward_list = []

    def set_router_replay_action(self, action) -> None:
        self.router_replay_action = action

    def clear_router_replay_action(self) -> None:
        self.router_replay_action = None

    def set_static_buffer(self, buffer) -> None:
        self.static_buffer = buffer

    def clear_static_buffer(self) -> None:
        self.static_buffer = None

    def _record(self, ids) -> None:
        if self.static_buffer is None:
            self.recorded_topk_idx = ids
        else:  # a CUDA graph records into fixed memory: copy, keep a view
            self.static_buffer[:ids.shape[0]].copy_(ids)
            self.recorded_topk_idx = self.static_buffer[:ids.shape[0]]

    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None,
                        default_compute_topk=None):
        if self.router_replay_action == LocalAction.RECORD:
            probs, ids = default_compute_topk(scores, topk, num_groups=num_groups,
                                              group_topk=group_topk)
            self._record(ids)
            return probs, ids
        if self.router_replay_action in (LocalAction.REPLAY_FORWARD, LocalAction.REPLAY_BACKWARD):
            if self.router_replay_action == LocalAction.REPLAY_FORWARD:
                ids = self.target_topk_idx
            else:
                ids = self.replay_backward_list.pop(0)
            ids = ids.to(scores.device)
            return scores.gather(1, ids), ids
        return default_compute_topk(scores, topk, num_groups, group_topk)


def local_topk_routing(logits, topk, router_replay=None):
    """(probs [rows, E], routing_map [rows, E] bool): top-K of the logits (or
    the replayed ids), softmax over the K picks, scattered back."""
    def compute(scores, k, num_groups=None, group_topk=None):
        return torch.topk(scores, k=k, dim=1)
    if router_replay is None:
        scores, ids = compute(logits, topk)
    else:
        scores, ids = router_replay.get_replay_topk(logits, topk, None, None, compute)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    dense = torch.zeros_like(logits, dtype=torch.float32).scatter(1, ids, probs)
    rmap = torch.zeros_like(logits, dtype=torch.int32).scatter(1, ids, 1).bool()
    return dense, rmap


# -- the step: samples, pools, an independent reference of the layout --------

class PoolCase:
    """One pool: its spec's MTP settings and payload layout, the samples put."""

    def __init__(self, name: str, mtp_routing: bool, compact: bool, dtype) -> None:
        self.name, self.mtp_routing, self.compact, self.dtype = name, mtp_routing, compact, dtype
        self.samples: Dict[str, rollpack.Sample] = {}

    def spec(self) -> rollpack.ModelSpec:
        return rollpack.ModelSpec(self.name, num_layers=N, moe_layers=list(MOE), num_experts=E,
                                  topk=K, num_mtp_layers=D, mtp_routing=self.mtp_routing)

    def payload_layer(self, layer: int) -> int:
        if layer >= N:  # MTP layer d = layer - N, after the decoder entries
            return (len(MOE) if self.compact else N) + layer - N
        return MOE.index(layer) if self.compact else layer

    def make_samples(self, rng: np.random.Generator) -> List[rollpack.Sample]:
        width = (len(MOE) if self.compact else N) + (D if self.mtp_routing else 0)
        routed = [self.payload_layer(l) for l in MOE] + (
            [self.payload_layer(N + d) for d in range(D)] if self.mtp_routing else [])
        out = []
        for i in range(NUM_SAMPLES):
            n = int(rng.integers(5, 200))
            tokens = rng.integers(1, 50000, size=n).astype(np.int32)
            offset = 3 if i % 4 == 1 else 0  # rows before the offset are missing
            rows = n - 1 - offset
            ex = np.argsort(rng.random((rows, width, E)), axis=2)[:, :, :K].astype(self.dtype)
            if i % 4 == 2 and np.dtype(self.dtype).kind == "i":
                ex[rows // 2][routed] = -1  # missing on every routed layer: replay_mask 0
            s = rollpack.Sample("%s-%d" % (self.name, i), tokens, ex, offset)
            self.samples[s.sample_id] = s
            out.append(s)
        return out

    def layers_of_stage(self, pp: int) -> List[int]:
        per = N // TOPO["pp"]
        layers = [l for l in MOE if pp * per <= l < (pp + 1) * per]
        if pp == TOPO["pp"] - 1 and self.mtp_routing:
            layers += list(range(N, N + D))
        return layers

    def expected(self, mb: Any, rank: Tuple[int, int, int, int]) -> Tuple[np.ndarray, np.ndarray]:
        """(ids [rows, layers, K] int64, -1 where not replayed; mask [rows])
        of this rank's router rows, from the samples put: padding (section
        2), zigzag CP (4), SP rows (5), stage layers (6, 10)."""
        _, r, t, p = rank
        positions = router_positions(mb.sample_ids, lambda sid: len(self.samples[sid].tokens),
                                     mb.local_cp_size, r, TOPO["tp"], t)
        rows = len(positions)
        layers = self.layers_of_stage(p)
        ids = np.full((rows, len(layers), K), -1, np.int64)
        mask = np.zeros(rows, np.uint8)
        for row, (sid, q) in enumerate(positions):
            s = self.samples[sid]
            j = q - s.row_offset
            if q >= len(s.tokens) or j < 0 or j >= s.routed_experts.shape[0]:
                continue
            got = s.routed_experts[j][[self.payload_layer(l) for l in layers]].astype(np.int64)
            if layers and (got == -1).all():
                continue
            ids[row], mask[row] = got, 1
        return ids, mask


class StepFixture:
    """A rollpackd with one pool and step per case: "mtp" (samples carry the
    MTP routing, compact int16 payloads) and "live" (MTP routers stay live,
    full int32 payloads)."""

    CASES = (("mtp", True, True, np.int16), ("live", False, False, np.int32),
             ("r2", True, True, np.int16))

    def __init__(self) -> None:
        self.daemon = Rollpackd()
        self.cases: Dict[str, PoolCase] = {}
        self.num_microbatches: Dict[str, int] = {}

    def start(self) -> "StepFixture":
        self.daemon.start()
        channel = grpc.insecure_channel(self.daemon.address)
        try:
            sched = scheduler_pb2_grpc.SchedulerStub(channel)
            for i, (name, mtp_routing, compact, dtype) in enumerate(self.CASES):
                case = PoolCase(name, mtp_routing, compact, dtype)
                with rollpack.Producer(self.daemon.address, name) as p:
                    p.register_model(case.spec())
                    p.put(case.make_samples(np.random.default_rng(11 + i)))
                info = sched.CreateStep(scheduler_pb2.CreateStepRequest(
                    step_id=name, pool=name, num_samples=NUM_SAMPLES,
                    topology=scheduler_pb2.Topology(max_tokens_per_rank=MAX_TOKENS, **TOPO),
                    reuse_samples=(name == "r2")),
                    timeout=60)
                self.cases[name] = case
                self.num_microbatches[name] = info.num_microbatches
        finally:
            channel.close()
        return self

    def cleanup(self) -> None:
        self.daemon.cleanup()

    @staticmethod
    def ranks():
        for cp in range(TOPO["cp"]):
            for tp in range(TOPO["tp"]):
                for pp in range(TOPO["pp"]):
                    yield (0, cp, tp, pp)


# -- the driver: one rank's step through a RouterReplay implementation --------

class Stack:
    """What a rank's pipeline stage builds: its routers, in Megatron's
    instantiation order (decoder MoE layers, then MTP routers).

    replay_cls: the RouterReplay class; action: its RouterReplayAction enum;
    make_router(): a new router, returning (its RouterReplay instance,
    route(logits) -> (probs [rows, E] differentiable, routing_map bool))."""

    def __init__(self, replay_cls: Any, action: Any,
                 make_router: Callable[[], Tuple[Any, Callable]], device: Any) -> None:
        self.replay_cls, self.action, self.make_router, self.device = (
            replay_cls, action, make_router, device)

    def build(self, num_decoder: int, num_mtp: int) -> List[Tuple[Any, Callable]]:
        self.replay_cls.global_router_replay_instances.clear()
        routers = [self.make_router() for _ in range(num_decoder + num_mtp)]
        assert [r for r, _ in routers] == list(self.replay_cls.global_router_replay_instances)
        return routers


def _fail(what: str) -> None:
    raise AssertionError(what)


def _map_of(ids: "torch.Tensor", e: int) -> "torch.Tensor":
    return torch.zeros((ids.shape[0], e), dtype=torch.bool, device=ids.device).scatter(
        1, ids.long(), True)


def _schedule(num_mb: int, stage: int, stages: int) -> List[Tuple[str, int]]:
    """Megatron's 1F1B order for one stage: warm-up forwards, one forward one
    backward, cool-down backwards (backwards in forward order)."""
    warm = min(stages - stage - 1, num_mb)
    order = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < num_mb:
        order += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    order += [("B", i) for i in range(b, num_mb)]
    return order


def torch_checkpoint(fn: Callable, x: "torch.Tensor") -> "torch.Tensor":
    """Activation checkpointing as Megatron's (reentrant): the backward pass
    runs fn again, whole."""
    return torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=True)


def drive_rank(stack: Stack, case: PoolCase, rank: Tuple[int, int, int, int],
               microbatches: Sequence[Any], *, install: Optional[Callable] = None,
               checkpoint: Callable = torch_checkpoint, seed: int = 0,
               upload: Optional[Callable] = None) -> Dict[str, int]:
    """One rank's step: install each micro-batch's targets, forward under
    activation checkpointing (REPLAY_FORWARD), recompute backward
    (REPLAY_BACKWARD) in 1F1B order; then a RECORD forward per micro-batch
    read back with recorded_routing. Raises AssertionError on any
    difference; returns counts of what was checked.

    install(mb, replay_cls, action, mtp_kwargs) -> layers set: how targets
    reach the routers (default install_replay_targets of the micro-batch;
    static_ring_installer puts them in static buffers)."""
    from rollpack.replay import install_replay_targets, recorded_routing, set_replay_action
    p = rank[3]
    last = p == TOPO["pp"] - 1
    decoder = len([l for l in case.layers_of_stage(p) if l < N])
    routers = stack.build(decoder, D if last else 0)
    instances = [r for r, _ in routers]
    mtp = dict(num_mtp_layers=D, mtp_routing=case.mtp_routing)
    live_mtp = last and not case.mtp_routing
    gen = torch.Generator().manual_seed(seed)
    counts = dict(microbatches=0, replayed_rows=0, filler_rows=0, live_rows=0, recompute_rows=0,
                  recorded_rows=0, recorded_rows_reordered=0)
    if live_mtp:  # a stale target and action left by an earlier step must not replay
        stale = torch.zeros((1, K), dtype=torch.int64, device=stack.device)
        instances[-1].set_target_indices(stale)
        instances[-1].set_router_replay_action(stack.action.REPLAY_FORWARD)
    pending: Dict[int, Any] = {}
    for kind, i in _schedule(len(microbatches), p, TOPO["pp"]):
        mb = microbatches[i]
        what = "rank %s mb %d (%s)" % (rank, mb.index, case.name)
        if kind == "F":
            if list(mb.replay_layers) != case.layers_of_stage(p):
                _fail("%s: replay_layers %s, expected %s"
                      % (what, list(mb.replay_layers), case.layers_of_stage(p)))
            want, mask = case.expected(mb, rank)
            if not np.array_equal(mb.replay_mask.cpu().numpy(), mask):
                _fail("%s: replay_mask differs from the reference" % what)
            if install is None:
                n = install_replay_targets(mb, stack.replay_cls,
                                           action=stack.action.REPLAY_FORWARD, **mtp)
            else:
                n = install(mb, stack.replay_cls, stack.action.REPLAY_FORWARD, mtp)
            if n != len(mb.replay_layers):
                _fail("%s: install_replay_targets set %d layers" % (what, n))
            rows = mb.replay_indices.shape[1]
            outs, maps, logits = [], [], []
            for l, (inst, route) in enumerate(routers):
                x = torch.randn((rows, E), generator=gen).to(stack.device).requires_grad_()
                seen: List[Any] = []

                def f(z, route=route, seen=seen):
                    probs, rmap = route(z)
                    seen.append(rmap.detach().clone())
                    return probs
                outs.append(checkpoint(f, x))
                maps.append(seen)
                logits.append(x)
                got = seen[0]
                if l < len(mb.replay_layers):
                    ids = mb.replay_indices[l]
                    if not torch.equal(got, _map_of(ids, E)):
                        _fail("%s layer %d: routing differs from the installed target"
                              % (what, mb.replay_layers[l]))
                    m = torch.from_numpy(mask.astype(bool)).to(stack.device)
                    ref = torch.from_numpy(want[:, l]).to(stack.device)
                    if not torch.equal(got[m], _map_of(ref[m], E)):
                        _fail("%s layer %d: a replayed row is not the sample's routing"
                              % (what, mb.replay_layers[l]))
                    if not torch.equal(torch.sort(ids[m].long(), 1)[0], torch.sort(ref[m], 1)[0]):
                        _fail("%s layer %d: target ids differ from the sample's routing"
                              % (what, mb.replay_layers[l]))
                    counts["replayed_rows"] += int(m.sum())
                    counts["filler_rows"] += int((~m).sum())
                else:  # an MTP router left live
                    if inst.router_replay_action is not None:
                        _fail("%s: live MTP router has action %s" % (what, inst.router_replay_action))
                    live = torch.topk(x.detach(), K, dim=1).indices
                    if not torch.equal(got, _map_of(live, E)):
                        _fail("%s MTP router: not live routing" % what)
                    counts["live_rows"] += rows
            pending[i] = (outs, maps, logits, mb)
            counts["microbatches"] += 1
        else:
            outs, maps, logits, mb = pending.pop(i)
            set_replay_action(stack.action.REPLAY_BACKWARD, mb, stack.replay_cls, **mtp)
            torch.stack([o.sum() for o in outs]).sum().backward()
            for l, seen in enumerate(maps):
                if len(seen) != 2:
                    _fail("%s layer %d: recompute ran %d times" % (what, l, len(seen) - 1))
                if not torch.equal(seen[0], seen[1]):
                    _fail("rank %s mb %d layer %d: recompute routed differently from forward"
                          % (rank, mb.index, l))
                if logits[l].grad is None:
                    _fail("rank %s mb %d layer %d: no gradient" % (rank, mb.index, l))
                counts["recompute_rows"] += seen[1].shape[0]
    if pending:
        _fail("rank %s: micro-batches %s never ran backward" % (rank, sorted(pending)))
    for inst in instances[:len(instances) - (D if live_mtp else 0)]:
        if inst.replay_backward_list:
            _fail("rank %s: %d targets left after the backward pass"
                  % (rank, len(inst.replay_backward_list)))
    # R2: a RECORD forward whose logits put each target on top; what the
    # routers recorded must be exactly the received replay_experts.
    for mb in microbatches:
        set_replay_action(stack.action.RECORD, mb, stack.replay_cls, **mtp)
        with torch.no_grad():
            for l, (inst, route) in enumerate(routers):
                rows = mb.replay_indices.shape[1]
                x = torch.randn((rows, E), generator=gen).to(stack.device)
                if l < len(mb.replay_layers):
                    # 8, 7.5, ...: above any of the normal draws, and distinct
                    # after a sigmoid too (DeepSeek-V3 style scores).
                    x = x.scatter(1, mb.replay_indices[l].long(),
                                  8.0 - 0.5 * torch.arange(K, device=stack.device,
                                                           dtype=x.dtype).expand(rows, K))
                route(x)
        rec = recorded_routing(stack.replay_cls, layers=mb, **mtp)
        ex = mb.replay_experts.long()
        if tuple(rec.shape) != tuple(ex.shape):
            _fail("rank %s mb %d: recorded_routing %s, replay_experts %s"
                  % (rank, mb.index, tuple(rec.shape), tuple(ex.shape)))
        # Megatron's top-k is unsorted under no_grad: compare each row's K
        # ids as a set, and count rows recorded in another order.
        srt = recorded_routing(stack.replay_cls, layers=mb, sort_ids=True, **mtp)
        if not torch.equal(srt.long(), torch.sort(ex, dim=2)[0]):
            _fail("rank %s mb %d: recorded_routing differs from replay_experts"
                  % (rank, mb.index))
        counts["recorded_rows"] += rec.shape[0]
        counts["recorded_rows_reordered"] += int((rec.long() != ex).any(2).any(1).sum())
        if upload is not None:  # R2: what the routers recorded, as recorded
            upload(mb, rec)
    return counts


# R2 (docs/recompute.md): a step's recorded routing back through rollpackd
# into a step of another topology, replayed there.
R2_TOPO = dict(dp=1, cp=1, tp=1, pp=1, max_tokens_per_rank=4096)


def r2_round_trip(fx: "StepFixture", stack_factory: Callable[[], Stack], trainer: Any,
                  device: Any, checkpoint: Callable = torch_checkpoint) -> Dict[str, int]:
    """Every rank of step "r2" (cp=2 tp=2 pp=2, MTP routing) drives its
    routers (drive_rank) and uploads what they recorded; the controller
    commits and releases; a step over the same samples on one rank (R2_TOPO:
    every decoder MoE layer and the MTP layer on one stage), created with
    replay_source "recompute", must deliver that routing: each real row's ids
    as a set equal the rollout's where the rollout covered the row (the RECORD
    forward put the received targets on top), K distinct ids elsewhere, mask
    1 on every real token; and replaying it through the routers routes
    exactly those ids. Returns counts."""
    from rollpack.recompute import RoutingUploader
    from rollpack.replay import install_replay_targets
    case = fx.cases["r2"]
    address = fx.daemon.address
    for rank in fx.ranks():
        mbs = list(trainer.TrainerClient(address, "r2", rank, device))
        with RoutingUploader(address, "r2", rank) as up:
            drive_rank(stack_factory(), case, rank, mbs, seed=sum(rank), checkpoint=checkpoint,
                       upload=up.upload)
    with rollpack.Controller(address) as c:
        done = c.commit_routing("r2")
        if done.samples != NUM_SAMPLES:
            _fail("commit_routing: %d samples, expected %d" % (done.samples, NUM_SAMPLES))
        c.release("r2")
        c.create_step("r2-again", "r2", topology=R2_TOPO, sample_ids=sorted(case.samples),
                      replay_source="recompute")
    counts = {"r2_rows_as_rollout": 0, "r2_rows_recorded_filler": 0, "r2_rows_replayed": 0}
    stack = stack_factory()
    layers = list(MOE) + [N + d for d in range(D)]
    routers = stack.build(len(MOE), D)
    for mb in trainer.TrainerClient(address, "r2-again", (0, 0, 0, 0), device):
        if list(mb.replay_layers) != layers:
            _fail("r2-again: replay_layers %s, expected %s" % (list(mb.replay_layers), layers))
        ids = mb.replay_experts.long().cpu().numpy()
        mask = mb.replay_mask.cpu().numpy()
        row = 0
        for sid in mb.sample_ids:  # cp = tp = 1: the padded stream is the sequences
            s = case.samples[sid]
            for q in range(len(s.tokens)):
                if mask[row] != 1:
                    _fail("r2-again: %s token %d has mask %d" % (sid, q, mask[row]))
                got = np.sort(ids[row], axis=-1)
                j = q - s.row_offset
                want = None
                if 0 <= j < s.routed_experts.shape[0]:
                    want = s.routed_experts[j][[case.payload_layer(l) for l in layers]]
                    if (want == -1).all():
                        want = None
                if want is not None:
                    if not np.array_equal(got, np.sort(want.astype(np.int64), axis=-1)):
                        _fail("r2-again: %s token %d: %s, rollout %s" % (sid, q, got, want))
                    counts["r2_rows_as_rollout"] += 1
                else:
                    for l in range(len(layers)):
                        if len(set(got[l].tolist())) != K or got[l].min() < 0 or got[l].max() >= E:
                            _fail("r2-again: %s token %d layer %d: %s" % (sid, q, layers[l],
                                                                          got[l]))
                    counts["r2_rows_recorded_filler"] += 1
                row += 1
        if mask[row:].any():
            _fail("r2-again: padding rows with mask 1")
        # Replay it through the routers: the routing map is the targets.
        install_replay_targets(mb, stack.replay_cls, action=stack.action.REPLAY_FORWARD,
                               num_mtp_layers=D, mtp_routing=True)
        with torch.no_grad():
            for l, (inst, route) in enumerate(routers):
                probs, routing_map = route(torch.randn((mb.replay_indices.shape[1], E),
                                                       device=stack.device))
                if not torch.equal(routing_map.cpu(), _map_of(mb.replay_indices[l].cpu(), E)):
                    _fail("r2-again mb %d layer %d: routing map is not the targets"
                          % (mb.index, layers[l]))
        counts["r2_rows_replayed"] += int(mb.replay_indices.shape[1])
    with rollpack.Controller(address) as c:
        c.release("r2-again")
    return counts


def static_ring_installer(num_buffers: int, max_rows: int, layers: int, device: Any) -> Callable:
    """An install hook for drive_rank through rollpack.static_targets: each
    micro-batch's targets are written into one of ``num_buffers`` static
    [max_rows, layers, K] int64 buffers (mb.index mod num_buffers) and the
    routers get views of it (install_static_buffer). One buffer per
    micro-batch in flight: the recompute backward reads the targets through
    those views, so a buffer must not be rewritten before its micro-batch's
    backward ran (pp - stage forwards can be in flight in 1F1B)."""
    from rollpack.static_targets import install_static_buffer, write_replay_targets
    ring = [torch.full((max_rows, layers, K), -7, dtype=torch.int64, device=device)
            for _ in range(num_buffers)]

    def install(mb, replay_cls, action, mtp):
        buf = ring[mb.index % num_buffers]
        rows = write_replay_targets(mb, buf, num_experts=E)
        if not torch.equal(buf[:rows], mb.replay_indices.permute(1, 0, 2)):
            _fail("mb %d: static buffer differs from replay_indices" % mb.index)
        if rows < max_rows and bool((buf[rows:] < 0).any()):
            _fail("mb %d: static rows past the micro-batch not filled" % mb.index)
        return install_static_buffer(buf, replay_cls, rows=rows, action=action, **mtp)
    return install


class MegatronReplayCpu(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.trainer = _need_trainer()
        cls.fx = StepFixture()
        cls.addClassCleanup(cls.fx.cleanup)
        cls.fx.start()
        for name, n in cls.fx.num_microbatches.items():
            assert n >= 3, (name, n)  # 1F1B needs warm-up and steady phases

    def setUp(self):
        LocalRouterReplay.global_router_replay_instances.clear()

    def stack(self):
        def make():
            rr = LocalRouterReplay()
            return rr, lambda z: local_topk_routing(z, K, rr)
        return Stack(LocalRouterReplay, LocalAction, make, torch.device("cpu"))

    def run_case(self, name):
        case = self.fx.cases[name]
        total = {}
        for rank in self.fx.ranks():
            mbs = list(self.trainer.TrainerClient(self.fx.daemon.address, name, rank, "cpu"))
            self.assertEqual(len(mbs), self.fx.num_microbatches[name])
            counts = drive_rank(self.stack(), case, rank, mbs, seed=sum(rank))
            for k, v in counts.items():
                total[k] = total.get(k, 0) + v
        return total

    def test_mtp_routing_replayed_on_every_rank(self):
        total = self.run_case("mtp")
        self.assertEqual(total["recorded_rows_reordered"], 0)  # sorted top-k: bit for bit
        self.assertGreater(total["replayed_rows"], 0)
        self.assertGreater(total["filler_rows"], 0)  # padding and missing rows seen
        self.assertEqual(total["live_rows"], 0)
        self.assertGreater(total["recompute_rows"], 0)
        self.assertGreater(total["recorded_rows"], 0)

    def test_r2_recorded_routing_replays_in_another_topology(self):
        counts = r2_round_trip(self.fx, self.stack, self.trainer, "cpu")
        self.assertGreater(counts["r2_rows_as_rollout"], 0)
        self.assertGreater(counts["r2_rows_recorded_filler"], 0)  # last tokens, missing rows
        # Router rows = real rows (every one checked above) + padding.
        self.assertGreaterEqual(counts["r2_rows_replayed"],
                                counts["r2_rows_as_rollout"] + counts["r2_rows_recorded_filler"])

    def test_mtp_routers_live_without_mtp_routing(self):
        total = self.run_case("live")
        self.assertGreater(total["replayed_rows"], 0)
        self.assertGreater(total["live_rows"], 0)

    def test_static_buffers_one_per_microbatch_in_flight(self):
        try:
            from rollpack import _capi
            from rollpack.static_targets import install_static_buffer  # noqa: F401
        except ImportError as e:
            self.skipTest("rollpack.static_targets not importable: %s" % e)
        if not _capi.has_static_targets():
            self.skipTest("library without static replay buffer entry points")
        for name in ("mtp", "live"):
            case = self.fx.cases[name]
            for rank in self.fx.ranks():
                mbs = list(self.trainer.TrainerClient(self.fx.daemon.address, name, rank, "cpu"))
                layers = len(case.layers_of_stage(rank[3]))
                max_rows = MAX_TOKENS // TOPO["tp"]
                ring = static_ring_installer(TOPO["pp"] - rank[3], max_rows, layers, "cpu")
                counts = drive_rank(self.stack(), case, rank, mbs, install=ring, seed=7)
                self.assertGreater(counts["replayed_rows"], 0)

    def test_one_static_buffer_breaks_recompute_under_1f1b(self):
        # Why the ring: stage 0 runs F0 F1 B0, and B0's recompute reads the
        # buffer F1 rewrote. This must fail, or the hazard is not exercised.
        try:
            from rollpack import _capi
            from rollpack.static_targets import install_static_buffer  # noqa: F401
        except ImportError as e:
            self.skipTest("rollpack.static_targets not importable: %s" % e)
        if not _capi.has_static_targets():
            self.skipTest("library without static replay buffer entry points")
        rank = (0, 0, 0, 0)
        mbs = list(self.trainer.TrainerClient(self.fx.daemon.address, "mtp", rank, "cpu"))
        ring = static_ring_installer(1, MAX_TOKENS // TOPO["tp"], 1, "cpu")
        with self.assertRaises(AssertionError) as cm:
            drive_rank(self.stack(), self.fx.cases["mtp"], rank, mbs, install=ring)
        self.assertIn("recompute routed differently from forward", str(cm.exception))

    def test_last_stage_receives_mtp_layers_after_decoder(self):
        for name, want in (("mtp", [2, 3, 4]), ("live", [2, 3])):
            mb = next(iter(self.trainer.TrainerClient(self.fx.daemon.address, name,
                                                      (0, 1, 1, 1), "cpu")))
            self.assertEqual(list(mb.replay_layers), want, name)
            self.assertEqual(mb.replay_indices.shape[0], len(want), name)

    def test_refusals_name_the_numbers(self):
        from rollpack.replay import install_replay_targets, recorded_routing, set_replay_action
        ids = torch.zeros((2, 5, K), dtype=torch.int64)
        for _ in range(4):
            LocalRouterReplay()
        with self.assertRaises(ValueError) as cm:
            install_replay_targets(ids, LocalRouterReplay, num_mtp_layers=1)
        self.assertIn("2 replay layers but 4 RouterReplay instances", str(cm.exception))
        self.assertIn("num_mtp_layers=1", str(cm.exception))
        LocalRouterReplay.global_router_replay_instances.pop()
        # 2 targets + 1 MTP == 3 instances, but the samples should carry MTP routing.
        with self.assertRaises(ValueError) as cm:
            install_replay_targets(ids, LocalRouterReplay, num_mtp_layers=1, mtp_routing=True)
        self.assertIn("2 replay layers and 3 RouterReplay instances", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            install_replay_targets(ids, LocalRouterReplay)  # D = 0: counts must match
        self.assertIn("2 replay layers but 3 RouterReplay instances", str(cm.exception))
        self.assertEqual(install_replay_targets(ids, LocalRouterReplay, num_mtp_layers=1), 2)
        self.assertEqual(set_replay_action(LocalAction.RECORD, ids, LocalRouterReplay,
                                           num_mtp_layers=1), 2)
        with self.assertRaises(ValueError) as cm:
            recorded_routing(LocalRouterReplay, num_mtp_layers=1)
        self.assertIn("num_mtp_layers=1 without mtp_routing", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            recorded_routing(LocalRouterReplay, layers=2, num_mtp_layers=1)
        self.assertIn("instance 0 of 2 recorded nothing", str(cm.exception))
        spec = rollpack.ModelSpec("m", num_layers=N, moe_layers=list(MOE), num_experts=E, topk=K,
                                  num_mtp_layers=2)
        with self.assertRaises(ValueError) as cm:
            install_replay_targets(ids, LocalRouterReplay, spec=spec, num_mtp_layers=1)
        self.assertIn("num_mtp_layers=1 but spec.num_mtp_layers=2", str(cm.exception))

        class Mb:  # MTP layer ids the spec does not have (layers 4 and 5 of a D=1 model)
            replay_layers = [3, 5]
            replay_indices = ids
        mtp_spec = rollpack.ModelSpec("m", num_layers=N, moe_layers=list(MOE), num_experts=E,
                                      topk=K, num_mtp_layers=1, mtp_routing=True)
        with self.assertRaises(ValueError) as cm:
            install_replay_targets(Mb(), LocalRouterReplay, spec=mtp_spec)
        self.assertIn("hold MTP layers [5] but the model has num_layers=4 and num_mtp_layers=1",
                      str(cm.exception))


if __name__ == "__main__":
    unittest.main()
