"""Ragged per-token fields (layout.md section 13): one list of ids per token,
such as the token ids the engine's sampler kept at each generated position
(``sampling_mask``), carried as ``(values, offsets)``: token t's list is
``values[offsets[t]:offsets[t + 1]]``.

The checks here are the server's rules, made on the client so a bad field
fails before anything is sent: ``offsets`` has n + 1 entries from 0 to
``len(values)`` and never decreases, ids are never negative, and with a
declared ``vocab_size`` V they lie in [0, V). Arrays are kept as given when
their dtype is a wire dtype (values int32 or uint16, offsets int32 or
int64); others are converted once.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

from rollpack.errors import PayloadError

_INT32_MAX = int(np.iinfo(np.int32).max)
_VALUE_DTYPES = (np.dtype("<i4"), np.dtype("<u2"))
_OFFSET_DTYPES = (np.dtype("<i4"), np.dtype("<i8"))


class Ragged(NamedTuple):
    """One list per token: token t's list is ``values[offsets[t]:offsets[t + 1]]``."""

    values: np.ndarray
    offsets: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.offsets.shape[0]) - 1

    def counts(self) -> np.ndarray:
        """The length of each token's list, int64 [n]."""
        return np.diff(self.offsets.astype(np.int64, copy=False))


def _host(x: Any, what: str) -> np.ndarray:
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):  # a CPU torch tensor: shared
        try:
            x = x.detach().numpy() if hasattr(x, "detach") else x.numpy()
        except Exception as e:  # a CUDA tensor
            raise PayloadError("%s: cannot view %s as numpy (%s); move it to the CPU first"
                               % (what, type(x).__name__, e)) from None
    a = np.asarray(x)
    if a.ndim != 1:
        raise PayloadError("%s must be 1-D, got shape %s" % (what, list(a.shape)))
    if a.dtype.kind not in "iu":
        if a.size == 0:  # np.asarray([]) is float64
            return a.astype(np.int64)
        raise PayloadError("%s must be integers, got dtype %s" % (what, a.dtype))
    return a


def token_of(offsets: np.ndarray, index: int) -> int:
    """The token whose list holds ``values[index]``."""
    return int(np.searchsorted(offsets, index, side="right")) - 1


def as_ragged(field: Any, n: int, what: str) -> Ragged:
    """``field`` (a :class:`Ragged` or a ``(values, offsets)`` pair of arrays)
    checked against n tokens and in its wire dtypes. Raises PayloadError
    naming ``what``, the token and the value."""
    if not isinstance(field, Ragged):
        if not isinstance(field, (tuple, list)) or len(field) != 2:
            raise PayloadError("%s must be a (values, offsets) pair, got %s"
                               % (what, type(field).__name__))
    values = _host(field[0], what + " values")
    offsets = _host(field[1], what + " offsets")
    if offsets.shape[0] != n + 1:
        raise PayloadError("%s: offsets has %d entries; one list per token needs n + 1 = %d"
                           % (what, offsets.shape[0], n + 1))
    if offsets.dtype not in _OFFSET_DTYPES:
        if offsets.size and int(offsets.max()) > np.iinfo(np.int64).max:
            raise PayloadError("%s: offsets hold values outside int64" % what)
        offsets = offsets.astype(np.int64)
    if int(offsets[0]) != 0:
        raise PayloadError("%s: offsets[0] is %d, must be 0" % (what, int(offsets[0])))
    steps = np.diff(offsets.astype(np.int64, copy=False))
    if steps.size and int(steps.min()) < 0:
        t = int(np.argmax(steps < 0))
        raise PayloadError("%s: offsets[%d] is %d, below offsets[%d] = %d (token %d's list)"
                           % (what, t + 1, int(offsets[t + 1]), t, int(offsets[t]), t))
    if int(offsets[-1]) != values.shape[0]:
        raise PayloadError("%s: offsets end at %d, values holds %d"
                           % (what, int(offsets[-1]), values.shape[0]))
    if values.dtype not in _VALUE_DTYPES and values.size:
        lo, hi = int(values.min()), int(values.max())
        if lo < 0 or hi > _INT32_MAX:
            i = int(np.argmax(values < 0)) if lo < 0 else int(np.argmax(values > _INT32_MAX))
            raise PayloadError("%s: token %d holds id %d; ids lie in [0, 2^31)"
                               % (what, token_of(offsets, i), int(values[i])))
    if values.dtype not in _VALUE_DTYPES:
        values = values.astype(np.int32)
    elif values.size and values.dtype == np.int32 and int(values.min()) < 0:
        i = int(np.argmax(values < 0))
        raise PayloadError("%s: token %d holds id %d; ids are never negative"
                           % (what, token_of(offsets, i), int(values[i])))
    return Ragged(values, offsets)


