"""R2, recompute routing replay (docs/layout.md section 11, docs/trainer.md).

In a step's recompute (old-policy) forward every rank records what its own
routers chose (Megatron: RouterReplay RECORD, ``get_recorded_data()``) and
uploads it for each micro-batch it received; rollpackd puts every row back
into its sample (the inverse of the rank's layout: CP zigzag, SP rows, the
stage's layers; padding dropped) and checks it. The controller commits the
step once every rank is done; later steps created with
``replay_source="recompute"`` replay that routing in their own layout::

    up = RoutingUploader(address, step_id, rank=(dp, cp, tp, pp))
    for mb in TrainerClient(address, step_id, rank):
        RouterReplay.set_global_router_replay_action(RouterReplayAction.RECORD)
        forward(mb)
        up.upload(mb, recorded_routing(layers=mb))  # [rows, layers, K]
    # controller, after every rank:
    controller.commit_routing(step_id)
    controller.release(step_id)                   # a reuse_samples step
    controller.create_step("epoch-2", pool, ..., replay_source="recompute")

Uploads are idempotent (the same ids again are accepted), so a rank retries
freely; different ids for an entry already placed are refused and change
nothing.
"""

from __future__ import annotations

from typing import Any, Sequence, Tuple, Union

import numpy as np

from rollpack import errors
from rollpack._proto import trainer_pb2, trainer_pb2_grpc
from rollpack.controller import Controller
from rollpack.ndarray import to_proto

RankLike = Union[Sequence[int], Any]


def _coords(rank: RankLike) -> Tuple[int, int, int, int]:
    if isinstance(rank, dict):
        return tuple(int(rank.get(k, 0)) for k in ("dp", "cp", "tp", "pp"))  # type: ignore
    if hasattr(rank, "dp"):
        return tuple(int(getattr(rank, k)) for k in ("dp", "cp", "tp", "pp"))  # type: ignore
    t = tuple(int(x) for x in rank)
    if len(t) != 4:
        raise ValueError("rank must be (dp, cp, tp, pp), got %r" % (rank,))
    return t  # type: ignore


def narrow_ids(experts: Any) -> np.ndarray:
    """``experts`` (a torch tensor on any device, or an array) as a C-order
    numpy array of the narrowest unsigned dtype that holds its ids (uint8
    below 256, else uint16): Megatron records int64, 4-8x more bytes on the
    wire. Negative ids are refused here (the server would refuse them too)."""
    if hasattr(experts, "detach"):  # torch, without importing it
        experts = experts.detach().to("cpu").numpy()
    a = np.asarray(experts)
    if a.dtype.kind not in "iu":
        raise errors.PayloadError("recorded routing must hold integer expert ids, got dtype %s"
                                  % a.dtype)
    if a.size == 0:
        return np.ascontiguousarray(a, dtype=np.uint8)
    lo, hi = int(a.min()), int(a.max())
    if lo < 0:
        raise errors.PayloadError("recorded routing holds expert id %d (< 0)" % lo)
    if hi > 65535:
        raise errors.PayloadError("recorded routing holds expert id %d (> 65535)" % hi)
    return np.ascontiguousarray(a, dtype=np.uint8 if hi < 256 else np.uint16)


class RoutingUploader:
    """One rank's uploads of its recorded routing for a step.

    ``RoutingUploader(address, step_id, rank, *, token=None, tls=False,
    root_certificates=None, client_certificate=None, client_key=None,
    server_name=None, timeout=60.0)``; a context manager. Connection options
    as :class:`rollpack.Controller` (a trainer token).
    """

    def __init__(self, address: str, step_id: str, rank: RankLike, *,
                 timeout: float = 60.0, **connection: Any) -> None:
        self.step_id = step_id
        self.rank = _coords(rank)
        self._controller = Controller(address, timeout=timeout, **connection)
        self._stub = trainer_pb2_grpc.TrainerStub(self._controller._channel)

    def upload(self, microbatch: Any, experts: Any) -> trainer_pb2.UploadRoutingResponse:
        """Uploads ``experts`` ([router_rows, replay layers, K]: exactly the
        rows and layers of the micro-batch's ``replay_indices``) for
        ``microbatch`` (a trainer Microbatch, or its index). Returns the
        UploadRoutingResponse (rows placed, repeated, entries still missing
        in the step)."""
        index = int(getattr(microbatch, "index", microbatch))
        ids = narrow_ids(experts)
        if ids.ndim != 3:
            raise errors.PayloadError(
                "recorded routing of micro-batch %d must be [router_rows, layers, K], got shape %s"
                % (index, ids.shape))
        layers = getattr(microbatch, "replay_layers", None)
        if layers is not None and ids.shape[1] != len(layers):
            raise errors.PayloadError(
                "recorded routing of micro-batch %d has %d layers; this rank replays %d (%s)"
                % (index, ids.shape[1], len(layers), list(layers)))
        dp, cp, tp, pp = self.rank
        request = trainer_pb2.RecordedRouting(
            step_id=self.step_id, rank=trainer_pb2.RankCoords(dp=dp, cp=cp, tp=tp, pp=pp),
            index=index, experts=to_proto(ids))
        return self._controller._call("UploadRouting %r micro-batch %d rank %s"
                                      % (self.step_id, index, self.rank),
                                      self._stub.UploadRouting, request)

    def close(self) -> None:
        self._controller.close()

    def __enter__(self) -> RoutingUploader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
