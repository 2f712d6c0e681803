"""ModelSpec: the routing payload a pool carries (layout.md sections 1 and 10)."""

from __future__ import annotations

import json
from typing import Any, Dict, Iterable, Mapping, Tuple

from rollpack._proto import rollouts_pb2

#: Bound on ``num_mtp_layers`` (the server's kMaxMtpLayers): real models have
#: 1 to 3 MTP depths; a larger value is a mistaken field.
MAX_MTP_LAYERS = 64
# As the server's kMaxLayers (scheduler/model_spec.h).
MAX_LAYERS = 4096


class ModelSpec:
    """Routing payload description of a model.

    ``num_layers`` N (decoder layers, MTP excluded), ``moe_layers`` M (sorted
    global ids of the MoE layers; empty = all N), ``num_experts`` E (0 = dense
    model), ``topk`` K. ``num_mtp_layers`` D: multi-token-prediction layers
    (global ids N..N+D-1, each with a router on the trainer's last pipeline
    stage); ``mtp_routing``: the samples' ``routed_experts`` carry those
    layers' routing after the decoder's (L = N + D or |M| + D; layout.md
    section 10). ``vocab_size`` V: the vocabulary size (0 = not declared);
    with V > 0 every id of a ragged token field (``sampling_mask``) must lie
    in [0, V) (layout.md section 13). Validated like the server does (same
    rules and messages), so a bad spec fails before any RPC.
    """

    __slots__ = ("name", "num_layers", "moe_layers", "num_experts", "topk",
                 "allow_all_zero_layers", "finite_token_fields", "num_mtp_layers",
                 "mtp_routing", "vocab_size")

    name: str
    num_layers: int
    moe_layers: Tuple[int, ...]
    num_experts: int
    topk: int
    allow_all_zero_layers: bool
    finite_token_fields: Tuple[str, ...]
    num_mtp_layers: int
    mtp_routing: bool
    vocab_size: int

    def __init__(self, name: str = "", num_layers: int = 0, moe_layers: Iterable[int] = (),
                 num_experts: int = 0, topk: int = 0, allow_all_zero_layers: bool = False,
                 finite_token_fields: Iterable[str] = (), num_mtp_layers: int = 0,
                 mtp_routing: bool = False, vocab_size: int = 0) -> None:
        self.name = str(name)
        self.num_layers = int(num_layers)
        self.moe_layers = tuple(int(x) for x in moe_layers)
        self.num_experts = int(num_experts)
        self.topk = int(topk)
        self.allow_all_zero_layers = bool(allow_all_zero_layers)
        if isinstance(finite_token_fields, str):
            raise ValueError("finite_token_fields is a list of field names, not %r"
                             % finite_token_fields)
        self.finite_token_fields = tuple(str(f) for f in finite_token_fields)
        self.num_mtp_layers = int(num_mtp_layers)
        self.mtp_routing = bool(mtp_routing)
        self.vocab_size = int(vocab_size)
        self.validate()

    # -- rules -------------------------------------------------------------
    def validate(self) -> None:
        """Raises ValueError naming the first rule broken (the server's rules
        and messages)."""
        who = 'model "%s": ' % self.name
        if self.num_layers < 1 or self.num_layers > MAX_LAYERS:
            raise ValueError(who + "num_layers is %d, must be in [1, %d]"
                             % (self.num_layers, MAX_LAYERS))
        for i, l in enumerate(self.moe_layers):
            if l < 0 or l >= self.num_layers:
                raise ValueError(who + "moe_layers[%d] is %d, outside [0, %d)"
                                 % (i, l, self.num_layers))
            if i > 0 and l <= self.moe_layers[i - 1]:
                raise ValueError(who + "moe_layers must be strictly increasing; "
                                 "moe_layers[%d] is %d after %d"
                                 % (i, l, self.moe_layers[i - 1]))
        for i, field in enumerate(self.finite_token_fields):
            if not field:
                raise ValueError(who + "finite_token_fields[%d] is empty" % i)
            if field in self.finite_token_fields[:i]:
                raise ValueError(who + 'finite_token_fields names "%s" twice (%d and %d)'
                                 % (field, self.finite_token_fields.index(field), i))
        if self.num_experts < 0 or self.num_experts > 65536:
            raise ValueError(who + "num_experts is %d, must be in [0, 65536]"
                             % self.num_experts)
        if self.num_mtp_layers < 0 or self.num_mtp_layers > MAX_MTP_LAYERS:
            raise ValueError(who + "num_mtp_layers is %d, must be in [0, %d]"
                             % (self.num_mtp_layers, MAX_MTP_LAYERS))
        if self.mtp_routing and self.num_mtp_layers < 1:
            raise ValueError(who + "mtp_routing is set but num_mtp_layers is %d: routing of "
                             "MTP layers needs num_mtp_layers >= 1" % self.num_mtp_layers)
        if self.vocab_size < 0:
            raise ValueError(who + "vocab_size is %d, must be >= 0 (0: not declared)"
                             % self.vocab_size)
        if self.mtp_routing and self.is_dense:
            raise ValueError(who + "mtp_routing is set but num_experts is 0 (a dense model "
                             "has no routing)")
        if self.is_dense:
            if self.topk != 0:
                raise ValueError(who + "topk is %d but num_experts is 0 (a dense model)"
                                 % self.topk)
            return
        if self.topk < 1 or self.topk > self.num_experts:
            raise ValueError(who + "topk is %d, must be in [1, num_experts = %d]"
                             % (self.topk, self.num_experts))

    @property
    def is_dense(self) -> bool:
        """A dense model (num_experts 0): no routed experts to replay."""
        return self.num_experts == 0

    @property
    def resolved_moe_layers(self) -> Tuple[int, ...]:
        """M with the "empty means all" default applied (empty when dense)."""
        if self.is_dense:
            return ()
        return self.moe_layers if self.moe_layers else tuple(range(self.num_layers))

    @property
    def num_moe_layers(self) -> int:
        """The number of MoE layers (``len(resolved_moe_layers)``)."""
        return len(self.resolved_moe_layers)

    @property
    def routed_mtp_layers(self) -> int:
        """MTP layers whose routing the samples carry: D with ``mtp_routing``, else 0."""
        return self.num_mtp_layers if self.mtp_routing else 0

    @property
    def mtp_layer_ids(self) -> Tuple[int, ...]:
        """Global ids of the MTP layers, N..N+D-1 (whether or not routed)."""
        return tuple(range(self.num_layers, self.num_layers + self.num_mtp_layers))

    @property
    def payload_layers(self) -> Tuple[int, ...]:
        """Accepted layer counts of a ``routed_experts`` payload: (full, compact),
        N and |M|, plus D each with ``mtp_routing`` (equal when every layer is
        MoE; empty when dense)."""
        if self.is_dense:
            return ()
        d = self.routed_mtp_layers
        return (self.num_layers + d, self.num_moe_layers + d)

    @property
    def stored_layer_ids(self) -> Tuple[int, ...]:
        """Global ids of the layers a payload's routing is kept for, in stored
        (compact) order: M, then N..N+D-1 with ``mtp_routing``. In the full
        layout each is also the payload's layer index."""
        if self.is_dense:
            return ()
        return self.resolved_moe_layers + self.mtp_layer_ids[:self.routed_mtp_layers]

    # -- conversions ---------------------------------------------------------
    def to_proto(self) -> rollouts_pb2.ModelSpec:
        """The rollpack.v1.ModelSpec message."""
        return rollouts_pb2.ModelSpec(
            name=self.name, num_layers=self.num_layers, moe_layers=list(self.moe_layers),
            num_experts=self.num_experts, topk=self.topk,
            allow_all_zero_layers=self.allow_all_zero_layers,
            finite_token_fields=list(self.finite_token_fields),
            num_mtp_layers=self.num_mtp_layers, mtp_routing=self.mtp_routing,
            vocab_size=self.vocab_size)

    @classmethod
    def from_proto(cls, pb: rollouts_pb2.ModelSpec) -> ModelSpec:
        """From a rollpack.v1.ModelSpec message (validated)."""
        return cls(pb.name, pb.num_layers, list(pb.moe_layers), pb.num_experts, pb.topk,
                   pb.allow_all_zero_layers, list(pb.finite_token_fields),
                   pb.num_mtp_layers, pb.mtp_routing, pb.vocab_size)

    def to_dict(self) -> Dict[str, Any]:
        """The fields as a JSON-ready dict (``from_dict`` takes it back). The
        MTP fields and ``vocab_size`` appear only when set, so a spec without
        them gives the same dict (and JSON, and hash) as before they existed."""
        d: Dict[str, Any] = {
            "name": self.name, "num_layers": self.num_layers,
            "moe_layers": list(self.moe_layers), "num_experts": self.num_experts,
            "topk": self.topk, "allow_all_zero_layers": self.allow_all_zero_layers,
            "finite_token_fields": list(self.finite_token_fields)}
        if self.num_mtp_layers:
            d["num_mtp_layers"] = self.num_mtp_layers
        if self.mtp_routing:
            d["mtp_routing"] = self.mtp_routing
        if self.vocab_size:
            d["vocab_size"] = self.vocab_size
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelSpec:
        """From a dict of the constructor's fields; unknown keys raise ValueError."""
        unknown = set(d) - set(cls.__slots__)
        if unknown:
            raise ValueError("model spec: unknown keys %s (known: %s)"
                             % (sorted(unknown), ", ".join(cls.__slots__)))
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        """From a JSON object of the constructor's fields."""
        return cls.from_dict(json.loads(text))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ModelSpec):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    def __repr__(self) -> str:
        return "ModelSpec(%s)" % ", ".join("%s=%r" % (k, v) for k, v in self.to_dict().items())
