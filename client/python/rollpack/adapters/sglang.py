"""SGLang: ``meta_info.routed_experts`` (base64 of the raw flat array) of one
response, and the per-turn slices of a multi-turn sample assembled into one
payload."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from numpy.typing import ArrayLike

from rollpack.adapters._common import (RoutedExperts, b64, mtp_extra, num_tokens, parse_dtype,
                                       place, starts_for)
from rollpack.errors import PayloadError
from rollpack.sample import as_tokens
from rollpack.spec import ModelSpec


def _meta(meta_info: Any) -> Mapping[str, Any]:
    """meta_info from a /generate response, a chat/completions choice
    (``sgl_ext``) or meta_info itself."""
    if isinstance(meta_info, dict) and "routed_experts" not in meta_info:
        if "meta_info" in meta_info:
            meta_info = meta_info["meta_info"]
        elif isinstance(meta_info.get("sgl_ext"), dict):
            meta_info = meta_info["sgl_ext"]
    if not isinstance(meta_info, dict):
        raise PayloadError("SGLang meta_info must be a dict, got %s" % type(meta_info).__name__)
    return meta_info


def from_sglang_meta_info(meta_info: Mapping[str, Any], tokens: ArrayLike, spec: ModelSpec,
                          start_len: Optional[int] = None) -> RoutedExperts:
    """SGLang ``/generate`` with ``--enable-return-routed-experts`` and
    ``return_routed_experts: true`` (SGLang builds since sgl-project/sglang
    PR 12162, which added the capture; ``routed_experts_start_len`` came
    later and some builds ignore it): ``meta_info.routed_experts``
    is the base64 of the raw flat array, int32 unless
    ``meta_info.routed_experts_dtype`` names another dtype. Its shape comes
    from the model and the tokens: rows cover ``[routed_experts_start_len,
    n - 1)`` (a request parameter: read from meta_info when the response
    carries it, else pass ``start_len``), layers = num_layers (full; compact detected
    too), K = topk. Builds that ignore start_len return n - 1 rows from token
    0: detected by the row count. ``meta_info`` may also be the whole response
    (its ``meta_info`` key is used) or a ``/v1/(chat/)completions`` choice,
    whose ``sgl_ext`` object carries the same field (SGLang PR 17434; SGLang's
    docs, basic_usage/openai_api_completions).
    """
    meta_info = _meta(meta_info)
    what = "SGLang meta_info.routed_experts"
    data = meta_info.get("routed_experts")
    if data is None:
        raise PayloadError("%s is missing: launch with --enable-return-routed-experts and send "
                           "return_routed_experts" % what)
    if spec.is_dense:
        raise PayloadError("%s: model %r is dense (num_experts 0)" % (what, spec.name))
    dt = parse_dtype(meta_info.get("routed_experts_dtype") or "int32", "routed_experts_dtype")
    if isinstance(data, list):
        flat = np.asarray(data, dtype=dt).reshape(-1)
    else:
        raw = b64(data, what)
        if len(raw) % dt.itemsize:
            raise PayloadError("%s holds %d bytes, not a multiple of %s's %d"
                               % (what, len(raw), dt, dt.itemsize))
        flat = np.frombuffer(raw, dtype=dt)
    if start_len is None:
        start_len = meta_info.get("routed_experts_start_len", 0)
    n, k = num_tokens(tokens), spec.topk
    starts = starts_for(start_len)
    layer_opts = (spec.num_layers,) if spec.num_layers == spec.num_moe_layers else (
        spec.num_layers, spec.num_moe_layers)
    size = flat.size
    for end in (n - 1, n):
        for s in starts:
            for layers in layer_opts:
                rows = end - s
                if rows >= 0 and rows * layers * k == size:
                    return place(flat.reshape(rows, layers, k), n, spec, (s,), what)
    raise PayloadError(
        "%s holds %d %s values; with n = %d tokens, start_len %d, topk %d and %s layers it "
        "should hold %s values (rows [start_len, n - 1), or [0, n - 1) for builds that ignore "
        "start_len)" % (what, size, dt, n, int(start_len or 0), k,
                        " or ".join(map(str, layer_opts)),
                        " or ".join(str((end - s) * layers * k) for end in (n - 1, n)
                                    for s in starts for layers in layer_opts if end >= s)))


# -- multi-turn: per-turn slices -> one sample -------------------------------

Turn = Tuple[Any, ...]  # (meta_info, tokens) or (meta_info, tokens, start_len)


def from_sglang_turns(turns: Sequence[Turn], spec: ModelSpec, *,
                      allow_identical_overlap: bool = False) -> RoutedExperts:
    """One multi-turn sample from SGLang's per-turn slices.

    In a multi-turn rollout each turn is a new request over the whole
    conversation so far, sent with ``routed_experts_start_len`` = where the
    rows already collected end, so that the response carries only the new
    rows ``[routed_experts_start_len, n_turn - 1)`` (SGLang's docs,
    basic_usage/openai_api_completions; THUDM/slime PR 2185 and
    strands-rl/strands-sglang PR 12 send it turn by turn). ``turns``: the
    turns in order, each ``(meta_info, tokens)`` or ``(meta_info, tokens,
    start_len)`` as :func:`from_sglang_meta_info` takes them, where
    ``tokens`` is the turn's whole token sequence (the conversation so far).

    Returns the rows of all turns in one array with the first turn's offset.
    Refused, naming the turn and the tokens: a turn whose tokens do not
    extend the previous turn's (a different conversation), a gap between the
    rows held and the turn's first row (a start_len past them: the next turn
    must start at or before the previous turn's n - 1), rows that overlap
    rows already held (unless ``allow_identical_overlap``: then the
    overlapping rows must be identical on every MoE layer, as a
    prefix-cached engine or a build that ignores start_len returns them),
    and turns that disagree on the layer axis (full vs compact). The result
    is a copy (the turns' arrays are joined) unless there is one turn.
    """
    if not turns:
        raise PayloadError("SGLang turns: no turns given")
    parts: List[np.ndarray] = []
    start = end = 0
    layers = -1
    prev: Optional[np.ndarray] = None
    for i, turn in enumerate(turns):
        if not isinstance(turn, (tuple, list)) or len(turn) not in (2, 3):
            raise PayloadError("SGLang turn %d must be (meta_info, tokens) or (meta_info, tokens, "
                               "start_len), got %s" % (i, type(turn).__name__))
        meta, toks = turn[0], turn[1]
        start_len = turn[2] if len(turn) == 3 else None
        toks = as_tokens(toks)
        if prev is not None:
            _check_extends(prev, toks, i)
        try:
            arr, off = from_sglang_meta_info(meta, toks, spec, start_len=start_len)
        except PayloadError as e:
            raise PayloadError("SGLang turn %d: %s" % (i, e)) from None
        rows = arr.shape[0]
        if i == 0:
            parts, start, end, layers = [arr], off, off + rows, arr.shape[1]
            prev = toks
            continue
        if arr.shape[1] != layers:
            raise PayloadError("SGLang turn %d has %d layers, turn 0 has %d: the turns disagree "
                               "on the layer axis (full vs compact)" % (i, arr.shape[1], layers))
        if off > end:
            raise PayloadError(
                "SGLang turn %d: rows start at token %d but the earlier turns' rows end at %d: "
                "rows [%d, %d) are missing (send routed_experts_start_len <= %d)"
                % (i, off, end, end, off, end))
        if off < end:
            if not allow_identical_overlap:
                raise PayloadError(
                    "SGLang turn %d: rows start at token %d, before the end of the earlier "
                    "turns' rows at %d: rows [%d, %d) overlap (send routed_experts_start_len = "
                    "%d, or pass allow_identical_overlap=True to accept identical copies)"
                    % (i, off, end, off, min(end, off + rows), end))
            held = parts[0] if len(parts) == 1 else np.concatenate(parts)
            lo = max(off, start)
            hi = min(end, off + rows)
            _check_same(held[lo - start:hi - start], arr[lo - off:hi - off], lo, spec, i)
            if off < start:  # this turn also covers tokens before the first turn's rows
                parts, start = [arr[:start - off], held], off
            arr = arr[max(end - off, 0):]
        parts.append(arr)
        end = max(end, off + rows)
        prev = toks
    out = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return place(out, int(prev.shape[0]), spec, (start,),
                 "SGLang turns 0..%d (rows [%d, %d))" % (len(turns) - 1, start, end))


def _check_extends(prev: np.ndarray, toks: np.ndarray, i: int) -> None:
    p = prev.shape[0]
    if toks.shape[0] < p:
        raise PayloadError("SGLang turn %d has %d tokens, fewer than turn %d's %d: a turn's "
                           "tokens must extend the previous turn's" % (i, toks.shape[0], i - 1, p))
    diff = np.flatnonzero(toks[:p] != prev)
    if diff.size:
        t = int(diff[0])
        raise PayloadError("SGLang turn %d: token %d is %d but turn %d's is %d: a turn's "
                           "tokens must extend the previous turn's"
                           % (i, t, int(toks[t]), i - 1, int(prev[t])))


def _check_same(held: np.ndarray, new: np.ndarray, first: int, spec: ModelSpec,
                i: int) -> None:
    """Overlapping rows must agree on every routed layer (dense layers of a
    full layout hold whatever the engine left there)."""
    d = mtp_extra(spec)
    ids = list(spec.resolved_moe_layers) + list(range(spec.num_layers, spec.num_layers + d))
    if new.shape[1] != len(ids):  # full layout: keep the routed layers' columns
        held, new = held[:, ids, :], new[:, ids, :]
    bad = np.argwhere(held != new)
    if bad.size:
        r, col, _ = (int(x) for x in bad[0])
        raise PayloadError(
            "SGLang turn %d disagrees with the earlier turns at token %d, layer %d: %s vs %s"
            % (i, first + r, ids[col], held[r, col].tolist(), new[r, col].tolist()))
