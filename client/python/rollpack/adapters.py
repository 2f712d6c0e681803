"""Adapters: routed experts as each inference engine returns them -> the
``(routed_experts, row_offset)`` pair of a :class:`rollpack.Sample`.

Every adapter takes the engine's payload, the sample's tokens (prompt +
response, ``n`` of them) and the :class:`rollpack.ModelSpec`, and returns a
:class:`RoutedExperts` named tuple ``(array, row_offset)``:

* ``array`` is [rows, L, K] with L = ``num_layers`` (full layout) or the
  number of MoE layers (compact layout), whichever the payload has; it is a
  view of the decoded bytes (``np.frombuffer``) whenever the format allows,
  never a Python list.
* ``row_offset`` is the first token the rows cover.

Every adapter detects the layer axis (full vs compact), whether rows end at
``n`` or ``n - 1`` (engines never run the last sampled token through the
model) and the start offset, and refuses what does not fit with a
:class:`rollpack.errors.PayloadError` naming the numbers. Where an engine was
asked to start at ``s > 0`` (``routed_experts_prompt_start``,
``routed_experts_start_len``) but returned rows from token 0 (builds that
ignore the parameter), the row count tells, and the offset returned is 0.
When ``s = 1`` a payload of ``n - 1`` rows is read as "from 0" (what engines
that end at ``n - 1`` return), never as "from 1 to n".
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Mapping, NamedTuple, Optional, Union

import numpy as np
from numpy.typing import ArrayLike

from rollpack.errors import PayloadError
from rollpack.sample import as_tokens
from rollpack.spec import ModelSpec


class RoutedExperts(NamedTuple):
    """Routed experts [rows, L, K] covering tokens [row_offset, row_offset + rows)."""

    array: np.ndarray
    row_offset: int


__all__ = ["RoutedExperts", "from_vllm_output", "from_vllm_v021_response", "from_vllm_choice",
           "from_sglang_meta_info", "from_ndarray_dict", "decode_npy", "parse_dtype"]

_INT_DTYPES = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"}


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


def _b64(data, what):
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data)
    elif not isinstance(data, str):
        raise PayloadError("%s must be a base64 string, got %s" % (what, type(data).__name__))
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as e:
        raise PayloadError("%s is not valid base64 (%s)" % (what, e)) from None


def _place(arr, n, spec, starts, what, allow_n=True):
    """Checks a [rows, L, K] payload against the tokens and the model and
    picks its offset among ``starts`` (first that fits, rows ending at n - 1
    preferred to n)."""
    if spec.is_dense:
        raise PayloadError("%s: model %r is dense (num_experts 0): it has no routed experts"
                           % (what, spec.name))
    if arr.ndim != 3:
        raise PayloadError("%s must be [rows, layers, topk], got shape %s" % (what, list(arr.shape)))
    rows, layers, k = arr.shape
    m = spec.num_moe_layers
    if layers not in (spec.num_layers, m):
        raise PayloadError(
            "%s has %d layers; model %r has num_layers %d (full layout) and %d MoE layers "
            "(compact layout)" % (what, layers, spec.name, spec.num_layers, m))
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


def _starts(s):
    s = int(s or 0)
    if s < 0:
        raise PayloadError("start offset is %d, must be >= 0" % s)
    return (s, 0) if s > 0 else (0,)


def _n(tokens):
    if isinstance(tokens, (int, np.integer)):
        n = int(tokens)
    else:
        n = int(as_tokens(tokens).shape[0])
    if n < 1:
        raise PayloadError("tokens is empty (n must be >= 1)")
    return n


# -- vLLM in-process ---------------------------------------------------------

def from_vllm_output(output: Any, tokens: ArrayLike, spec: ModelSpec,
                     prompt_start: int = 0) -> RoutedExperts:
    """vLLM offline/in-process API: ``CompletionOutput.routed_experts``.

    Matches vLLM 0.21 and 0.22+ engines started with
    ``enable_return_routed_experts=True``: ``RequestOutput.outputs[i]
    .routed_experts`` is a numpy int32 array [n - 1, layers, K] over the
    prompt and the completion (layers = the model's decoder layers; a compact
    MoE-only axis is detected too). ``output`` may be the CompletionOutput, a
    RequestOutput (its first completion is used), or the array itself (numpy
    or a CPU torch tensor: viewed, not copied). ``prompt_start``: the
    request's ``routed_experts_prompt_start`` sampling parameter, if set.
    ``tokens``: ``prompt_token_ids + output.token_ids`` (or just n).
    """
    what = "vLLM CompletionOutput.routed_experts"
    arr = output
    if hasattr(output, "outputs") and not hasattr(output, "routed_experts"):
        outs = output.outputs
        if not outs:
            raise PayloadError("vLLM RequestOutput has no completions")
        arr = outs[0]
    if not isinstance(arr, np.ndarray) and hasattr(arr, "routed_experts"):
        arr = arr.routed_experts
    if arr is None:
        raise PayloadError("%s is None: start vLLM with enable_return_routed_experts=True"
                           % what)
    if hasattr(arr, "numpy") and not isinstance(arr, np.ndarray):
        arr = arr.detach().numpy() if hasattr(arr, "detach") else arr.numpy()
    arr = np.asarray(arr)
    if arr.dtype.kind not in "iu":
        raise PayloadError("%s has dtype %s, expected integers" % (what, arr.dtype))
    return _place(arr, _n(tokens), spec, _starts(prompt_start), what)


# -- vLLM 0.21 HTTP: nested JSON lists ----------------------------------------

def _nested(x, what, layers_hint, k):
    if x is None:
        raise PayloadError("%s is missing (null): request return_routed_experts" % what)
    try:
        a = np.array(x, dtype=np.int32)
    except (ValueError, TypeError, OverflowError) as e:
        raise PayloadError("%s is not a rectangular list of integers (%s)" % (what, e)) from None
    if a.size == 0 and a.ndim < 3:
        a = a.reshape(0, layers_hint, k)
    if a.ndim != 3:
        raise PayloadError("%s must be nested [rows][layers][topk], got %d levels (shape %s)"
                           % (what, a.ndim, list(a.shape)))
    return a


def from_vllm_v021_response(response: Any, tokens: ArrayLike, spec: ModelSpec,
                            choice_index: int = 0) -> RoutedExperts:
    """vLLM 0.21 OpenAI-compatible server (``return_routed_experts``):
    the response's top-level ``prompt_routed_experts`` (the prompt's rows,
    shared by all ``n`` choices) and ``choices[i].routed_experts`` (the
    completion's rows), both JSON nested lists [rows][moe_layers][topk] of
    int16 values on the MoE-layers axis (a full layer axis is detected too).
    The two are stitched: rows cover the prompt and the completion and end at
    n - 1 (or n). ``response``: the parsed JSON dict (or its text).
    ``tokens``: the prompt's tokens + choice ``choice_index``'s tokens.
    """
    if isinstance(response, (str, bytes, bytearray)):
        response = json.loads(response)
    choices = response.get("choices") or []
    if not 0 <= choice_index < len(choices):
        raise PayloadError("vLLM 0.21 response has %d choices, choice_index is %d"
                           % (len(choices), choice_index))
    k, m = spec.topk, spec.num_moe_layers
    what_p = "vLLM 0.21 prompt_routed_experts"
    what_c = "vLLM 0.21 choices[%d].routed_experts" % choice_index
    prompt = _nested(response.get("prompt_routed_experts"), what_p, m, k)
    comp = _nested(choices[choice_index].get("routed_experts"), what_c, prompt.shape[1], k)
    if prompt.shape[1:] != comp.shape[1:]:
        raise PayloadError("%s is [rows, %d, %d] but %s is [rows, %d, %d]"
                           % (what_p, prompt.shape[1], prompt.shape[2], what_c,
                              comp.shape[1], comp.shape[2]))
    arr = comp if prompt.shape[0] == 0 else (
        prompt if comp.shape[0] == 0 else np.concatenate([prompt, comp]))
    return _place(arr, _n(tokens), spec, (0,),
                  "vLLM 0.21 prompt_routed_experts (%d rows) + choices[%d].routed_experts "
                  "(%d rows)" % (prompt.shape[0], choice_index, comp.shape[0]))


# -- vLLM >= 0.22 HTTP: base64 .npy ------------------------------------------

def decode_npy(raw: Union[bytes, bytearray, memoryview], what: str = "npy payload") -> np.ndarray:
    """A numpy array from the bytes of a .npy file, reading dtype, shape and
    order from its header; the array is a view of ``raw`` (C order)."""
    import ast
    mv = memoryview(raw)
    if len(mv) < 10 or bytes(mv[:6]) != b"\x93NUMPY":
        raise PayloadError("%s is not a .npy file (no \\x93NUMPY magic)" % what)
    major = mv[6]
    if major == 1:
        hlen, start = int.from_bytes(mv[8:10], "little"), 10
    elif major in (2, 3):
        if len(mv) < 12:
            raise PayloadError("%s: truncated .npy header" % what)
        hlen, start = int.from_bytes(mv[8:12], "little"), 12
    else:
        raise PayloadError("%s: unsupported .npy version %d" % (what, major))
    if start + hlen > len(mv):
        raise PayloadError("%s: truncated .npy header" % what)
    try:
        header = ast.literal_eval(bytes(mv[start:start + hlen]).decode("latin1"))
        descr, fortran, shape = header["descr"], bool(header["fortran_order"]), tuple(header["shape"])
    except (ValueError, SyntaxError, KeyError, TypeError) as e:
        raise PayloadError("%s: bad .npy header (%s)" % (what, e)) from None
    dt = parse_dtype(descr, what + " dtype")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    body = len(mv) - start - hlen
    if body != count * dt.itemsize:
        raise PayloadError("%s: header says %s %s (%d bytes), the file holds %d bytes of data"
                           % (what, dt, list(shape), count * dt.itemsize, body))
    a = np.frombuffer(raw, dtype=dt, count=count, offset=start + hlen)
    if fortran and len(shape) > 1:
        return np.ascontiguousarray(a.reshape(shape[::-1]).T)
    return a.reshape(shape)


def from_vllm_choice(choice: Mapping[str, Any], tokens: ArrayLike, spec: ModelSpec,
                     prompt_start: Optional[int] = None) -> RoutedExperts:
    """vLLM >= 0.22 OpenAI-compatible server: ``choices[i].routed_experts``
    is the base64 of a .npy file (dtype and shape read from its header;
    [rows, layers, K]) covering tokens from the request's
    ``routed_experts_prompt_start`` (sampling parameter, default 0) to n - 1.
    ``prompt_start`` defaults to the choice's own
    ``routed_experts_prompt_start`` key when the server echoes it. The
    decoded array is a view of the base64-decoded bytes.
    """
    if not isinstance(choice, dict):
        raise PayloadError("vLLM choice must be a dict, got %s" % type(choice).__name__)
    idx = choice.get("index", "?")
    what = "vLLM choices[%s].routed_experts" % idx
    data = choice.get("routed_experts")
    if data is None:
        raise PayloadError("%s is missing: request return_routed_experts" % what)
    if isinstance(data, list):
        raise PayloadError("%s is a JSON list: that is the vLLM 0.21 format, use "
                           "from_vllm_v021_response" % what)
    arr = decode_npy(_b64(data, what), what)
    if prompt_start is None:
        prompt_start = choice.get("routed_experts_prompt_start", 0)
    return _place(arr, _n(tokens), spec, _starts(prompt_start), what)


# -- SGLang: base64 raw flat ---------------------------------------------------

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
    (its ``meta_info`` key is used).
    """
    if isinstance(meta_info, dict) and "meta_info" in meta_info and "routed_experts" not in meta_info:
        meta_info = meta_info["meta_info"]
    if not isinstance(meta_info, dict):
        raise PayloadError("SGLang meta_info must be a dict, got %s" % type(meta_info).__name__)
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
        raw = _b64(data, what)
        if len(raw) % dt.itemsize:
            raise PayloadError("%s holds %d bytes, not a multiple of %s's %d"
                               % (what, len(raw), dt, dt.itemsize))
        flat = np.frombuffer(raw, dtype=dt)
    if start_len is None:
        start_len = meta_info.get("routed_experts_start_len", 0)
    n, k = _n(tokens), spec.topk
    starts = _starts(start_len)
    layer_opts = (spec.num_layers,) if spec.num_layers == spec.num_moe_layers else (
        spec.num_layers, spec.num_moe_layers)
    size = flat.size
    for end in (n - 1, n):
        for s in starts:
            for layers in layer_opts:
                rows = end - s
                if rows >= 0 and rows * layers * k == size:
                    return _place(flat.reshape(rows, layers, k), n, spec, (s,), what)
    raise PayloadError(
        "%s holds %d %s values; with n = %d tokens, start_len %d, topk %d and %s layers it "
        "should hold %s values (rows [start_len, n - 1), or [0, n - 1) for builds that ignore "
        "start_len)" % (what, size, dt, n, int(start_len or 0), k,
                        " or ".join(map(str, layer_opts)),
                        " or ".join(str((end - s) * layers * k) for end in (n - 1, n)
                                    for s in starts for layers in layer_opts if end >= s)))


# -- {data, shape, dtype} base64 dict (SkyRL, ms-swift) ----------------------

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
        raise PayloadError("ndarray dict shape %r is not a list of integers" % (d["shape"],)) from None
    if any(x < 0 for x in shape):
        raise PayloadError("ndarray dict shape %s has a negative size" % list(shape))
    raw = _b64(d["data"], "ndarray dict data")
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
    return _place(arr, _n(tokens), spec, _starts(row_offset), what)
