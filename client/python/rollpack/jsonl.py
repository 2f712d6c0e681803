"""Captured engine responses, one JSON object per line -> Samples.

Each line::

    {"engine": "vllm" | "vllm-0.21" | "sglang" | "ndarray",
     "sample_id": "r17",
     "tokens": [...],                 # the whole sequence, prompt + response
     "response": {...},               # the engine's payload, as it returned it
     "choice_index": 0,               # optional: vllm / vllm-0.21 responses with n > 1
     "start": 0,                      # optional: prompt_start / start_len / row offset
     "group_id": "q3", "group_size": 8, "policy_version": 4,   # optional
     "piece": 0, "partial": false,                            # optional (pieces)
     "scalars": {"reward": 1.0},                     # optional
     "token_fields": {"logprobs": {"data": "...", "shape": [n], "dtype": "float32"}}}

``tokens`` may instead be given as ``prompt_token_ids`` + ``output_token_ids``
(lists, or {data, shape, dtype} dicts). ``response`` per engine:

- ``vllm`` (>= 0.22 HTTP): a choice object (``choices[i]``, with its base64
  .npy ``routed_experts``), or the whole response (``choice_index`` picks
  the choice). ``start`` = the request's ``routed_experts_prompt_start``
  when the choice does not echo it.
- ``vllm-0.21``: the whole response (``prompt_routed_experts`` and
  ``choices[choice_index].routed_experts`` nested lists).
- ``sglang``: the ``/generate`` response object (or its ``meta_info``).
  ``start`` = the request's ``routed_experts_start_len`` when meta_info does
  not echo it.
- ``ndarray``: the ``{data, shape, dtype}`` dict (SkyRL, ms-swift);
  ``start`` = its row offset.
"""

import base64
import json

import numpy as np

from rollpack import adapters
from rollpack.errors import PayloadError
from rollpack.sample import Sample

ENGINES = ("vllm", "vllm-0.21", "sglang", "ndarray")


def _array(x, what):
    if isinstance(x, dict) and {"data", "shape", "dtype"} <= set(x):
        dt = np.dtype(str(x["dtype"]).replace("torch.", ""))
        raw = base64.b64decode(x["data"])
        return np.frombuffer(raw, dtype=dt).reshape([int(v) for v in x["shape"]])
    if isinstance(x, list):
        return np.asarray(x)
    raise PayloadError("%s must be a list or a {data, shape, dtype} dict" % what)


def record_to_sample(rec, spec):
    """One parsed JSONL record -> Sample (PayloadError naming the problem)."""
    if not isinstance(rec, dict):
        raise PayloadError("a record must be a JSON object")
    engine = rec.get("engine")
    if engine not in ENGINES:
        raise PayloadError("engine is %r; one of %s" % (engine, ", ".join(ENGINES)))
    sid = rec.get("sample_id")
    if not isinstance(sid, str) or not sid:
        raise PayloadError("sample_id is missing")
    if "tokens" in rec:
        tokens = _array(rec["tokens"], "tokens")
    elif "prompt_token_ids" in rec and "output_token_ids" in rec:
        tokens = np.concatenate([_array(rec["prompt_token_ids"], "prompt_token_ids"),
                                 _array(rec["output_token_ids"], "output_token_ids")])
    else:
        raise PayloadError("tokens (or prompt_token_ids + output_token_ids) is missing")
    tokens = tokens.astype(np.int32, copy=False) if tokens.size else np.zeros(0, np.int32)
    resp = rec.get("response")
    if resp is None:
        raise PayloadError("response (the engine's payload) is missing")
    start = rec.get("start")
    ci = int(rec.get("choice_index", 0))
    if spec.is_dense:
        routed = (None, 0)
    elif engine == "vllm":
        if isinstance(resp, dict) and "choices" in resp:
            ch = resp["choices"]
            if not 0 <= ci < len(ch):
                raise PayloadError("response has %d choices, choice_index is %d" % (len(ch), ci))
            resp = ch[ci]
        routed = adapters.from_vllm_choice(resp, tokens, spec, prompt_start=start)
    elif engine == "vllm-0.21":
        routed = adapters.from_vllm_v021_response(resp, tokens, spec, choice_index=ci)
    elif engine == "sglang":
        routed = adapters.from_sglang_meta_info(resp, tokens, spec, start_len=start)
    else:
        routed = adapters.from_ndarray_dict(resp, tokens, spec, row_offset=start or 0)
    fields = {k: _array(v, "token_fields[%r]" % k) for k, v in (rec.get("token_fields") or {}).items()}
    return Sample(sid, tokens, *routed, token_fields=fields, scalars=rec.get("scalars"),
                  group_id=rec.get("group_id", ""), policy_version=rec.get("policy_version", 0),
                  group_size=rec.get("group_size", 0), piece=rec.get("piece", 0),
                  partial=rec.get("partial", False))


def read_samples(lines, spec, errors=None, name="<jsonl>"):
    """Yields Samples from JSONL lines (blank lines skipped). A bad line
    raises PayloadError("FILE:LINE: ..."), or, when ``errors`` is a list, is
    appended to it and skipped."""
    for no, line in enumerate(lines, 1):
        if isinstance(line, bytes):
            line = line.decode("utf-8")
        if not line.strip():
            continue
        try:
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise PayloadError("not JSON (%s)" % e) from None
            s = record_to_sample(rec, spec)
        except (PayloadError, ValueError, TypeError, KeyError) as e:
            err = PayloadError("%s:%d: %s" % (name, no, e))
            if errors is None:
                raise err from None
            errors.append(str(err))
            continue
        yield s


def make_record(engine, sample_id, tokens, response, **extra):
    """A JSONL record (dict) for a captured response; ``tokens`` may be a
    numpy array (stored as a {data, shape, dtype} dict)."""
    t = np.asarray(tokens)
    rec = {"engine": engine, "sample_id": sample_id,
           "tokens": {"data": base64.b64encode(t.astype("<i4").tobytes()).decode("ascii"),
                      "shape": [int(t.shape[0])], "dtype": "int32"},
           "response": response}
    rec.update(extra)
    return rec
