"""vLLM: the in-process CompletionOutput (int32 numpy, and the newest int16
capture taken on the device), the 0.21 OpenAI server's nested JSON lists and
the >= 0.22 server's base64 .npy."""

from __future__ import annotations

import ast
import json
from typing import Any, Mapping, Optional, Union

import numpy as np
from numpy.typing import ArrayLike

from rollpack.adapters._common import (RoutedExperts, b64, host_array, is_torch_tensor,
                                       nested_ints, num_tokens, parse_dtype, place,
                                       require_integers, starts_for, torch_dtype_name)
from rollpack.errors import PayloadError
from rollpack.sample import as_tokens
from rollpack.spec import ModelSpec


def _completion(output: Any, what: str) -> Any:
    """The first CompletionOutput of a RequestOutput, or ``output`` itself."""
    if hasattr(output, "outputs") and not hasattr(output, "routed_experts"):
        outs = output.outputs
        if not outs:
            raise PayloadError("%s: the RequestOutput has no completions" % what)
        return outs[0]
    return output


# -- in-process, numpy int32 (vLLM 0.21 / 0.22+) ------------------------------

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
    arr = _completion(output, "vLLM")
    if not isinstance(arr, np.ndarray) and hasattr(arr, "routed_experts"):
        arr = arr.routed_experts
    if arr is None:
        raise PayloadError("%s is None: start vLLM with enable_return_routed_experts=True"
                           % what)
    if hasattr(arr, "numpy") and not isinstance(arr, np.ndarray):
        arr = arr.detach().numpy() if hasattr(arr, "detach") else arr.numpy()
    arr = np.asarray(arr)
    require_integers(arr, what)
    return place(arr, num_tokens(tokens), spec, starts_for(prompt_start), what)


# -- in-process, int16 captured on the device (newest vLLM) ---------------------

def from_vllm_device_capture(output: Any, tokens: Optional[ArrayLike], spec: ModelSpec,
                             prompt_start: int = 0) -> RoutedExperts:
    """The newest vLLM capture: ``CompletionOutput.routed_experts`` as int16
    [seq_len - 1, layers, K], signed: a row of -1 is a token without routing
    (a missing row, layout.md section 1).

    Source: vllm-project/vllm PR 39917 ("Replace routing replay with device
    cache and async D2H pipeline") keeps the capture in an int16 device
    buffer (``routed_experts_capturer.py``: int16 halves the buffer, the
    expert count fits) and hands it out after an asynchronous D2H copy;
    ROCm/ATOM PR 2274 restates the resulting field contract as
    ``CompletionOutput.routed_experts`` int16 ``[seq_len-1, num_layers,
    top_k]`` (layers = the model's ``num_hidden_layers``: full layout; a
    compact MoE-only axis is detected too). The value may arrive as a torch
    tensor on the accelerator (copied to the host once), a CPU tensor or a
    numpy array (viewed, never copied); torch is never imported here. The
    int16 dtype is kept, so -1 rows stay "missing" (layout.md section 1).

    ``output``: a RequestOutput (first completion), a CompletionOutput, or
    the array. ``tokens``: prompt + completion tokens (or n); may be None
    for a RequestOutput, whose ``prompt_token_ids`` + ``token_ids`` are used.
    ``prompt_start``: the request's ``routed_experts_prompt_start``.
    """
    what = "vLLM CompletionOutput.routed_experts (int16 device capture)"
    if tokens is None:
        tokens = _request_tokens(output, what)
    comp = _completion(output, "vLLM")
    arr = comp.routed_experts if hasattr(comp, "routed_experts") else comp
    if arr is None:
        raise PayloadError("%s is None: start vLLM with enable_return_routed_experts=True"
                           % what)
    # Check the dtype before any device -> host copy: a wrong array is refused
    # where it lies.
    name = torch_dtype_name(arr) if is_torch_tensor(arr) else str(np.asarray(arr).dtype)
    if name != "int16":
        hint = (" (int32 numpy is the older capture: use from_vllm_output)"
                if name in ("int32", "int64") else "")
        raise PayloadError("%s has dtype %s, expected int16%s" % (what, name, hint))
    host = host_array(arr, what)
    return place(host, num_tokens(tokens), spec, starts_for(prompt_start), what)


def _request_tokens(output: Any, what: str) -> np.ndarray:
    prompt = getattr(output, "prompt_token_ids", None)
    comp = _completion(output, "vLLM") if hasattr(output, "outputs") else None
    if prompt is None or comp is None or getattr(comp, "token_ids", None) is None:
        raise PayloadError("%s: tokens is None and %s carries no prompt_token_ids and "
                           "token_ids to count them: pass tokens" % (what, type(output).__name__))
    p = as_tokens(host_array(prompt, "prompt_token_ids"))
    c = as_tokens(host_array(comp.token_ids, "token_ids"))
    return np.concatenate([p, c])


# -- vLLM 0.21 HTTP: nested JSON lists ----------------------------------------

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
    for what, x in ((what_p, response.get("prompt_routed_experts")),
                    (what_c, choices[choice_index].get("routed_experts"))):
        if x is None:
            raise PayloadError("%s is missing (null): request return_routed_experts" % what)
    prompt = nested_ints(response.get("prompt_routed_experts"), what_p, m, k)
    comp = nested_ints(choices[choice_index].get("routed_experts"), what_c, prompt.shape[1], k)
    if prompt.shape[1:] != comp.shape[1:]:
        raise PayloadError("%s is [rows, %d, %d] but %s is [rows, %d, %d]"
                           % (what_p, prompt.shape[1], prompt.shape[2], what_c,
                              comp.shape[1], comp.shape[2]))
    arr = comp if prompt.shape[0] == 0 else (
        prompt if comp.shape[0] == 0 else np.concatenate([prompt, comp]))
    return place(arr, num_tokens(tokens), spec, (0,),
                 "vLLM 0.21 prompt_routed_experts (%d rows) + choices[%d].routed_experts "
                 "(%d rows)" % (prompt.shape[0], choice_index, comp.shape[0]))


# -- vLLM >= 0.22 HTTP: base64 .npy ------------------------------------------

def decode_npy(raw: Union[bytes, bytearray, memoryview], what: str = "npy payload") -> np.ndarray:
    """A numpy array from the bytes of a .npy file, reading dtype, shape and
    order from its header; the array is a view of ``raw`` (C order)."""
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
        descr, fortran = header["descr"], bool(header["fortran_order"])
        shape = tuple(header["shape"])
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
    arr = decode_npy(b64(data, what), what)
    if prompt_start is None:
        prompt_start = choice.get("routed_experts_prompt_start", 0)
    return place(arr, num_tokens(tokens), spec, starts_for(prompt_start), what)
