"""Golden engine payloads, generated in each engine's documented format
from a known routed-experts array (no engine, no network).

``truth`` arrays are int32 [rows, N, K] in the full layout, rows = tokens
0 .. n-2 (what engines return: the last sampled token never runs through the
model); dense layers hold junk (engines leave whatever there) and every
(token, MoE layer) holds K distinct ids.
"""

import base64
import io
import json
import types

import numpy as np

from rollpack import ModelSpec

SMALL = ModelSpec("small-moe", num_layers=6, moe_layers=[1, 2, 4, 5], num_experts=16, topk=4)
ALL_MOE = ModelSpec("all-moe", num_layers=4, num_experts=64, topk=2)
WIDE = ModelSpec("wide-moe", num_layers=3, moe_layers=[0, 2], num_experts=300, topk=3)
# Qwen3-30B-A3B: 48 decoder layers, all MoE, 128 experts, top-8.
QWEN3_30B_A3B = ModelSpec("Qwen3-30B-A3B", num_layers=48, num_experts=128, topk=8)


def routed(rows, spec, seed=0, missing=(), dense_junk=7):
    """int32 [rows, N, K]: K distinct ids in [0, E) per (row, layer);
    ``missing`` rows are -1 on every MoE layer; dense layers hold junk."""
    rng = np.random.default_rng(seed)
    e, k, n_layers = spec.num_experts, spec.topk, spec.num_layers
    perm = rng.permutation(e).astype(np.int32)
    base = rng.integers(0, e, size=(rows, n_layers, 1), dtype=np.int32)
    step = np.arange(k, dtype=np.int32) * (e // k)
    arr = perm[(base + step) % e]
    dense = [l for l in range(n_layers) if l not in spec.resolved_moe_layers]
    if dense:
        arr[:, dense, :] = dense_junk
    for r in missing:
        arr[r, list(spec.resolved_moe_layers), :] = -1
    return np.ascontiguousarray(arr)


def tokens(n, seed=1):
    return np.random.default_rng(seed).integers(0, 150000, size=n, dtype=np.int32)


def compact(arr, spec):
    return np.ascontiguousarray(arr[:, list(spec.resolved_moe_layers), :])


def vllm_output(truth):
    """vLLM CompletionOutput stand-in: .routed_experts int32 [n-1, N, K]."""
    return types.SimpleNamespace(index=0, token_ids=[], routed_experts=truth.copy())


def vllm021_response(prompt_rows, choice_rows, spec):
    """vLLM 0.21 /v1/completions response (parsed JSON): nested int16 lists on
    the MoE-layers axis; prompt rows shared by all choices."""
    def nested(a):
        return compact(a, spec).astype(np.int16).tolist()  # the engine's JSON encoding
    body = {
        "id": "cmpl-1", "object": "text_completion", "model": spec.name,
        "prompt_routed_experts": nested(prompt_rows),
        "choices": [{"index": i, "text": "", "finish_reason": "length",
                     "routed_experts": nested(c)} for i, c in enumerate(choice_rows)],
    }
    return json.loads(json.dumps(body))


def npy_b64(a):
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def vllm_choice(rows_from_start, prompt_start=0, echo_start=True, index=0):
    """vLLM >= 0.22 choice: base64 .npy of the rows [prompt_start, n-1)."""
    c = {"index": index, "text": "", "finish_reason": "stop",
         "routed_experts": npy_b64(rows_from_start)}
    if echo_start:
        c["routed_experts_prompt_start"] = prompt_start
    return c


def sglang_meta_info(rows_from_start, start_len=0, dtype=None):
    """SGLang /generate meta_info: base64 raw flat (int32 unless dtype)."""
    a = rows_from_start.astype(dtype or np.int32)
    m = {"id": "x", "finish_reason": {"type": "length"},
         "routed_experts": base64.b64encode(a.tobytes()).decode("ascii"),
         "routed_experts_start_len": start_len}
    if dtype is not None:
        m["routed_experts_dtype"] = np.dtype(dtype).name
    return m


def ndarray_dict(a, dtype_name=None):
    """SkyRL / ms-swift {data, shape, dtype} base64 dict."""
    return {"data": base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii"),
            "shape": list(a.shape), "dtype": dtype_name or a.dtype.name}
