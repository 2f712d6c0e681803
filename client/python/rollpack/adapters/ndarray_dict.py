"""The ``{data, shape, dtype}`` base64 dict that SkyRL and ms-swift use to
ship routed-expert tensors between their rollout servers and trainers."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from numpy.typing import ArrayLike

from rollpack.adapters._common import (RoutedExperts, b64, num_tokens, parse_dtype, place,
                                       starts_for)
from rollpack.errors import PayloadError
from rollpack.spec import ModelSpec


def from_ndarray_dict(d: Mapping[str, Any], tokens: ArrayLike, spec: ModelSpec,
                      row_offset: int = 0) -> RoutedExperts:
    """The ``{"data": base64, "shape": [...], "dtype": "int32"}`` dict that
    SkyRL and ms-swift use to ship routed-expert tensors between their
    rollout servers and trainers: raw C-order little-endian bytes, dtype as a
    numpy or torch name ("int32", "torch.int32", "<i4"). ``shape`` is [rows, layers, K]
    (or [rows, layers * K]). ``row_offset``: the first token the rows cover
    (the dict's ``row_offset`` / ``start`` key when present).
    """
    if not isinstance(d, dict):
        raise PayloadError("ndarray dict must be a dict, got %s" % type(d).__name__)
    missing = [key for key in ("data", "shape", "dtype") if key not in d]
    if missing:
        raise PayloadError("ndarray dict lacks %s (has %s)" % (", ".join(missing), sorted(d)))
    what = "ndarray dict"
    dt = parse_dtype(d["dtype"], "ndarray dict dtype")
    try:
        shape = tuple(int(x) for x in d["shape"])
    except (TypeError, ValueError):
        raise PayloadError("ndarray dict shape %r is not a list of integers"
                           % (d["shape"],)) from None
    if any(x < 0 for x in shape):
        raise PayloadError("ndarray dict shape %s has a negative size" % list(shape))
    raw = b64(d["data"], "ndarray dict data")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if len(raw) != count * dt.itemsize:
        raise PayloadError("ndarray dict data holds %d bytes; shape %s of %s needs %d"
                           % (len(raw), list(shape), dt, count * dt.itemsize))
    arr = np.frombuffer(raw, dtype=dt, count=count)
    k = spec.topk
    if len(shape) == 2 and k and shape[1] % k == 0:
        shape = (shape[0], shape[1] // k, k)
    arr = arr.reshape(shape)
    for key in ("row_offset", "start", "start_len"):
        if key in d and not row_offset:
            row_offset = d[key]
    return place(arr, num_tokens(tokens), spec, starts_for(row_offset), what)
