"""PoolOptions from a dict, with the pool's declared token fields
(docs/producer.md, "Token-field schema"; docs/lifecycle.md for the rest)."""

from __future__ import annotations

from typing import Any, Mapping

from rollpack._proto import rollouts_pb2
from rollpack.ndarray import wire_dtype


def _token_field_schema(name: str, declared: Any) -> rollouts_pb2.TokenFieldSchema:
    """``"uint8"`` / ``np.float32`` / ``{"dtype": "float32", "allow_narrowing": True,
    "trailing_shape": [2]}`` -> TokenFieldSchema."""
    if isinstance(declared, rollouts_pb2.TokenFieldSchema):
        out = rollouts_pb2.TokenFieldSchema()
        out.CopyFrom(declared)
        out.name = name
        return out
    fields = dict(declared) if isinstance(declared, Mapping) else {"dtype": declared}
    unknown = set(fields) - {"dtype", "trailing_shape", "allow_narrowing"}
    if unknown:
        raise TypeError("token_fields[%r]: unknown keys %s (dtype, trailing_shape, "
                        "allow_narrowing)" % (name, sorted(unknown)))
    if "dtype" not in fields:
        raise TypeError("token_fields[%r] needs a dtype" % name)
    return rollouts_pb2.TokenFieldSchema(
        name=name, dtype=wire_dtype(fields["dtype"]),
        trailing_shape=[int(d) for d in fields.get("trailing_shape", ())],
        allow_narrowing=bool(fields.get("allow_narrowing", False)))


def pool_options(options: Mapping[str, Any]) -> rollouts_pb2.PoolOptions:
    """A PoolOptions message from a dict of its fields. ``token_fields`` may be
    a dict ``{name: dtype or {dtype, trailing_shape, allow_narrowing}}``
    (docs/producer.md, "Token-field schema")."""
    fields = dict(options)
    declared = fields.pop("token_fields", None)
    out = rollouts_pb2.PoolOptions(**fields)
    if declared is not None:
        items = declared.items() if isinstance(declared, Mapping) else (
            (f.name if isinstance(f, rollouts_pb2.TokenFieldSchema) else f["name"], f)
            for f in declared)
        for name, spec in items:
            if isinstance(spec, Mapping) and "name" in spec:
                spec = {k: v for k, v in spec.items() if k != "name"}
            out.token_fields.append(_token_field_schema(name, spec))
    return out
