"""Scalars added to stored samples after the fact, and the advantage
estimators of CreateStep (lifecycle.md section 6).

A reward usually comes after generation (a verifier, a reward model, an
environment's end): the sample is put without it, and its scalars are added
later with ``Rollouts.AnnotateSamples``, which :meth:`Producer.annotate`,
:meth:`AsyncProducer.annotate` and :meth:`Controller.annotate` call with a
request built here. The forms taken (``AnnotationsLike``):

- a dict ``{sample_id: {name: value, ...}, ...}``;
- an iterable of ``(sample_id, {name: value})`` pairs, of dicts
  ``{"sample_id": ..., "scalars": {...}}`` (the JSON lines ``rollpack pool
  annotate --from-jsonl`` reads), or of ``rollouts_pb2.SampleAnnotation``.
"""

from __future__ import annotations

import numbers
from typing import Any, Iterable, Mapping, Tuple, Union

from rollpack import errors
from rollpack._proto import rollouts_pb2, scheduler_pb2

#: What ``annotate`` takes (module docstring).
AnnotationsLike = Union[Mapping[str, Mapping[str, float]],
                        Iterable[Union[Tuple[str, Mapping[str, float]], Mapping[str, Any],
                                       rollouts_pb2.SampleAnnotation]]]

#: CreateStep's ``advantage`` by name; "-" and "_" alike, any case.
ADVANTAGES = {"none": scheduler_pb2.ADVANTAGE_NONE, "grpo": scheduler_pb2.ADVANTAGE_GRPO,
              "grpo_mean": scheduler_pb2.ADVANTAGE_GRPO_MEAN,
              "rloo": scheduler_pb2.ADVANTAGE_RLOO}


def advantage_estimator(advantage: Union[str, int, None]) -> int:
    """The AdvantageEstimator value of ``advantage``: a name of ADVANTAGES
    ("grpo", "grpo-mean", ...), the enum's own name ("ADVANTAGE_GRPO"), its
    number, or None (= none)."""
    if advantage is None:
        return scheduler_pb2.ADVANTAGE_NONE
    if isinstance(advantage, bool) or not isinstance(advantage, (str, int)):
        raise ValueError("advantage is %r: one of %s" % (advantage, ", ".join(ADVANTAGES)))
    if isinstance(advantage, int):
        if advantage not in scheduler_pb2.AdvantageEstimator.values():
            raise ValueError("advantage is %d: not an AdvantageEstimator" % advantage)
        return advantage
    key = advantage.strip().lower().replace("-", "_")
    if key.startswith("advantage_"):
        key = key[len("advantage_"):]
    if key not in ADVANTAGES:
        raise ValueError("advantage is %r: one of %s" % (advantage, ", ".join(ADVANTAGES)))
    return ADVANTAGES[key]


def _entry(item: Any, i: int) -> Tuple[Any, Any]:
    if isinstance(item, rollouts_pb2.SampleAnnotation):
        return item.sample_id, dict(item.scalars)
    if isinstance(item, Mapping):
        unknown = set(item) - {"sample_id", "scalars"}
        if unknown or "sample_id" not in item:
            raise errors.PayloadError("annotations[%d]: a dict needs \"sample_id\" and "
                                      "\"scalars\" (got keys %s)" % (i, sorted(item)))
        return item["sample_id"], item.get("scalars", {})
    try:
        sample_id, scalars = item
    except (TypeError, ValueError):
        raise errors.PayloadError("annotations[%d] is %r: a (sample_id, {name: value}) pair, a "
                                  "dict {sample_id, scalars} or a SampleAnnotation"
                                  % (i, item)) from None
    return sample_id, scalars


def annotate_request(pool: str, annotations: AnnotationsLike
                     ) -> rollouts_pb2.AnnotateSamplesRequest:
    """An AnnotateSamplesRequest for ``pool``; PayloadError (a ValueError)
    naming the entry for one that is not a sample id with a dict of numbers.
    What the server decides (a sample id twice, unknown ids, a value that
    differs from the one set) is left to it: the request is all or nothing."""
    if not pool:
        raise ValueError("pool must be a non-empty string")
    if isinstance(annotations, (str, bytes)):
        raise errors.PayloadError("annotations is a string: a dict {sample_id: {name: value}} "
                                  "or a list of entries")
    items = annotations.items() if isinstance(annotations, Mapping) else annotations
    req = rollouts_pb2.AnnotateSamplesRequest(pool=pool)
    for i, item in enumerate(items):
        sample_id, scalars = _entry(item, i)
        if not isinstance(sample_id, str) or not sample_id:
            raise errors.PayloadError("annotations[%d]: sample_id is %r, not a non-empty "
                                      "string" % (i, sample_id))
        if not isinstance(scalars, Mapping):
            raise errors.PayloadError("annotations[%d] (sample %r): scalars is %r, not a dict "
                                      "{name: value}" % (i, sample_id, scalars))
        entry = req.annotations.add(sample_id=sample_id)
        for name, value in scalars.items():
            if not isinstance(name, str) or not name:
                raise errors.PayloadError("annotations[%d] (sample %r): scalar name %r is not a "
                                          "non-empty string" % (i, sample_id, name))
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise errors.PayloadError("annotations[%d] (sample %r): scalar %r is %r, not a "
                                          "number" % (i, sample_id, name, value))
            entry.scalars[name] = float(value)
    return req
