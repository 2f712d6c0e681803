"""Pieces every engine adapter shares: the result type, dtype names, base64,
host arrays, and the check that places a [rows, L, K] payload on the tokens."""

from __future__ import annotations

import base64
import binascii
from typing import Any, NamedTuple, Tuple

import numpy as np
from numpy.typing import ArrayLike

from rollpack.errors import PayloadError
from rollpack.sample import as_tokens
from rollpack.spec import ModelSpec


class RoutedExperts(NamedTuple):
    """Routed experts [rows, L, K] covering tokens [row_offset, row_offset + rows)."""

    array: np.ndarray
    row_offset: int


def parse_dtype(name: str, what: str = "dtype") -> np.dtype:
    """numpy dtype from an engine's dtype string: "int32", "torch.int32",
    "<i4", "np.int16", ... Only integer dtypes are accepted."""
    s = str(name).strip()
    for prefix in ("torch.", "numpy.", "np."):
        if s.startswith(prefix):
            s = s[len(prefix):]
    s = {"long": "int64", "int": "int32", "short": "int16"}.get(s, s)
    try:
        dt = np.dtype(s)
    except TypeError:
        raise PayloadError("%s %r is not a numpy dtype" % (what, name)) from None
    if dt.kind not in "iu":
        raise PayloadError("%s %r is not an integer dtype" % (what, name))
    return dt


def b64(data: Any, what: str) -> bytes:
    """The bytes of a base64 string (or of bytes holding base64 text)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data)
    elif not isinstance(data, str):
        raise PayloadError("%s must be a base64 string, got %s" % (what, type(data).__name__))
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise PayloadError("%s is not valid base64 (%s)" % (what, e)) from None


def is_torch_tensor(x: Any) -> bool:
    """True for a torch.Tensor, without importing torch (an optional dependency)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "device") and hasattr(x, "numpy")


def torch_dtype_name(t: Any) -> str:
    """"int16" for torch.int16 (the name numpy uses where there is one)."""
    return str(t.dtype).replace("torch.", "")


def host_array(x: Any, what: str) -> np.ndarray:
    """numpy view of an engine's array: numpy as is, a CPU torch tensor viewed
    (shares its memory), a tensor on an accelerator copied to the host once.
    Anything else goes through ``np.asarray``."""
    if isinstance(x, np.ndarray):
        return x
    if is_torch_tensor(x):
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()  # the one device -> host copy; the view below shares it
        try:
            return t.numpy()
        except (TypeError, RuntimeError) as e:
            raise PayloadError("%s: torch tensor of dtype %s has no numpy view (%s)"
                               % (what, t.dtype, e)) from None
    return np.asarray(x)


def nested_ints(x: Any, what: str, layers_hint: int, k: int, dtype: Any = np.int32) -> np.ndarray:
    """[rows, layers, topk] array from JSON nested lists (a new array: the
    one format that needs a parse). An empty list is [0, layers_hint, k]."""
    if x is None:
        raise PayloadError("%s is missing (null)" % what)
    try:
        a = np.array(x, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as e:
        raise PayloadError("%s is not a rectangular list of integers (%s)" % (what, e)) from None
    if a.size == 0 and a.ndim < 3:
        a = a.reshape(0, layers_hint, k)
    if a.ndim != 3:
        raise PayloadError("%s must be nested [rows][layers][topk], got %d levels (shape %s)"
                           % (what, a.ndim, list(a.shape)))
    return a


def mtp_extra(spec: ModelSpec) -> int:
    """D when the spec declares MTP layers whose routing the samples carry
    (layout.md section 10), else 0. Specs without MTP fields count as D = 0."""
    if not getattr(spec, "mtp_routing", False):
        return 0
    return int(getattr(spec, "num_mtp_layers", 0) or 0)


def layer_counts(spec: ModelSpec) -> Tuple[int, int]:
    """The layer axis lengths a payload may have: (full, compact)."""
    d = mtp_extra(spec)
    return spec.num_layers + d, spec.num_moe_layers + d


def layers_text(spec: ModelSpec) -> str:
    d = mtp_extra(spec)
    text = "model %r has num_layers %d (full layout) and %d MoE layers (compact layout)" % (
        spec.name, spec.num_layers, spec.num_moe_layers)
    if d:
        text += ", plus %d MTP layers (mtp_routing)" % d
    return text


def place(arr: np.ndarray, n: int, spec: ModelSpec, starts: Tuple[int, ...], what: str,
          allow_n: bool = True) -> RoutedExperts:
    """Checks a [rows, L, K] payload against the tokens and the model and
    picks its offset among ``starts`` (first that fits, rows ending at n - 1
    preferred to n)."""
    if spec.is_dense:
        raise PayloadError("%s: model %r is dense (num_experts 0): it has no routed experts"
                           % (what, spec.name))
    if arr.ndim != 3:
        raise PayloadError("%s must be [rows, layers, topk], got shape %s"
                           % (what, list(arr.shape)))
    rows, layers, k = arr.shape
    if layers not in layer_counts(spec):
        raise PayloadError("%s has %d layers; %s" % (what, layers, layers_text(spec)))
    if k != spec.topk:
        raise PayloadError("%s has %d experts per token; model %r has topk %d"
                           % (what, k, spec.name, spec.topk))
    ends = (n - 1, n) if allow_n else (n - 1,)
    for end in ends:
        for s in starts:
            if s >= 0 and s + rows == end:
                return RoutedExperts(arr, s)
    raise PayloadError(
        "%s has %d rows; with %d tokens and start offset %s they must number %s (rows end at "
        "n - 1%s)" % (what, rows, n, " or ".join(str(s) for s in starts),
                      " or ".join(str(e - s) for e in ends for s in starts if e - s >= 0),
                      " or n" if allow_n else ""))


def starts_for(s: Any) -> Tuple[int, ...]:
    """Offsets to try for a requested start s: (s, 0) for s > 0 (engines that
    ignored the request start at 0), else (0,)."""
    s = int(s or 0)
    if s < 0:
        raise PayloadError("start offset is %d, must be >= 0" % s)
    return (s, 0) if s > 0 else (0,)


def num_tokens(tokens: ArrayLike) -> int:
    """n from the tokens (or n itself); n >= 1."""
    if isinstance(tokens, (int, np.integer)):
        n = int(tokens)
    else:
        n = int(as_tokens(tokens).shape[0])
    if n < 1:
        raise PayloadError("tokens is empty (n must be >= 1)")
    return n


def require_integers(arr: np.ndarray, what: str) -> None:
    if arr.dtype.kind not in "iu":
        raise PayloadError("%s has dtype %s, expected integers" % (what, arr.dtype))