def check_vocab(field: Ragged, vocab_size: int, what: str) -> None:
    """Every id in [0, vocab_size) when the model declares V > 0."""
    if vocab_size <= 0 or not field.values.size:
        return
    if int(field.values.max()) >= vocab_size:
        i = int(np.argmax(field.values >= vocab_size))
        raise PayloadError("%s: token %d holds id %d, outside [0, %d) (vocab_size)"
                           % (what, token_of(field.offsets, i), int(field.values[i]),
                              vocab_size))


def check_distinct(field: Ragged, what: str) -> None:
    """Each id at most once in a token's list: a sampling mask is a set (the
    server refuses a repeat, naming the token)."""
    if field.values.size < 2:
        return
    tokens = np.repeat(np.arange(field.num_tokens), field.counts())
    order = np.lexsort((field.values, tokens))
    v, t = field.values[order], tokens[order]
    same = (v[1:] == v[:-1]) & (t[1:] == t[:-1])
    if same.any():
        i = int(np.argmax(same))
        raise PayloadError("%s repeats id %d in the list of token %d: a sampling mask holds "
                           "each kept id once" % (what, int(v[i]), int(t[i])))


def wire_values(field: Ragged, vocab_size: int) -> np.ndarray:
    """The values as sent: uint16 when 0 < V <= 65536 (what the server
    stores; half the bytes of int32), else as given."""
    if 0 < vocab_size <= 65536 and field.values.dtype != np.uint16:
        return field.values.astype(np.uint16)
    return field.values


def from_lists(lists: Iterable[Sequence[int]], what: str) -> Ragged:
    """A Ragged of one list per token from a list of id lists (an engine's
    JSON ``[[...], ...]``), values int32, offsets int64."""
    lists = list(lists)
    counts = np.fromiter((len(row) for row in lists), dtype=np.int64, count=len(lists))
    total = int(counts.sum())
    try:
        flat = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=total)
    except (TypeError, ValueError, OverflowError) as e:
        raise PayloadError("%s must be lists of token ids (%s)" % (what, e)) from None
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return as_ragged((flat, offsets), len(lists), what)


def from_counts(ids: Any, counts: Any, what: str) -> Ragged:
    """A Ragged from flat ids and each token's count (prime-rl's
    ``SamplingMask(ids, counts)``)."""
    c = _host(counts, what + " counts").astype(np.int64, copy=False)
    if c.size and int(c.min()) < 0:
        t = int(np.argmax(c < 0))
        raise PayloadError("%s: token %d's count is %d" % (what, t, int(c[t])))
    offsets = np.zeros(c.shape[0] + 1, dtype=np.int64)
    np.cumsum(c, out=offsets[1:])
    return as_ragged((ids, offsets), int(c.shape[0]), what)


def prepend_empty(field: Ragged, count: int) -> Ragged:
    """``count`` empty lists (prompt tokens) before the field's lists."""
    if count <= 0:
        return field
    offsets = np.concatenate([np.zeros(count, dtype=field.offsets.dtype), field.offsets])
    return Ragged(field.values, offsets)


def concat(first: Ragged, second: Ragged) -> Ragged:
    """``second``'s lists after ``first``'s (a later turn's new tokens)."""
    dtype = np.result_type(first.values.dtype, second.values.dtype)
    if dtype not in _VALUE_DTYPES:
        dtype = np.dtype(np.int32)
    values = np.concatenate([first.values.astype(dtype, copy=False),
                             second.values.astype(dtype, copy=False)])
    base = int(first.offsets[-1])
    offsets = np.concatenate([first.offsets.astype(np.int64, copy=False),
                              second.offsets[1:].astype(np.int64, copy=False) + base])
    return Ragged(values, offsets)
