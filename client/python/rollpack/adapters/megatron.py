"""Megatron-core's own inference engine (``megatron.core.inference``) with
``moe_enable_routing_replay``: the routing it recorded per request."""

from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np
from numpy.typing import ArrayLike

from rollpack.adapters._common import (RoutedExperts, host_array, is_torch_tensor, mtp_extra,
                                       nested_ints, num_tokens, parse_dtype, place,
                                       require_integers)
from rollpack.errors import PayloadError
from rollpack.sample import as_tokens
from rollpack.spec import ModelSpec

_WHAT = "Megatron-core routing_indices"


def from_megatron_inference(result: Any, tokens: Optional[ArrayLike], spec: ModelSpec, *,
                            choice_index: int = 0) -> RoutedExperts:
    """Routing recorded by Megatron-core's dynamic inference engine.

    Format (NVIDIA/Megatron-LM main, read at d98e8a6): with
    ``moe_enable_routing_replay`` each forward records every
    ``RouterReplay`` instance's top-k ids; ``RoutingMetadata
    .get_routing_indices`` stacks them to [tokens, layers, topk]
    (``inference/contexts/routing_metadata.py``), the controller narrows
    them to int16 (int32 when the model has more than 32768 experts,
    ``text_generation_controller.py``) and, when a request finishes, the
    engine rebuilds ``DynamicInferenceRequest.routing_indices``: a numpy
    array [prompt + generated - 1, layers, topk] ("the last generated token
    does not undergo a forward pass", ``inference_request.py``). Layers are
    the RouterReplay instances in order: the MoE layers (compact layout),
    followed by the MTP routers when the model builds them. Before
    Megatron-LM PR 4301 (April 2026) the field was a torch tensor.

    ``result`` may be:

    * the ``DynamicInferenceRequest`` (or a ``DynamicInferenceRequestRecord``:
      merged first), or the array itself (numpy or torch, CPU or device);
    * its ``serialize()`` dict, as the inference client returns it without
      ``deserialize``: ``routing_indices`` is ``("ndarray", {"data": nested
      lists, "dtype": "int16"})`` (a list after msgpack/JSON), or
      ``("tensor", nested lists)`` before PR 4301;
    * a choice of the text-generation server's ``/v1/completions`` or
      ``/v1/chat/completions`` response, or the response (``choice_index``
      picks the choice): ``moe_topk_indices`` holds the same value.
      ``prompt_moe_topk_indices`` is not read: it is a prefix of the same
      rows, and on builds after PR 4301 a slice of the ("ndarray", ...)
      wrapper rather than of the rows.

    ``tokens``: prompt + generated tokens (or n); None takes them from the
    result (``prompt_tokens`` + ``generated_tokens``, ``prompt_token_ids`` +
    ``generation_token_ids``, or ``prompt_length`` + the generated count).
    When both are there their counts must agree.

    Layer axis: |M| (compact) is required; |M| + D with the spec's D MTP
    layers is accepted too: kept when the spec declares ``mtp_routing``,
    else the trailing MTP entries are dropped (a view). Rows start at token
    0 and end at n - 1.
    """
    if hasattr(result, "merge") and hasattr(result, "requests"):
        result = result.merge()
    derived: Optional[Union[int, np.ndarray]] = None
    what = _WHAT
    if isinstance(result, dict) and "choices" in result and "moe_topk_indices" not in result:
        choices = result.get("choices") or []
        if not 0 <= choice_index < len(choices):
            raise PayloadError("Megatron-core response has %d choices, choice_index is %d"
                               % (len(choices), choice_index))
        result = choices[choice_index]
    if isinstance(result, dict) and "moe_topk_indices" in result:
        what = "Megatron-core choices[%s].moe_topk_indices" % result.get("index", choice_index)
        value = result["moe_topk_indices"]
        derived = _join_tokens(result.get("prompt_token_ids"), result.get("generation_token_ids"))
    elif isinstance(result, dict) and "routing_indices" in result:
        value = result["routing_indices"]
        derived = _join_tokens(result.get("prompt_tokens"), result.get("generated_tokens"))
        if derived is None and result.get("prompt_length") is not None and \
                result.get("generated_tokens") is not None:
            derived = int(result["prompt_length"]) + len(_unwrap_list(result["generated_tokens"]))
    elif isinstance(result, dict):
        raise PayloadError("Megatron-core result dict has neither routing_indices nor "
                           "moe_topk_indices (keys: %s)" % sorted(result)[:12])
    elif hasattr(result, "routing_indices"):
        value = result.routing_indices
        derived = _join_tokens(getattr(result, "prompt_tokens", None),
                               getattr(result, "generated_tokens", None))
    else:
        value = result
    if value is None:
        raise PayloadError("%s is None: build the model with moe_enable_routing_replay=True "
                           "(Megatron records routing only then)" % what)
    arr = _array(value, what, spec)
    n = _count(tokens, derived, what)
    m, d = spec.num_moe_layers, int(getattr(spec, "num_mtp_layers", 0) or 0)
    if spec.is_dense:
        raise PayloadError("%s: model %r is dense (num_experts 0): it has no routed experts"
                           % (what, spec.name))
    if arr.ndim == 3:
        layers = arr.shape[1]
        if layers not in (m, m + d):
            raise PayloadError(
                "%s has %d layers; Megatron records one per RouterReplay instance: the %d MoE "
                "layers of model %r%s" % (what, layers, m, spec.name,
                                          " (+ %d MTP layers)" % d if d else ""))
        if d and layers == m + d and not mtp_extra(spec):
            arr = arr[:, :m, :]  # MTP routers' entries the samples do not carry
    return place(arr, n, spec, (0,), what, allow_n=False)


