"""rollpack producer: push RL rollouts (tokens + MoE routed experts +
per-token fields) from vLLM / SGLang to a rollpackd sidecar.

Public names: Producer, AsyncProducer, Rollout, Controller, ModelSpec, Sample, PutResult, the
exceptions of rollpack.errors, and the engine adapters in rollpack.adapters; with torch, the
trainer side (TrainerClient, apply_replay, routing_agreement, ...; docs/trainer.md), imported
on first use. Typed (PEP 561: py.typed).

Install: ``pip install ./client/python`` (docs/producer.md); in the source tree,
``PYTHONPATH=client/python`` after ``make build``.
"""

from typing import TYPE_CHECKING, Any

from rollpack.errors import (AlreadyExists, DeadlineExceeded, FailedPrecondition,  # noqa: F401
                             InvalidArgument, NotFound, PayloadError, ResourceExhausted,
                             RollpackError, Unauthenticated, Unavailable)
from rollpack.spec import ModelSpec  # noqa: F401
from rollpack.sample import Sample, narrow_routed_experts  # noqa: F401
from rollpack.producer import AsyncProducer, Producer, PutResult, Rollout  # noqa: F401
from rollpack.controller import Controller  # noqa: F401
from rollpack.recompute import RoutingUploader  # noqa: F401
from rollpack import adapters  # noqa: F401


_TRAINER_NAMES = ("TrainerClient", "Microbatch", "apply_replay", "routing_agreement",
                  "install_replay_targets", "report_routing_agreement", "ReportAck",
                  "close_tp_communicators", "recorded_routing", "set_replay_action")


if TYPE_CHECKING:  # what __getattr__ hands out, for type checkers
    from rollpack.trainer import (Microbatch, ReportAck, TrainerClient,  # noqa: F401
                                  apply_replay, close_tp_communicators,
                                  install_replay_targets, recorded_routing,
                                  report_routing_agreement, routing_agreement,
                                  set_replay_action)


def __getattr__(name: str) -> Any:
    # Trainer-side names need torch: imported on first use only.
    if name in _TRAINER_NAMES:
        from rollpack import trainer
        return getattr(trainer, name)
    raise AttributeError("module 'rollpack' has no attribute %r" % (name,))


__version__ = "0.1.0"
__all__ = ["Producer", "AsyncProducer", "PutResult", "Rollout", "Controller", "RoutingUploader",
           "ModelSpec", "Sample", "adapters",
           "narrow_routed_experts", "RollpackError", "InvalidArgument", "AlreadyExists",
           "FailedPrecondition", "NotFound", "ResourceExhausted", "Unavailable",
           "DeadlineExceeded", "Unauthenticated", "PayloadError"]
