"""Sample: one rollout (tokens + routed experts + per-token fields) built
from numpy arrays, checked and narrowed on the client before it is sent.

Arrays are kept as given (``np.asarray``: no copy when the dtype already
fits), so building a Sample from an engine's arrays costs nothing. The one
copy happens when the sample is encoded for the wire (``to_proto``), and
there routed experts are narrowed to the smallest dtype the server accepts
(uint8 when E <= 256, else uint16; int16 when the payload marks missing rows
with -1), and full-layout payloads of models with dense layers drop those
layers (compact layout), since the copy is made anyway.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import numpy as np
from numpy.typing import ArrayLike

from rollpack import ndarray as _nd
from rollpack import ragged as _rg
from rollpack._proto import rollouts_pb2
from rollpack.errors import PayloadError
from rollpack.spec import ModelSpec

_ROUTED_KINDS = "iu"
_ROUTED_WIRE = (np.dtype("u1"), np.dtype("<u2"), np.dtype("<i2"), np.dtype("<i4"))


def _as_array(x: Any, what: str) -> np.ndarray:
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):  # CPU torch tensor: shares memory
        try:
            x = x.detach().numpy() if hasattr(x, "detach") else x.numpy()
        except Exception as e:  # e.g. a CUDA tensor
            raise PayloadError("%s: cannot view %s as numpy (%s); move it to the CPU first"
                               % (what, type(x).__name__, e)) from None
    return np.asarray(x)


def as_tokens(tokens: ArrayLike) -> np.ndarray:
    """int32 [n] view of ``tokens`` (copies only when the dtype differs)."""
    t = _as_array(tokens, "tokens")
    if t.ndim != 1:
        raise PayloadError("tokens must be 1-D, got shape %s" % (list(t.shape),))
    if t.dtype.kind not in "iu":
        if t.size == 0 and t.dtype.kind == "f":  # np.asarray([]) is float64
            t = t.astype(np.int32)
        else:
            raise PayloadError("tokens must be integers, got dtype %s" % t.dtype)
    if t.dtype != np.int32:
        if t.size and (int(t.min()) < np.iinfo(np.int32).min or
                       int(t.max()) > np.iinfo(np.int32).max):
            raise PayloadError("tokens hold ids outside int32")
        t = t.astype(np.int32)
    return t


def _moe_view(arr: np.ndarray, spec: ModelSpec) -> np.ndarray:
    """The stored layers of a [rows, L, K] payload (the MoE layers, then the
    MTP layers with ``mtp_routing``): the array itself (compact or all-MoE),
    a slice view (contiguous ids) or a gathered copy."""
    m = spec.stored_layer_ids
    if arr.shape[1] == len(m):
        return arr
    if m and m[-1] - m[0] + 1 == len(m):
        return arr[:, m[0]:m[-1] + 1, :]
    return arr[:, list(m), :]


def narrow_routed_experts(arr: np.ndarray, spec: ModelSpec,
                          what: str = "routed_experts") -> np.ndarray:
    """Returns ``arr`` in the smallest wire dtype that holds it, in compact
    layout when that takes no extra copy. Raises PayloadError for values the
    server would refuse anyway (ids >= E, values < -1, uint8 with E > 256)."""
    e = spec.num_experts
    if arr.dtype == np.uint8 and e > 256:
        raise PayloadError("%s is uint8 but the model has %d experts (> 256): the ids "
                           "were truncated by the producer" % (what, e))
    moe = _moe_view(arr, spec)
    if moe.size == 0:
        target = np.dtype("u1") if e <= 256 else np.dtype("<u2")
        return np.zeros(moe.shape, target) if moe.dtype != target else moe
    lo, hi = int(moe.min()), int(moe.max())
    if hi >= e:
        raise PayloadError("%s holds expert id %d, outside [0, %d) (num_experts)" % (what, hi, e))
    if lo < -1:
        raise PayloadError("%s holds %d: ids must be in [0, %d), or -1 on every MoE layer "
                           "of a missing token" % (what, lo, e))
    if lo >= 0:
        target = np.dtype("u1") if e <= 256 else np.dtype("<u2")
    else:  # missing rows: keep a signed dtype
        target = np.dtype("<i2") if e <= 32768 else np.dtype("<i4")
    if arr.dtype == target:
        return arr  # already narrow: sent as is (dense layers included), no copy
    if target.itemsize > arr.dtype.itemsize and arr.dtype in _ROUTED_WIRE:
        return arr  # e.g. int16 input with E > 32768 ids impossible; keep what fits
    return moe.astype(target)


class Sample:
    """One rollout.

    ``Sample(sample_id, tokens, routed_experts=None, row_offset=0, *,
    token_fields=None, scalars=None, group_id="", policy_version=0,
    group_size=0, ragged_token_fields=None)``

    ``tokens``: int [n]. ``routed_experts``: [rows, L, K] integer array
    covering tokens ``[row_offset, row_offset + rows)`` (L = num_layers or
    number of MoE layers; plus num_mtp_layers with ``spec.mtp_routing``, the
    MTP layers' entries after the decoder's). Adapters in :mod:`rollpack.adapters` return
    ``(routed_experts, row_offset)``, so ``Sample(id, tokens,
    *from_vllm_choice(choice, tokens, spec))`` works. ``token_fields``: name ->
    array with first dimension n. ``ragged_token_fields``: name -> ``(values,
    offsets)``, one list of ids per token (layout.md section 13): token t's
    list is ``values[offsets[t]:offsets[t + 1]]``, values int32 or uint16
    (other integer arrays are converted), offsets int32 or int64 [n + 1];
    e.g. ``{"sampling_mask": adapters.from_vllm_sampling_mask(out, tokens)}``.
    ``scalars``: name -> float.
    ``group_id`` / ``group_size``: the sample's GRPO/RLOO group and its number
    of samples (0 = ungrouped, or the pool's ``default_group_size``); whole
    groups are what ``CreateStep(num_groups=...)`` takes.
    ``policy_version``: the version of the weights that generated it.
    ``piece`` / ``partial``: one piece of a rollout sent in pieces
    (lifecycle.md section 5; :meth:`Producer.rollout` numbers them for you):
    piece k carries only its new tokens and field rows (ragged fields: the
    lists of its new tokens), its routed rows in
    whole-sample positions, and ``partial`` while more pieces follow.
    """

    __slots__ = ("sample_id", "tokens", "routed_experts", "row_offset", "token_fields",
                 "scalars", "group_id", "policy_version", "group_size", "piece", "partial",
                 "ragged_token_fields")

    sample_id: str
    tokens: np.ndarray
    routed_experts: Optional[np.ndarray]
    row_offset: int
    token_fields: Dict[str, np.ndarray]
    ragged_token_fields: Dict[str, _rg.Ragged]
    scalars: Dict[str, float]
    group_id: str
    policy_version: int
    group_size: int
    piece: int
    partial: bool

    def __init__(self, sample_id: str, tokens: ArrayLike,
                 routed_experts: Optional[ArrayLike] = None, row_offset: int = 0, *,
                 token_fields: Optional[Mapping[str, ArrayLike]] = None,
                 scalars: Optional[Mapping[str, float]] = None, group_id: str = "",
                 policy_version: int = 0, group_size: int = 0, piece: int = 0,
                 partial: bool = False,
                 ragged_token_fields: Optional[Mapping[str, Any]] = None) -> None:
        if not isinstance(sample_id, str) or not sample_id:
            raise PayloadError("sample_id must be a non-empty string, got %r" % (sample_id,))
        self.sample_id = sample_id
        self.piece = int(piece)
        self.partial = bool(partial)
        if self.piece < 0:
            raise PayloadError("sample %r: piece is %d, must be >= 0" % (sample_id, self.piece))
        self.tokens = as_tokens(tokens)
        if self.tokens.size < 1 and self.piece == 0:
            raise PayloadError("sample %r: tokens is empty (n must be >= 1)" % sample_id)
        self.routed_experts = None
        if routed_experts is not None:
            r = _as_array(routed_experts, "routed_experts")
            if r.ndim != 3:
                raise PayloadError("sample %r: routed_experts must be [rows, layers, topk], "
                                   "got shape %s" % (sample_id, list(r.shape)))
            if r.dtype.kind not in _ROUTED_KINDS:
                raise PayloadError("sample %r: routed_experts must be integers, got %s"
                                   % (sample_id, r.dtype))
            self.routed_experts = r
        self.row_offset = int(row_offset)
        if self.row_offset < 0:
            raise PayloadError("sample %r: row_offset is %d, must be >= 0"
                               % (sample_id, self.row_offset))
        self.token_fields = {}
        for k, v in (token_fields or {}).items():
            self.token_fields[str(k)] = _as_array(v, "token_fields[%r]" % k)
        self.ragged_token_fields = {}
        for k, v in (ragged_token_fields or {}).items():
            self.ragged_token_fields[str(k)] = _rg.as_ragged(
                v, self.num_tokens, "sample %r: ragged_token_fields[%r]" % (sample_id, k))
        self.scalars = {str(k): float(v) for k, v in (scalars or {}).items()}
        self.group_id = str(group_id)
        self.policy_version = int(policy_version)
        self.group_size = int(group_size)
        if self.group_size < 0:
            raise PayloadError("sample %r: group_size is %d, must be >= 0"
                               % (sample_id, self.group_size))
        if self.group_size > 0 and not self.group_id and self.piece == 0:
            raise PayloadError("sample %r: group_size is %d but group_id is empty"
                               % (sample_id, self.group_size))
        self._check_fields()

    @property
    def num_tokens(self) -> int:
        """n, the number of tokens."""
        return int(self.tokens.shape[0])

    def _check_fields(self) -> None:
        n = self.num_tokens
        for k, v in self.token_fields.items():
            if v.ndim < 1 or v.shape[0] != n:
                raise PayloadError("sample %r: token_fields[%r] has shape %s, its first "
                                   "dimension must be n = %d" % (self.sample_id, k,
                                                                 list(v.shape), n))
            _nd.wire_dtype(v.dtype)
        for k in self.ragged_token_fields:
            if not k:
                raise PayloadError("sample %r: a ragged token field has an empty name"
                                   % self.sample_id)
            if k in self.token_fields:
                raise PayloadError("sample %r: %r is both a token field and a ragged token "
                                   "field" % (self.sample_id, k))

    def check(self, spec: ModelSpec) -> None:
        """Client-side checks of the layout rules (shapes, coverage, id range
        via narrowing); the server re-checks everything."""
        sid, n = self.sample_id, self.num_tokens
        for k, field in self.ragged_token_fields.items():
            _rg.check_vocab(field, spec.vocab_size,
                            "sample %r: ragged_token_fields[%r]" % (sid, k))
            if k == "sampling_mask":
                _rg.check_distinct(field, "sample %r: ragged_token_fields[%r]" % (sid, k))
        r = self.routed_experts
        if spec.is_dense:
            if r is not None and r.size:
                raise PayloadError("sample %r: model %r is dense (num_experts 0) but the "
                                   "sample carries routed_experts" % (sid, spec.name))
            return
        if r is None:
            if self.piece > 0 or self.partial:
                return  # no rows in this piece
            raise PayloadError("sample %r: model %r has %d experts: routed_experts is required"
                               % (sid, spec.name, spec.num_experts))
        rows, layers, k = r.shape
        m = spec.num_moe_layers
        if layers not in spec.payload_layers:
            d = spec.routed_mtp_layers
            if d:
                raise PayloadError(
                    "sample %r: routed_experts has %d layers; model %r has mtp_routing: "
                    "num_layers + num_mtp_layers = %d (full layout) or %d MoE + %d MTP layers = "
                    "%d (compact layout)" % (sid, layers, spec.name, spec.num_layers + d, m, d,
                                             m + d))
            hint = ""
            if spec.num_mtp_layers and layers in (spec.num_layers + spec.num_mtp_layers,
                                                  m + spec.num_mtp_layers):
                hint = ("; it seems to carry the %d MTP layers too, which needs the model "
                        "registered with mtp_routing=True" % spec.num_mtp_layers)
            raise PayloadError(
                "sample %r: routed_experts has %d layers; model %r has num_layers %d (full "
                "layout) and %d MoE layers (compact layout)%s" % (sid, layers, spec.name,
                                                                  spec.num_layers, m, hint))
        if k != spec.topk:
            raise PayloadError("sample %r: routed_experts has %d experts per token, model "
                               "topk is %d" % (sid, k, spec.topk))
        end = self.row_offset + rows
        if self.piece > 0:
            return  # whole-sample positions: the server checks them against the stored rows
        if self.partial:
            if end > n:
                raise PayloadError("sample %r: the first piece's routed_experts rows [%d, %d) "
                                   "must end inside its %d tokens" % (sid, self.row_offset, end, n))
            return
        if end not in (n, n - 1):
            raise PayloadError(
                "sample %r: routed_experts rows [%d, %d) must end at n = %d or n - 1 = %d"
                % (sid, self.row_offset, end, n, n - 1))

    def to_proto(self, spec: ModelSpec,
                 pb: Optional[rollouts_pb2.Sample] = None) -> rollouts_pb2.Sample:
        """Encodes into a rollouts_pb2.Sample (``pb`` filled in place when
        given), narrowing routed experts for ``spec``."""
        self.check(spec)
        if pb is None:
            pb = rollouts_pb2.Sample()
        pb.sample_id = self.sample_id
        pb.group_id = self.group_id
        pb.policy_version = self.policy_version
        pb.group_size = self.group_size
        pb.piece = self.piece
        pb.partial = self.partial
        if self.tokens.size:
            _nd.fill(pb.tokens, self.tokens)
        if self.routed_experts is not None and not spec.is_dense:
            _nd.fill(pb.routed_experts,
                     narrow_routed_experts(self.routed_experts, spec,
                                           "sample %r: routed_experts" % self.sample_id))
            pb.routed_experts_row_offset = self.row_offset
        for k, v in self.token_fields.items():
            _nd.fill(pb.token_fields[k], v)
        for k, field in self.ragged_token_fields.items():
            _nd.fill(pb.ragged_token_fields[k].values, _rg.wire_values(field, spec.vocab_size))
            _nd.fill(pb.ragged_token_fields[k].offsets, field.offsets)
        for k, v in self.scalars.items():
            pb.scalars[k] = v
        return pb

    def wire_size_hint(self) -> int:
        """Upper bound of the encoded size, before narrowing (for batching)."""
        b = self.tokens.nbytes + 128 + len(self.sample_id) + len(self.group_id)
        if self.routed_experts is not None:
            b += self.routed_experts.size * min(self.routed_experts.dtype.itemsize, 2) + 32
        for k, v in self.token_fields.items():
            b += v.nbytes + len(k) + 32
        for k, field in self.ragged_token_fields.items():
            b += field.values.nbytes + field.offsets.nbytes + len(k) + 48
        return b + 24 * len(self.scalars)

    # -- multi-turn stitching ------------------------------------------------
    def extend(self, tokens: ArrayLike, routed_experts: Optional[ArrayLike], row_offset: int,
               spec: Optional[ModelSpec] = None,
               token_fields: Optional[Mapping[str, ArrayLike]] = None,
               ragged_token_fields: Optional[Mapping[str, Any]] = None) -> Sample:
        """Extends this sample in place with a later turn of the same rollout.

        ``tokens``: the later turn's whole sequence (this sample's tokens must
        be its prefix). ``routed_experts``/``row_offset``: the later turn's
        payload, covering ``[row_offset, ...)`` (e.g. vLLM's
        ``routed_experts_prompt_start`` or SGLang's ``routed_experts_start_len``,
        or an adapter's result). Rows before ``row_offset`` are kept from this
        sample; rows from ``row_offset`` on come from the later turn (they
        replace any overlap). ``row_offset`` must not leave a gap after this
        sample's rows nor start before them. ``token_fields``: arrays with first
        dimension either the new n (replace) or the number of appended tokens
        (append); a field this sample carries must be given.
        ``ragged_token_fields``: ``(values, offsets)`` with offsets of the new
        n + 1 entries (replace) or of the appended tokens + 1 (append); a
        ragged field this sample carries must be given too.
        """
        sid = self.sample_id
        new_tokens = as_tokens(tokens)
        n0, n1 = self.num_tokens, int(new_tokens.shape[0])
        if n1 < n0:
            raise PayloadError("sample %r: the later turn has %d tokens, fewer than the %d "
                               "already held" % (sid, n1, n0))
        if not np.array_equal(new_tokens[:n0], self.tokens):
            pos = int(np.flatnonzero(new_tokens[:n0] != self.tokens)[0])
            raise PayloadError("sample %r: the later turn's tokens differ from the held ones at "
                               "position %d (%d vs %d): not a continuation"
                               % (sid, pos, int(new_tokens[pos]), int(self.tokens[pos])))
        r_new = _as_array(routed_experts, "routed_experts")
        if r_new.ndim != 3:
            raise PayloadError("sample %r: the later turn's routed_experts must be 3-D, got %s"
                               % (sid, list(r_new.shape)))
        start = int(row_offset)
        if self.routed_experts is None:
            raise PayloadError("sample %r holds no routed_experts to extend" % sid)
        old, off = self.routed_experts, self.row_offset
        old_end = off + old.shape[0]
        if start < off or start > old_end:
            raise PayloadError(
                "sample %r: the later turn's rows start at %d; held rows cover [%d, %d): the "
                "start must be within [%d, %d] (no gap, no rows before the held ones)"
                % (sid, start, off, old_end, off, old_end))
        if old.shape[2] != r_new.shape[2]:
            raise PayloadError("sample %r: topk %d of the later turn differs from %d"
                               % (sid, r_new.shape[2], old.shape[2]))
        if old.shape[1] != r_new.shape[1]:
            if spec is None:
                raise PayloadError(
                    "sample %r: the later turn has %d layers, the held rows %d; pass spec= to "
                    "convert both to the compact layout" % (sid, r_new.shape[1], old.shape[1]))
            full, compact = spec.payload_layers or (spec.num_layers, spec.num_moe_layers)
            for what, a in (("held rows", old), ("later turn", r_new)):
                if a.shape[1] not in (full, compact):
                    raise PayloadError("sample %r: %s have %d layers; model has %d (full) / %d "
                                       "(compact)" % (sid, what, a.shape[1], full, compact))
            old, r_new = _moe_view(old, spec), _moe_view(r_new, spec)
        kept = old[:start - off]
        dtype = np.result_type(kept.dtype, r_new.dtype)
        if kept.shape[0] == 0:
            rows = r_new
        else:
            rows = np.concatenate([kept.astype(dtype, copy=False), r_new.astype(dtype, copy=False)])
        fields = {}
        given = dict(token_fields or {})
        for k, v in self.token_fields.items():
            if k not in given:
                raise PayloadError("sample %r: token_fields[%r] is held; give the later turn's "
                                   "values too" % (sid, k))
        for k, v in given.items():
            v = _as_array(v, "token_fields[%r]" % k)
            if v.ndim >= 1 and v.shape[0] == n1:
                fields[k] = v
            elif v.ndim >= 1 and v.shape[0] == n1 - n0 and k in self.token_fields:
                fields[k] = np.concatenate([self.token_fields[k], v.astype(
                    self.token_fields[k].dtype, copy=False)])
            else:
                raise PayloadError("sample %r: token_fields[%r] of the later turn has %d rows; "
                                   "expected %d (whole sequence) or %d (appended tokens)"
                                   % (sid, k, v.shape[0] if v.ndim else 0, n1, n1 - n0))
        ragged = self._extended_ragged(ragged_token_fields, n0, n1)
        end = off + rows.shape[0]
        if end not in (n1, n1 - 1):
            raise PayloadError("sample %r: stitched rows [%d, %d) must end at n = %d or n - 1"
                               % (sid, off, end, n1))
        self.tokens, self.routed_experts, self.token_fields = new_tokens, rows, fields
        self.ragged_token_fields = ragged
        return self

    def _extended_ragged(self, given: Optional[Mapping[str, Any]], n0: int,
                         n1: int) -> Dict[str, _rg.Ragged]:
        sid = self.sample_id
        given = dict(given or {})
        for k in self.ragged_token_fields:
            if k not in given:
                raise PayloadError("sample %r: ragged_token_fields[%r] is held; give the later "
                                   "turn's lists too" % (sid, k))
        out = {}
        for k, v in given.items():
            what = "sample %r: ragged_token_fields[%r] of the later turn" % (sid, k)
            held = self.ragged_token_fields.get(k)
            entries = len(v[1]) if isinstance(v, (tuple, list)) and len(v) == 2 else -1
            if held is not None and entries == n1 - n0 + 1 and n1 != n0:
                out[k] = _rg.concat(held, _rg.as_ragged(v, n1 - n0, what))
            else:
                out[k] = _rg.as_ragged(v, n1, what)
        return out

    def __repr__(self) -> str:
        r = self.routed_experts
        return "Sample(%r, n=%d, routed_experts=%s, row_offset=%d, fields=%s)" % (
            self.sample_id, self.num_tokens,
            None if r is None else "%s%s" % (r.dtype, list(r.shape)), self.row_offset,
            sorted(self.token_fields) + sorted(self.ragged_token_fields))