def _array(value: Any, what: str, spec: ModelSpec) -> np.ndarray:
    """numpy [rows, layers, topk] from each wire form of the field."""
    hint, k = spec.num_moe_layers, spec.topk
    if isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], str):
        tag, body = value
        if tag == "ndarray":
            if not isinstance(body, dict) or "data" not in body or "dtype" not in body:
                raise PayloadError("%s: ('ndarray', ...) must hold {'data', 'dtype'}, got %s"
                                   % (what, type(body).__name__))
            dt = parse_dtype(body["dtype"], what + " dtype")
            return nested_ints(body["data"], what, hint, k, dtype=dt)
        if tag == "tensor":
            return nested_ints(body, what, hint, k)
        raise PayloadError("%s: unknown serialized wrapper %r (expected 'ndarray' or 'tensor')"
                           % (what, tag))
    if isinstance(value, list):
        return nested_ints(value, what, hint, k)
    if isinstance(value, np.ndarray) or is_torch_tensor(value):
        arr = host_array(value, what)
        require_integers(arr, what)
        return arr
    raise PayloadError("%s must be an array, nested lists or a serialized ('ndarray', ...) "
                       "value, got %s" % (what, type(value).__name__))


def _unwrap_list(x: Any) -> Any:
    """The list inside Megatron's ("tensor", list) wrapper, or x."""
    if isinstance(x, (tuple, list)) and len(x) == 2 and x[0] == "tensor":
        return x[1]
    return x


def _join_tokens(prompt: Any, generated: Any) -> Optional[np.ndarray]:
    if prompt is None or generated is None:
        return None
    parts = []
    for name, x in (("prompt tokens", prompt), ("generated tokens", generated)):
        x = _unwrap_list(x)
        arr = host_array(x, name) if not isinstance(x, list) else np.asarray(x, dtype=np.int64)
        if arr.size == 0:
            arr = arr.astype(np.int32)
        parts.append(as_tokens(arr.reshape(-1)))
    return np.concatenate(parts)


def _count(tokens: Optional[ArrayLike], derived: Optional[Union[int, np.ndarray]],
           what: str) -> int:
    if tokens is None and derived is None:
        raise PayloadError("%s: tokens is None and the result carries no prompt and generated "
                           "tokens to count: pass tokens" % what)
    if tokens is None:
        return num_tokens(derived)
    n = num_tokens(tokens)
    if derived is not None and num_tokens(derived) != n:
        raise PayloadError("%s: tokens has %d tokens but the result's prompt + generated tokens "
                           "number %d" % (what, n, num_tokens(derived)))
    return n
