"""TensorRT-LLM's Router Replay (R3) capture on its LLM API outputs."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
from numpy.typing import ArrayLike

from rollpack.adapters._common import (RoutedExperts, host_array, is_torch_tensor, num_tokens,
                                       place, require_integers, torch_dtype_name)
from rollpack.errors import PayloadError
from rollpack.sample import as_tokens
from rollpack.spec import ModelSpec


def from_trtllm_output(output: Any, tokens: Optional[ArrayLike], spec: ModelSpec, *,
                       index: int = 0) -> RoutedExperts:
    """TensorRT-LLM Router Replay: ``CompletionOutput.routed_experts``.

    Format, from NVIDIA/TensorRT-LLM RFC issue 17778 and the merged PR 18397
    (their text: TensorRT-LLM's code with the field was not among the stored
    sources, whose copies of ``executor/result.py`` predate it): the capture
    returns, per token and per MoE layer, the logical
    top-k expert ids chosen before EPLB replication, on
    ``CompletionOutput.routed_experts`` with the contract
    ``(seq_len - 1, num_moe_layers, top_k)`` (compact layout), over the
    prompt and the completion; the per-request host store keeps int16 rows
    (``tensorrt_llm/_torch/route_capture.py``). The array may be a torch
    tensor (CPU: viewed; on the GPU: copied to the host once) or numpy; any
    integer dtype is taken as is (int16 per the PR), floats are refused. A
    full layer axis (num_layers) is detected too. The RFC names no OpenAI
    server field, so only the LLM API output is read.

    ``output``: a ``RequestOutput``/``GenerationResult`` (completion
    ``index``), a ``CompletionOutput``, or the array. ``tokens``: the
    prompt + completion tokens (or n); None takes ``prompt_token_ids`` +
    the completion's ``token_ids`` from a RequestOutput. Rows start at 0.
    """
    what = "TensorRT-LLM CompletionOutput.routed_experts"
    comp = output
    if hasattr(output, "outputs") and not hasattr(output, "routed_experts"):
        outs = output.outputs
        if not 0 <= index < len(outs):
            raise PayloadError("TensorRT-LLM RequestOutput has %d completions, index is %d"
                               % (len(outs), index))
        comp = outs[index]
        if tokens is None:
            tokens = _tokens(output, comp, what)
    elif tokens is None:
        raise PayloadError("%s: tokens is None and %s carries no prompt_token_ids: pass "
                           "tokens" % (what, type(output).__name__))
    arr = comp.routed_experts if hasattr(comp, "routed_experts") else comp
    if arr is None:
        raise PayloadError("%s is None: enable Router Replay capture in TensorRT-LLM (PR "
                           "18397) for this request" % what)
    if is_torch_tensor(arr):
        name = torch_dtype_name(arr)
        if not name.startswith(("int", "uint")):  # before copying it off the device
            raise PayloadError("%s has dtype %s, expected integers" % (what, name))
    arr = host_array(arr, what)
    require_integers(arr, what)
    return place(arr, num_tokens(tokens), spec, (0,), what)


def _tokens(output: Any, comp: Any, what: str) -> np.ndarray:
    prompt = getattr(output, "prompt_token_ids", None)
    gen = getattr(comp, "token_ids", None)
    if prompt is None or gen is None:
        raise PayloadError("%s: tokens is None and the RequestOutput lacks prompt_token_ids or "
                           "token_ids: pass tokens" % what)
    return np.concatenate([as_tokens(np.asarray(prompt, dtype=np.int64).reshape(-1)
                                     if isinstance(prompt, list) else host_array(prompt, what)),
                           as_tokens(np.asarray(gen, dtype=np.int64).reshape(-1)
                                     if isinstance(gen, list) else host_array(gen, what))])
