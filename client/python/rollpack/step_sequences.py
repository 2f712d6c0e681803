"""What a step's micro-batches say about each of its sequences (lifecycle.md
section 6): group id, policy version, scalars (the reward, ...) and
advantage, read back by a controller (``Controller.sequences``, ``rollpack
step plan --groups``).

GetPlan does not carry them; every micro-batch does, on every rank. So this
reads whole micro-batches, as few as cover every sequence once: a sequence
goes to every rank of its CP group (the plan's RankGroup: ranks first_rank
.. first_rank + cp_size - 1, ids d * cp + c), so the streams of the groups'
first ranks hold every sequence, at TP rank 0 of the pipeline stage that
receives the fewest bytes (the fewest replay layers; then a middle stage,
which gets neither tokens nor token fields; then the first, whose tokens
are 4 bytes a token). With static CP that is one stream per DP rank; with
dynamic CP a few more. They are read as a trainer reads them: a trainer
token, and the bytes of one rank per stream, so not something to do on
every step of a large job.
"""

from __future__ import annotations

import collections
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from rollpack import errors, ndarray
from rollpack._proto import ndarray_pb2, scheduler_pb2, trainer_pb2


class SequenceInfo(collections.namedtuple(
        "SequenceInfo", "sample_id group_id policy_version scalars advantage microbatch")):
    """One sequence of a step: its ``group_id`` ("" = ungrouped),
    ``policy_version``, ``scalars`` (dict name -> float: those every sample of
    the step has), ``advantage`` (float, None without an estimator) and the
    index of the ``microbatch`` it is in."""

    __slots__ = ()


def streams_to_read(plan: scheduler_pb2.Plan, info: scheduler_pb2.StepInfo
                    ) -> List[Tuple[int, int, int, int]]:
    """The (dp, cp, tp, pp) ranks whose streams hold every sequence of the
    step once or more (module docstring)."""
    topo = info.topology
    cp = max(1, topo.cp)
    firsts = sorted({g.first_rank for mb in plan.microbatches for g in mb.groups})
    stages = max(1, topo.pp)

    def cost(p):
        layers = (len(info.stage_layers[p].replay_layers) if p < len(info.stage_layers) else 0)
        return (layers, p in (0, stages - 1), p == stages - 1)

    pp = min(range(stages), key=cost)
    return [(r // cp, r % cp, 0, pp) for r in firsts]


def _per_sequence(mb: trainer_pb2.Microbatch, name: str, a: ndarray_pb2.NDArray,
                  dtype: int) -> np.ndarray:
    n = len(mb.sample_ids)
    want = ndarray.numpy_dtype(dtype)
    if a.dtype != dtype or list(a.shape) != [n] or len(a.data) != n * want.itemsize:
        raise errors.PayloadError(
            "micro-batch %d of step %r: %s is %s %s (%d bytes), not %s [%d]: one value per "
            "sequence" % (mb.index, mb.step_id, name, ndarray_pb2.DType.Name(a.dtype),
                          list(a.shape), len(a.data), ndarray_pb2.DType.Name(dtype), n))
    return np.frombuffer(a.data, want)


def decode(mb: trainer_pb2.Microbatch) -> List[SequenceInfo]:
    """The micro-batch's sequences, in the order of its sample ids, checked
    against their number (PayloadError naming the field otherwise)."""
    n = len(mb.sample_ids)
    if len(mb.group_ids) != n or len(mb.policy_versions) != n:
        if n and not mb.group_ids and not mb.policy_versions:
            raise errors.FailedPrecondition(
                "micro-batch %d of step %r has no group_ids or policy_versions: rollpackd is "
                "older than lifecycle.md section 6" % (mb.index, mb.step_id))
        raise errors.PayloadError("micro-batch %d of step %r: %d sequences but %d group_ids "
                                  "and %d policy_versions" % (mb.index, mb.step_id, n,
                                                              len(mb.group_ids),
                                                              len(mb.policy_versions)))
    scalars = {name: _per_sequence(mb, "scalars[%r]" % name, a, ndarray_pb2.FLOAT64)
               for name, a in sorted(mb.scalars.items())}
    adv = (_per_sequence(mb, "advantages", mb.advantages, ndarray_pb2.FLOAT32)
           if mb.HasField("advantages") else None)
    return [SequenceInfo(sid, mb.group_ids[i], int(mb.policy_versions[i]),
                         {k: float(v[i]) for k, v in scalars.items()},
                         None if adv is None else float(adv[i]), mb.index)
            for i, sid in enumerate(mb.sample_ids)]


def collect(plan: scheduler_pb2.Plan, streams: Iterable[Iterable[trainer_pb2.Microbatch]]
            ) -> List[SequenceInfo]:
    """Every sequence of the plan once, in plan order (micro-batch, group,
    pack order), from the micro-batches of ``streams``; PayloadError naming a
    sequence of the plan that none of them carried."""
    seen: Dict[str, SequenceInfo] = {}
    for stream in streams:
        for mb in stream:
            for s in decode(mb):
                seen.setdefault(s.sample_id, s)
    out: List[SequenceInfo] = []
    for mb in plan.microbatches:
        for g in mb.groups:
            for sid in g.sample_ids:
                if sid not in seen:
                    raise errors.PayloadError("sample %r of step %r (micro-batch %d) is in no "
                                              "micro-batch read" % (sid, plan.step_id, mb.index))
                out.append(seen[sid])
    return out


def by_group(sequences: Sequence[SequenceInfo]) -> "collections.OrderedDict[str, List[Any]]":
    """The sequences by group id, groups in order of first appearance."""
    groups: "collections.OrderedDict[str, List[Any]]" = collections.OrderedDict()
    for s in sequences:
        groups.setdefault(s.group_id, []).append(s)
    return groups


def table(sequences: Sequence[SequenceInfo], *, digits: Optional[int] = 6) -> List[str]:
    """Text lines: one row per sequence, grouped by group id, a column per
    scalar, then the advantage ("-" without an estimator)."""
    names = sorted({k for s in sequences for k in s.scalars})

    def num(x):
        return "-" if x is None else ("%.*g" % (digits, x) if digits else repr(x))

    rows = [["GROUP", "SAMPLE", "VERSION", "MB"] + names + ["ADVANTAGE"]]
    for group, members in by_group(sequences).items():
        for s in members:
            rows.append([group or "-", s.sample_id, str(s.policy_version), str(s.microbatch)] +
                        [num(s.scalars.get(k)) for k in names] + [num(s.advantage)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
