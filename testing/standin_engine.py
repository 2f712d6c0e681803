#!/usr/bin/python3
"""A stand-in vLLM / SGLang inference server for the capture port's end-to-end tests
(shared/spec/capture.md, section 3): a real HTTP process speaking the engines' request and
response formats over a fake MoE model whose outputs are pure functions tests can recompute.
Debian's /usr/bin/python3, stdlib + numpy only.

    /usr/bin/python3 testing/standin_engine.py --engine vllm|sglang --port 0 \
        --num-layers L --topk K --num-experts E [--dense-layers 0,1] [--routing-dtype D] \
        [--no-routing] [--ignore-start] [--api-key KEY] [--delay-ms N] [--max-tokens-default N]
        [--return-sampling-mask]

The first stdout line is `PORT <n>` (the bound port; --port 0 picks one), flushed.

Endpoints. vLLM: POST /v1/completions, /v1/chat/completions, /inference/v1/generate (all three
may stream); SGLang: POST /generate, /v1/chat/completions, /v1/completions (all may stream).
Both: GET /v1/models, /health, /metrics. Unknown paths: 404 {"detail": "Not Found"}.

The model and its outputs (V = --vocab-size, E, L, K as given; all integers):
  tokenize(text)     = the UTF-8 bytes of the text, one token id each (so V >= 256).
  chat prompt        = tokenize(concat over messages of ("<|ROLE|>" + TEXT + "\\n"), then
                       "<|assistant|>"), TEXT = content if a string, else the concatenated
                       "text" of its parts.
                       (SGLang chat with `input_ids` uses those ids as the prompt.)
  seed(prompt)       = sum_k (k + 1) * prompt[k]  mod 1000003          (k from 0)
  generated token j of choice i (j, i from 0; i is the sample index within its prompt):
                       g(i, j) = (seed + 7919 * j + 104729 * i) mod V
  G (tokens generated) = max_tokens / max_completion_tokens / max_new_tokens, else
                       --max-tokens-default; finish reason is always "length".
  logprob of that token:  lp(i, j) = -(((g + 3 * j + 5 * i) mod 64) + 1) / 64   (exact in float32)
  top-logprob alternates (rank r >= 1, only where more than the sampled token is asked):
                       token (g + r) mod V, logprob lp - r
  SGLang input-token logprob at prompt position p >= 1: -(((prompt[p] + p) mod 64) + 1) / 64;
                       position 0: null.
  token text         = "<" + id + ">" (generated text is the concatenation).
  sampling mask of generated token j of choice i (the ids the sampler kept), m = 1 + ((g + j)
                       mod 4) ids: sorted({(g + 61 * r) mod V for r in 0..m-1}) (g is in it);
                       its sampling logprob -(m - 1) / 8. vLLM: choices[i].sampling_mask (one
                       list per generated token; a stream's event: its token's list) on every
                       choice of a server started with --return-sampling-mask (null when the
                       routing is dropped). SGLang: with the request's return_sampling_mask
                       (400 with stream, or without top_k > 0, top_p < 1 or min_p > 0),
                       meta_info.output_token_sampling_mask, output_token_sampling_logprobs
                       and output_token_sampling_mask_length on /generate and chat.
  routing of absolute token position p (tokens = prompt + generated), layer l, slot k:
                       MoE layer:   (7 * p + 3 * l + 11 * tokens[p] + k) mod E
                                    (K distinct values since K <= E)
                       dense layer (--dense-layers): 0
  rows of a choice asked from start s (vLLM routed_experts_prompt_start, SGLang
                       routed_experts_start_len; 0 <= s <= P, else 400): positions [s, P + G - 1)
                       ([0, P + G - 1) with --ignore-start), all L layers, K slots.
  vLLM payload       = base64 of np.save of that [rows, L, K] array, dtype uint8 when E <= 256 else
                       int16 (--routing-dtype overrides); SGLang payload = base64 of the raw
                       little-endian values, int32 unless --routing-dtype, which also adds
                       meta_info.routed_experts_dtype (its numpy name).
  ids                = prefix + sha256(path + "\\n" + canonical JSON of the body without the fields
                       a capture proxy adds or standin_* fields)[:32]: re-sending a request, or
                       sending it through the proxy, gives the same id. Prefixes: vLLM "cmpl-",
                       "chatcmpl-", "generate-tokens-" (or the X-Request-Id header / body
                       request_id instead of the hash); SGLang "cmpl-", "chatcmpl-", none for
                       /generate (or the body's rid); with several items item i gets "_i".
                       `created` is always 1700000000.

Which fields appear follows the engines (vllm-project/vllm, sgl-project/sglang, read 2026):
vLLM serializes every response field, null when not asked (token_ids, prompt_token_ids,
logprobs, routed_experts ...) and returns routed_experts on every choice when the server has
routing capture on (server-wide, no request field; null with --no-routing). SGLang drops
token_ids / prompt_token_ids / meta_info / sglext unless asked (return_token_ids,
return_meta_info, return_routed_experts) and leaves routed_experts out of meta_info unless
return_routed_experts (and out entirely with --no-routing).

Error injection (request JSON fields, never part of normal behaviour):
  "standin_error": STATUS     answer STATUS with the endpoint's error JSON
  "standin_close": true       close the connection without answering
  "standin_sleep_ms": N       sleep N ms first (after --delay-ms)
  "standin_drop_routing": true  answer as an engine without routing (an aborted request)
  "standin_corrupt_routing": K  (vLLM) a broken payload: "base64" (not base64), "dtype" (a
                                float32 .npy), "shape" (one row short)
  "standin_close_after_events": N   (streams) close the connection after N events
  "standin_chunked": N        answer with Transfer-Encoding: chunked, N bytes a chunk (no
                              Content-Length)
"""

import argparse
import base64
import hashlib
import http
import http.server
import io
import json
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

CREATED = 1700000000
SEED_MOD = 1000003

# Request fields a capture proxy adds (capture.md section 3.1 and start offsets) and that
# therefore do not enter the id hash, plus the injection fields.
ID_IGNORED = {
    "return_token_ids", "logprobs", "top_logprobs", "return_routed_experts", "return_meta_info",
    "return_logprob", "return_prompt_token_ids", "routed_experts_prompt_start",
    "routed_experts_start_len", "logprob_start_len", "top_logprobs_num",
    "return_text_in_logprobs",
}
ID_IGNORED_SAMPLING = {"logprobs", "routed_experts_prompt_start"}


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, param: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.param = param


# -- the model ------------------------------------------------------------------------------


class Model:
    def __init__(self, args: argparse.Namespace):
        self.engine = args.engine
        self.name = args.model_name
        self.num_layers = args.num_layers
        self.topk = args.topk
        self.num_experts = args.num_experts
        self.vocab = args.vocab_size
        self.dense = sorted(set(args.dense_layers))
        self.routing = not args.no_routing
        self.ignore_start = args.ignore_start
        self.sampling_mask = args.return_sampling_mask
        self.max_tokens_default = args.max_tokens_default
        self.max_model_len = args.max_model_len
        self.explicit_dtype = args.routing_dtype is not None
        if args.routing_dtype is not None:
            self.dtype = np.dtype(args.routing_dtype)
        elif self.engine == "vllm":
            self.dtype = np.dtype(np.uint8 if self.num_experts <= 256 else np.int16)
        else:
            self.dtype = np.dtype(np.int32)
        self.dtype = self.dtype.newbyteorder("<") if self.dtype.itemsize > 1 else self.dtype
        moe = np.ones(self.num_layers, dtype=bool)
        moe[self.dense] = False
        self.moe_mask = moe


def tokenize(text: str) -> List[int]:
    return list(text.encode("utf-8"))


def content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    raise BadRequest("message content must be a string or a list of parts")


def chat_prompt(messages: Any) -> List[int]:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    text = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("each message needs a role", param="messages")
        text.append("<|%s|>%s\n" % (m["role"], content_text(m.get("content"))))
    text.append("<|assistant|>")
    return tokenize("".join(text))


def seed(prompt: List[int]) -> int:
    a = np.asarray(prompt, dtype=np.int64) % SEED_MOD
    w = np.arange(1, len(prompt) + 1, dtype=np.int64) % SEED_MOD
    return int(np.sum((a * w) % SEED_MOD) % SEED_MOD)


def generated(prompt: List[int], i: int, count: int, vocab: int) -> List[int]:
    s = seed(prompt)
    return [(s + 7919 * j + 104729 * i) % vocab for j in range(count)]


def logprob(g: int, i: int, j: int) -> float:
    return -(((g + 3 * j + 5 * i) % 64) + 1) / 64.0


def input_logprob(t: int, p: int) -> Optional[float]:
    return None if p == 0 else -(((t + p) % 64) + 1) / 64.0


def token_text(t: int) -> str:
    return "<%d>" % t


def routing_rows(model: Model, tokens: List[int], start: int) -> np.ndarray:
    """[rows, L, K] for positions [start, len(tokens) - 1) (start 0 with --ignore-start)."""
    if model.ignore_start:
        start = 0
    end = max(len(tokens) - 1, start)
    p = np.arange(start, end, dtype=np.int64)[:, None, None]
    tok = np.asarray(tokens[start:end], dtype=np.int64)[:, None, None]
    layer = np.arange(model.num_layers, dtype=np.int64)[None, :, None]
    slot = np.arange(model.topk, dtype=np.int64)[None, None, :]
    vals = (7 * p + 3 * layer + 11 * tok + slot) % model.num_experts
    vals = vals * model.moe_mask[None, :, None]
    return np.ascontiguousarray(vals.astype(model.dtype))


def npy_base64(a: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def raw_base64(a: np.ndarray) -> str:
    return base64.b64encode(a.tobytes()).decode("ascii")


class Choice:
    """One generated sequence: prompt, generated ids, their logprobs, the routing start."""

    def __init__(self, model: Model, prompt: List[int], i: int, count: int, start: int):
        self.prompt = prompt
        self.index_in_prompt = i
        self.gen = generated(prompt, i, count, model.vocab)
        self.lps = [logprob(g, i, j) for j, g in enumerate(self.gen)]
        self.start = start
        self.model = model

    def rows(self) -> np.ndarray:
        return routing_rows(self.model, self.prompt + self.gen, self.start)

    def alternates(self, j: int, count: int) -> List[Tuple[int, float]]:
        """The sampled token then count - 1 alternates."""
        g, lp = self.gen[j], self.lps[j]
        return [((g + r) % self.model.vocab, max(lp - r, -9999.0)) for r in range(count)]

    def text(self, upto: Optional[int] = None) -> str:
        return "".join(token_text(t) for t in self.gen[:upto])

    def kept(self, j: int) -> List[int]:
        """The sampling mask of generated token j: the ids the sampler kept."""
        g, v = self.gen[j], self.model.vocab
        return sorted({(g + 61 * r) % v for r in range(1 + (g + j) % 4)})

    def kept_lists(self, lo: int = 0, hi: Optional[int] = None) -> List[List[int]]:
        return [self.kept(j) for j in range(lo, len(self.gen) if hi is None else hi)]


# -- request parsing helpers ----------------------------------------------------------------


def as_int(value: Any, name: str, default: int, minimum: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest("%s must be an integer" % name, param=name)
    if value < minimum:
        raise BadRequest("%s must be >= %d, got %d" % (name, minimum, value), param=name)
    return value


def token_list(value: Any, name: str) -> List[int]:
    if (not isinstance(value, list) or not value
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)):
        raise BadRequest("%s must be a non-empty list of non-negative token ids" % name,
                         param=name)
    return value


def completion_prompts(prompt: Any) -> List[List[int]]:
    """OpenAI `prompt`: str, [str], [int], [[int]]."""
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("prompt must not be empty", param="prompt")
        return [tokenize(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [tokenize(p) for p in prompt]
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return [token_list(prompt, "prompt")]
        if all(isinstance(p, list) for p in prompt):
            return [token_list(p, "prompt") for p in prompt]
    raise BadRequest("prompt must be a string, a list of strings, a list of token ids or a "
                     "list of lists of token ids", param="prompt")


def check_start(start: int, prompts: List[List[int]], name: str) -> None:
    for p in prompts:
        if start > len(p):
            raise BadRequest("%s (%d) must be at most the prompt length (%d)"
                             % (name, start, len(p)), param=name)


def completion_args(req: Dict[str, Any],
                    max_tokens_default: int) -> Tuple[int, int, Optional[int]]:
    """A /v1/completions request's n, max_tokens and logprobs (None: not asked), both engines'."""
    n = as_int(req.get("n"), "n", 1, 1)
    count = as_int(req.get("max_tokens"), "max_tokens", max_tokens_default, 1)
    top = req.get("logprobs")
    if top is not None:
        top = as_int(top, "logprobs", 0)
    return n, count, top


def chat_args(req: Dict[str, Any], max_tokens_default: int) -> Tuple[int, int, bool, int]:
    """A /v1/chat/completions request's n, max_completion_tokens (or max_tokens), logprobs and
    top_logprobs, both engines'."""
    n = as_int(req.get("n"), "n", 1, 1)
    count = req.get("max_completion_tokens")
    if count is None:
        count = req.get("max_tokens")
    count = as_int(count, "max_completion_tokens", max_tokens_default, 1)
    want_lp = bool(req.get("logprobs"))
    top = as_int(req.get("top_logprobs"), "top_logprobs", 0)
    return n, count, want_lp, top


def include_usage(req: Dict[str, Any]) -> bool:
    """Whether a streaming request asks for a last chunk with the usage."""
    return bool((req.get("stream_options") or {}).get("include_usage"))


def without_nulls(d: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def token_steps(choices: List[Choice]):
    """(j, k, c) for generated token j of choice k, token by token across the choices: the
    order of a stream's chunks."""
    for j in range(max(len(c.gen) for c in choices)):
        for k, c in enumerate(choices):
            if j < len(c.gen):
                yield j, k, c


def id_hash(path: str, body: Any) -> str:
    def strip(obj: Any) -> Any:
        if not isinstance(obj, dict):
            return obj
        out = {}
        for k, v in obj.items():
            if k in ID_IGNORED or k.startswith("standin_"):
                continue
            if k == "sampling_params" and isinstance(v, dict):
                v = {a: b for a, b in v.items() if a not in ID_IGNORED_SAMPLING}
            out[k] = v
        return out
    canon = json.dumps(strip(body), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256((path + "\n" + canon).encode("utf-8")).hexdigest()[:32]


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def error_type(status: int) -> str:
    """"BadRequestError", "InternalServerError", "ServiceUnavailableError" (the engines'
    names: the HTTP phrase without spaces, ending in Error)."""
    try:
        name = http.HTTPStatus(status).phrase.replace(" ", "").replace("-", "")
    except ValueError:
        return "Error"
    return name if name.endswith("Error") else name + "Error"


# -- vLLM -----------------------------------------------------------------------------------


class Vllm:
    """vLLM's OpenAI server (vllm/entrypoints/openai/{completion,chat_completion}/) and its
    tokens-in/tokens-out endpoint (vllm/entrypoints/serve/disagg/)."""

    def __init__(self, model: Model):
        self.m = model

    def error_body(self, path: str, status: int, message: str, param: Optional[str] = None):
        return {"error": {"message": message, "type": error_type(status), "param": param,
                          "code": status}}

    def routed(self, c: Choice, ctx: "Ctx") -> Optional[str]:
        if not self.m.routing or ctx.drop_routing:
            return None
        rows = c.rows()
        if ctx.corrupt_routing == "dtype":
            return npy_base64(rows.astype(np.float32))
        if ctx.corrupt_routing == "shape":
            return npy_base64(rows[:-1])
        payload = npy_base64(rows)
        if ctx.corrupt_routing == "base64":
            return payload[:8] + "*" + payload[9:]
        return payload

    def with_mask(self, choice: Dict[str, Any], c: Choice, ctx: "Ctx", lo: int = 0,
                  hi: Optional[int] = None) -> Dict[str, Any]:
        """`choice` with its sampling_mask, written by a --return-sampling-mask server only."""
        if self.m.sampling_mask:
            choice["sampling_mask"] = None if ctx.drop_routing else c.kept_lists(lo, hi)
        return choice

    def check_model(self, req: Dict[str, Any]) -> None:
        name = req.get("model")
        if name is not None and name != self.m.name:
            raise BadRequest("The model `%s` does not exist." % name, status=404, param="model")

    def base_id(self, ctx: "Ctx", req: Dict[str, Any]) -> str:
        rid = ctx.header("X-Request-Id") or req.get("request_id")
        return str(rid) if rid else ctx.hash

    # /v1/completions
    def completion_logprobs(self, c: Choice, top: int, lo: int = 0, hi: Optional[int] = None):
        hi = len(c.gen) if hi is None else hi
        offsets, texts, lps, tops = [], [], [], []
        off = sum(len(token_text(t)) for t in c.gen[:lo])
        for j in range(lo, hi):
            text = token_text(c.gen[j])
            offsets.append(off)
            off += len(text)
            texts.append(text)
            lps.append(c.lps[j])
            tops.append({token_text(t): lp for t, lp in c.alternates(j, top + 1)})
        return {"text_offset": offsets, "token_logprobs": lps, "tokens": texts,
                "top_logprobs": tops}

    def completions(self, ctx: "Ctx", req: Dict[str, Any]):
        self.check_model(req)
        prompts = completion_prompts(req.get("prompt"))
        n, count, top = completion_args(req, self.m.max_tokens_default)
        want_ids = bool(req.get("return_token_ids"))
        start = as_int(req.get("routed_experts_prompt_start"), "routed_experts_prompt_start", 0)
        check_start(start, prompts, "routed_experts_prompt_start")
        rid = "cmpl-" + self.base_id(ctx, req)
        choices = [Choice(self.m, p, i, count, start) for p in prompts for i in range(n)]
        usage = self.usage(prompts, choices)
        if req.get("stream"):
            return self.completion_stream(req, rid, choices, top, want_ids, usage)
        out = []
        for k, c in enumerate(choices):
            out.append(self.with_mask({
                "index": k,
                "text": c.text(),
                "logprobs": None if top is None else self.completion_logprobs(c, top),
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": list(c.gen) if want_ids else None,
                "prompt_logprobs": None,
                "prompt_token_ids": list(c.prompt) if want_ids else None,
                "routed_experts": self.routed(c, ctx),
            }, c, ctx))
        return {"id": rid, "object": "text_completion", "created": CREATED, "model": self.m.name,
                "choices": out, "service_tier": None, "system_fingerprint": None, "usage": usage,
                "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}

    def usage(self, prompts: List[List[int]], choices: List[Choice]) -> Dict[str, Any]:
        p = sum(len(x) for x in prompts)
        g = sum(len(c.gen) for c in choices)
        return {"prompt_tokens": p, "total_tokens": p + g, "completion_tokens": g,
                "prompt_tokens_details": None}

    def completion_stream(self, req, rid, choices, top, want_ids, usage):
        events = []
        for j, k, c in token_steps(choices):
            ch = {"index": k, "text": token_text(c.gen[j]),
                  "logprobs": (None if top is None
                               else self.completion_logprobs(c, top, j, j + 1)),
                  "finish_reason": "length" if j == len(c.gen) - 1 else None,
                  "stop_reason": None}
            if want_ids:
                if j == 0:
                    ch["prompt_token_ids"] = list(c.prompt)
                ch["token_ids"] = [c.gen[j]]
            events.append({"id": rid, "object": "text_completion", "created": CREATED,
                           "model": self.m.name, "choices": [ch]})
        if include_usage(req):
            events.append({"id": rid, "object": "text_completion", "created": CREATED,
                           "model": self.m.name, "choices": [], "usage": without_nulls(usage)})
        return Stream(events, done=True)

    # /v1/chat/completions
    def chat_logprobs(self, c: Choice, top: int, lo: int = 0, hi: Optional[int] = None):
        hi = len(c.gen) if hi is None else hi
        content = []
        for j in range(lo, hi):
            text = token_text(c.gen[j])
            alts = c.alternates(j, max(top, 1))[:top]
            content.append({
                "token": text, "logprob": c.lps[j], "bytes": list(text.encode("utf-8")),
                "top_logprobs": [{"token": token_text(t), "logprob": lp,
                                  "bytes": list(token_text(t).encode("utf-8"))}
                                 for t, lp in alts]})
        return {"content": content}

    def chat(self, ctx: "Ctx", req: Dict[str, Any]):
        self.check_model(req)
        prompt = chat_prompt(req.get("messages"))
        n, count, want_lp, top = chat_args(req, self.m.max_tokens_default)
        if top and not want_lp:
            raise BadRequest("when using `top_logprobs`, `logprobs` must be set to true.",
                             param="top_logprobs")
        want_ids = bool(req.get("return_token_ids"))
        start = as_int(req.get("routed_experts_prompt_start"), "routed_experts_prompt_start", 0)
        check_start(start, [prompt], "routed_experts_prompt_start")
        rid = "chatcmpl-" + self.base_id(ctx, req)
        choices = [Choice(self.m, prompt, i, count, start) for i in range(n)]
        usage = self.usage([prompt], choices)
        if req.get("stream"):
            return self.chat_stream(req, rid, prompt, choices, want_lp, top, want_ids, usage)
        out = []
        for k, c in enumerate(choices):
            out.append(self.with_mask({
                "index": k,
                "message": {"role": "assistant", "content": c.text(), "refusal": None,
                            "annotations": None, "audio": None, "function_call": None,
                            "reasoning": None},
                "logprobs": self.chat_logprobs(c, top) if want_lp else None,
                "finish_reason": "length",
                "stop_reason": None,
                "token_ids": list(c.gen) if want_ids else None,
                "routed_experts": self.routed(c, ctx),
            }, c, ctx))
        return {"id": rid, "object": "chat.completion", "created": CREATED, "model": self.m.name,
                "choices": out, "service_tier": None, "system_fingerprint": None, "usage": usage,
                "prompt_logprobs": None, "prompt_token_ids": list(prompt) if want_ids else None,
                "prompt_text": None, "kv_transfer_params": None, "ec_transfer_params": None,
                "metrics": None}

    def chat_stream(self, req, rid, prompt, choices, want_lp, top, want_ids, usage):
        def chunk(chs, **extra):
            e = {"id": rid, "object": "chat.completion.chunk", "created": CREATED,
                 "model": self.m.name, "choices": chs}
            e.update(extra)
            return e
        events = []
        for k in range(len(choices)):
            first = {"index": k, "delta": {"role": "assistant", "content": ""},
                     "logprobs": None, "finish_reason": None}
            events.append(chunk([first], **({"prompt_token_ids": list(prompt)}
                                            if want_ids and k == 0 else {})))
        for j, k, c in token_steps(choices):
            ch = {"index": k, "delta": {"content": token_text(c.gen[j])},
                  "logprobs": self.chat_logprobs(c, top, j, j + 1) if want_lp else None,
                  "finish_reason": "length" if j == len(c.gen) - 1 else None}
            if want_ids:
                ch["token_ids"] = [c.gen[j]]
            events.append(chunk([ch]))
        if include_usage(req):
            events.append(chunk([], usage=without_nulls(usage)))
        return Stream(events, done=True)

    # /inference/v1/generate
    def tokens_logprobs(self, c: Choice, top: int, lo: int = 0, hi: Optional[int] = None):
        hi = len(c.gen) if hi is None else hi
        content = []
        for j in range(lo, hi):
            alts = c.alternates(j, max(top, 1))
            content.append({
                "token": "token_id:%d" % c.gen[j], "logprob": c.lps[j], "bytes": None,
                "top_logprobs": [{"token": "token_id:%d" % t, "logprob": lp, "bytes": None}
                                 for t, lp in alts]})
        return {"content": content}

    def generate(self, ctx: "Ctx", req: Dict[str, Any]):
        self.check_model(req)
        prompt = token_list(req.get("token_ids"), "token_ids")
        sp = req.get("sampling_params")
        if not isinstance(sp, dict):
            raise BadRequest("sampling_params: Field required", param="sampling_params")
        n = as_int(sp.get("n"), "sampling_params.n", 1, 1)
        count = as_int(sp.get("max_tokens"), "sampling_params.max_tokens",
                       self.m.max_tokens_default, 1)
        top = sp.get("logprobs")
        if top is not None:
            top = as_int(top, "sampling_params.logprobs", 0)
        start = as_int(sp.get("routed_experts_prompt_start"),
                       "sampling_params.routed_experts_prompt_start", 0)
        check_start(start, [prompt], "sampling_params.routed_experts_prompt_start")
        rid = "generate-tokens-" + self.base_id(ctx, req)
        choices = [Choice(self.m, prompt, i, count, start) for i in range(n)]
        usage = self.usage([prompt], choices)
        if req.get("stream"):
            events = []
            for j in range(count):
                for k, c in enumerate(choices):
                    last = j == count - 1
                    events.append({"request_id": rid, "choices": [self.with_mask({
                        "index": k,
                        "logprobs": (None if top is None
                                     else self.tokens_logprobs(c, top, j, j + 1)),
                        "finish_reason": "length" if last else None,
                        "token_ids": [c.gen[j]],
                        "routed_experts": self.routed(c, ctx) if last else None,
                    }, c, ctx, j, j + 1)], "usage": None})
            if include_usage(req):
                events.append({"request_id": rid, "choices": [], "usage": without_nulls(usage)})
            return Stream(events, done=True)
        out = [self.with_mask({"index": k,
                               "logprobs": None if top is None else self.tokens_logprobs(c, top),
                               "finish_reason": "length",
                               "token_ids": list(c.gen),
                               "routed_experts": self.routed(c, ctx)}, c, ctx)
               for k, c in enumerate(choices)]
        return {"request_id": rid, "model": self.m.name, "created": CREATED, "choices": out,
                "usage": usage, "prompt_logprobs": None, "kv_transfer_params": None,
                "ec_transfer_params": None}

    def models(self):
        return {"object": "list", "data": [{
            "id": self.m.name, "object": "model", "created": CREATED, "owned_by": "vllm",
            "root": self.m.name, "parent": None, "max_model_len": self.m.max_model_len,
            "permission": [{
                "id": "modelperm-standin", "object": "model_permission", "created": CREATED,
                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                "organization": "*", "group": None, "is_blocking": False}]}]}

    routes = {
        "/v1/completions": "completions",
        "/v1/chat/completions": "chat",
        "/inference/v1/generate": "generate",
    }
    public = ("/health", "/ping", "/load", "/version", "/metrics")


# -- SGLang ---------------------------------------------------------------------------------


class Sglang:
    """SGLang's native /generate (python/sglang/srt/entrypoints/http_server.py and
    managers/tokenizer_manager.py) and its OpenAI server (entrypoints/openai/)."""

    def __init__(self, model: Model):
        self.m = model

    def error_body(self, path: str, status: int, message: str, param: Optional[str] = None):
        if path == "/generate":
            return {"error": {"message": message}}
        return {"object": "error", "message": message, "type": error_type(status),
                "param": param, "code": status}

    def item_ids(self, base: str, rid: Any, count: int) -> List[str]:
        if isinstance(rid, list):
            if len(rid) != count:
                raise BadRequest("The rid list has %d entries for %d items" % (len(rid), count))
            return [str(r) for r in rid]
        if rid is not None:
            base = str(rid)
        return [base] if count == 1 else ["%s_%d" % (base, k) for k in range(count)]

    def meta_info(self, c: Choice, item_id: str, *, upto: Optional[int] = None,
                  logprob: bool = False, logprob_start: int = -1, top: int = 0,
                  text_in_logprobs: bool = False, routed: bool = False,
                  drop_routing: bool = False, sampling_mask: bool = False) -> Dict[str, Any]:
        """One item's meta_info, in the key order of TokenizerManager; `upto` (streaming) cuts
        the generated tokens, routing and e2e_latency only on the finished item."""
        g = len(c.gen) if upto is None else upto
        finished = g == len(c.gen)
        meta: Dict[str, Any] = {
            "id": item_id,
            "finish_reason": {"type": "length", "length": len(c.gen)} if finished else None,
            "prompt_tokens": len(c.prompt),
            "weight_version": "default",
            "num_retractions": 0,
        }
        if logprob:
            def text(t):
                return token_text(t) if text_in_logprobs else None
            start = len(c.prompt) if logprob_start < 0 else min(logprob_start, len(c.prompt))
            meta["input_token_logprobs"] = [
                [input_logprob(c.prompt[p], p), c.prompt[p], None] for p in range(start,
                                                                               len(c.prompt))]
            meta["output_token_logprobs"] = [[c.lps[j], c.gen[j], text(c.gen[j])]
                                             for j in range(g)]
            if top > 0:
                meta["input_top_logprobs"] = [None for _ in range(start, len(c.prompt))]
                meta["output_top_logprobs"] = [[[lp, t, text(t)] for t, lp in c.alternates(j, top)]
                                               for j in range(g)]
        if sampling_mask:
            kept = c.kept_lists(0, g)
            meta["output_token_sampling_mask"] = kept
            meta["output_token_sampling_logprobs"] = [-(len(k) - 1) / 8 for k in kept]
            meta["output_token_sampling_mask_length"] = g
        meta["reasoning_tokens"] = 0
        meta["completion_tokens"] = g
        meta["cached_tokens"] = 0
        if finished and routed and self.m.routing and not drop_routing:
            meta["routed_experts"] = raw_base64(c.rows())
            if self.m.explicit_dtype:
                meta["routed_experts_dtype"] = self.m.dtype.name
        if finished:
            meta["e2e_latency"] = 0.0
        return meta

    @staticmethod
    def usage(choices: List[Choice], n: int) -> Dict[str, Any]:
        p = sum(len(c.prompt) for k, c in enumerate(choices) if k % n == 0)
        g = sum(len(c.gen) for c in choices)
        return {"prompt_tokens": p, "total_tokens": p + g, "completion_tokens": g,
                "prompt_tokens_details": None, "reasoning_tokens": 0}

    @staticmethod
    def wants_mask(req: Dict[str, Any], params: List[Dict[str, Any]]) -> bool:
        """The request's return_sampling_mask, refused as SGLang refuses it."""
        if not req.get("return_sampling_mask"):
            return False
        if req.get("stream"):
            raise BadRequest("return_sampling_mask is not supported with streaming.")
        for p in params:
            top_k, top_p = p.get("top_k"), p.get("top_p")
            if not ((top_k is not None and top_k > 0) or (top_p is not None and top_p < 1)
                    or (p.get("min_p") or 0) > 0):
                raise BadRequest("return_sampling_mask needs top_k > 0, top_p < 1 or min_p > 0: "
                                 "top_p-only sampling is valid but can return huge masks in the "
                                 "tail")
        return True

    def start_len(self, req: Dict[str, Any], prompts: List[List[int]]) -> int:
        s = as_int(req.get("routed_experts_start_len"), "routed_experts_start_len", 0)
        check_start(s, prompts, "routed_experts_start_len")
        return s

    @staticmethod
    def openai_response(obj: str, rid: str, model_name: str, choices: List[Dict[str, Any]],
                        usage: Dict[str, Any], routed_ext: Optional[str]) -> Dict[str, Any]:
        """An OpenAI endpoint's answer; `routed_ext`, choice 0's routing where SGLang puts it
        at the response level, in its sglext."""
        resp = {"id": rid, "object": obj, "created": CREATED, "model": model_name,
                "choices": choices, "usage": usage, "metadata": {"weight_version": "default"}}
        if routed_ext is not None:
            resp["sglext"] = {"routed_experts": routed_ext}
        return resp

    # /generate
    def generate(self, ctx: "Ctx", req: Dict[str, Any]):
        text, ids = req.get("text"), req.get("input_ids")
        if (text is None) == (ids is None):
            raise BadRequest("Either text or input_ids should be provided.")
        if text is not None:
            if isinstance(text, str):
                prompts, single = [tokenize(text)], True
            elif isinstance(text, list) and text and all(isinstance(t, str) for t in text):
                prompts, single = [tokenize(t) for t in text], False
            else:
                raise BadRequest("text must be a string or a list of strings")
        elif isinstance(ids, list) and ids and all(isinstance(x, list) for x in ids):
            prompts, single = [token_list(x, "input_ids") for x in ids], False
        else:
            prompts, single = [token_list(ids, "input_ids")], True
        sp = req.get("sampling_params") or {}
        if isinstance(sp, list):
            if len(sp) != len(prompts) or not all(isinstance(x, dict) for x in sp):
                raise BadRequest("sampling_params must hold one object per prompt (%d)"
                                 % len(prompts))
            sps = sp
        elif isinstance(sp, dict):
            sps = [sp] * len(prompts)
        else:
            raise BadRequest("sampling_params must be an object or a list")
        n = as_int(sps[0].get("n"), "sampling_params.n", 1, 1)
        start = self.start_len(req, prompts)
        choices = []
        for p, s in zip(prompts, sps):
            count = as_int(s.get("max_new_tokens"), "sampling_params.max_new_tokens",
                           self.m.max_tokens_default, 1)
            choices += [Choice(self.m, p, i, count, start) for i in range(n)]
        ids_out = self.item_ids(ctx.hash, req.get("rid"), len(choices))
        opts = dict(logprob=bool(req.get("return_logprob")),
                    logprob_start=as_int(req.get("logprob_start_len"), "logprob_start_len", -1,
                                         -1),
                    top=as_int(req.get("top_logprobs_num"), "top_logprobs_num", 0),
                    text_in_logprobs=bool(req.get("return_text_in_logprobs")),
                    routed=bool(req.get("return_routed_experts")),
                    drop_routing=ctx.drop_routing, sampling_mask=self.wants_mask(req, sps))
        many = not single or n > 1
        if req.get("stream"):
            events = []
            for j in range(1, max(len(c.gen) for c in choices) + 1):
                for k, c in enumerate(choices):
                    if j > len(c.gen):
                        continue
                    e = {"text": c.text(j), "output_ids": c.gen[:j],
                         "meta_info": self.meta_info(c, ids_out[k], upto=j, **opts)}
                    if many:
                        e["index"] = k
                    events.append(e)
            return Stream(events, done=True)
        items = [{"text": c.text(), "output_ids": list(c.gen),
                  "meta_info": self.meta_info(c, ids_out[k], **opts)}
                 for k, c in enumerate(choices)]
        return items if many else items[0]

    # /v1/chat/completions
    def chat(self, ctx: "Ctx", req: Dict[str, Any]):
        if req.get("input_ids") is not None:
            prompt = token_list(req.get("input_ids"), "input_ids")
        else:
            prompt = chat_prompt(req.get("messages"))
        stream = bool(req.get("stream"))
        if stream:
            for f in ("return_prompt_token_ids", "return_token_ids", "return_meta_info"):
                if req.get(f):
                    raise BadRequest("%s is not supported with streaming. Please set "
                                     "stream=false when using %s=true." % (f, f))
        n, count, want_lp, top = chat_args(req, self.m.max_tokens_default)
        start = self.start_len(req, [prompt])
        want_routed = bool(req.get("return_routed_experts"))
        want_meta = bool(req.get("return_meta_info"))
        choices = [Choice(self.m, prompt, i, count, start) for i in range(n)]
        ids_out = self.item_ids("chatcmpl-" + ctx.hash, req.get("rid"), n)
        opts = dict(logprob=want_lp, top=top, text_in_logprobs=True, routed=want_routed,
                    drop_routing=ctx.drop_routing,
                    sampling_mask=want_meta and self.wants_mask(req, [req]))
        metas = [self.meta_info(c, ids_out[k], **opts) for k, c in enumerate(choices)]
        model_name = req.get("model") or "default"
        usage = self.usage(choices, n)
        # Without return_meta_info the routing of the first item goes to the response-level
        # sglext (serving_chat.py _build_chat_response); with it, it stays in meta_info.
        routed_ext = None if want_meta else metas[0].get("routed_experts")
        if stream:
            return self.chat_stream(req, ids_out[0], model_name, choices, want_lp, top,
                                    routed_ext, usage)
        out = []
        for k, c in enumerate(choices):
            ch: Dict[str, Any] = {
                "index": k,
                "message": {"role": "assistant", "content": c.text(), "reasoning_content": None,
                            "tool_calls": None},
                "logprobs": self.chat_logprobs(c, top) if want_lp else None,
                "finish_reason": "length",
                "matched_stop": None,
            }
            if req.get("return_prompt_token_ids") or req.get("return_token_ids"):
                ch["prompt_token_ids"] = list(c.prompt)
            if req.get("return_token_ids"):
                ch["token_ids"] = list(c.gen)
            if want_meta:
                ch["meta_info"] = metas[k]
            out.append(ch)
        return self.openai_response("chat.completion", ids_out[0], model_name, out, usage,
                                    routed_ext)

    def chat_logprobs(self, c: Choice, top: int, lo: int = 0, hi: Optional[int] = None):
        hi = len(c.gen) if hi is None else hi
        content = []
        for j in range(lo, hi):
            text = token_text(c.gen[j])
            alts = c.alternates(j, top) if top > 0 else []
            content.append({
                "token": text, "bytes": list(text.encode("utf-8")), "logprob": c.lps[j],
                "top_logprobs": [{"token": token_text(t),
                                  "bytes": list(token_text(t).encode("utf-8")), "logprob": lp}
                                 for t, lp in alts]})
        return {"content": content}

    def chat_stream(self, req, rid, model_name, choices, want_lp, top, routed_ext, usage):
        def chunk(chs, **extra):
            e = {"id": rid, "object": "chat.completion.chunk", "created": CREATED,
                 "model": model_name, "choices": chs, "usage": None}
            e.update(extra)
            return e
        events = []
        for k in range(len(choices)):
            events.append(chunk([{"index": k, "delta": {"role": "assistant", "content": "",
                                                        "reasoning_content": None,
                                                        "tool_calls": None},
                                  "logprobs": None, "finish_reason": None,
                                  "matched_stop": None}]))
        for j, k, c in token_steps(choices):
            events.append(chunk([{
                "index": k,
                "delta": {"role": None, "content": token_text(c.gen[j]),
                          "reasoning_content": None, "tool_calls": None},
                "logprobs": self.chat_logprobs(c, top, j, j + 1) if want_lp else None,
                "finish_reason": "length" if j == len(c.gen) - 1 else None,
                "matched_stop": None}]))
        if routed_ext is not None:
            events.append(chunk([], sglext={"routed_experts": routed_ext}))
        if include_usage(req):
            events.append(chunk([], usage=usage))
        return Stream(events, done=True)

    # /v1/completions
    def completion_logprobs(self, c: Choice, top: int, lo: int = 0, hi: Optional[int] = None):
        hi = len(c.gen) if hi is None else hi
        texts = [token_text(c.gen[j]) for j in range(lo, hi)]
        return {"text_offset": [-1] * len(texts), "token_logprobs": c.lps[lo:hi],
                "tokens": texts,
                "top_logprobs": ([{token_text(t): lp for t, lp in c.alternates(j, top)}
                                  for j in range(lo, hi)] if top > 0 else [])}

    def completions(self, ctx: "Ctx", req: Dict[str, Any]):
        prompts = completion_prompts(req.get("prompt"))
        n, count, top = completion_args(req, self.m.max_tokens_default)
        want_ids = bool(req.get("return_token_ids"))
        want_routed = bool(req.get("return_routed_experts"))
        start = self.start_len(req, prompts)
        choices = [Choice(self.m, p, i, count, start) for p in prompts for i in range(n)]
        ids_out = self.item_ids("cmpl-" + ctx.hash, req.get("rid"), len(choices))
        meta0 = self.meta_info(choices[0], ids_out[0], routed=want_routed,
                               drop_routing=ctx.drop_routing)
        routed_ext = meta0.get("routed_experts")
        model_name = req.get("model") or "default"
        usage = self.usage(choices, n)
        if req.get("stream"):
            events = []
            for j, k, c in token_steps(choices):
                ch: Dict[str, Any] = {
                    "index": k, "text": token_text(c.gen[j]),
                    "logprobs": (None if top is None
                                 else self.completion_logprobs(c, top, j, j + 1)),
                    "finish_reason": "length" if j == len(c.gen) - 1 else None,
                    "matched_stop": None}
                if want_ids:
                    ch["token_ids"] = [c.gen[j]]
                    if j == 0:
                        ch["prompt_token_ids"] = list(c.prompt)
                events.append({"id": ids_out[0], "object": "text_completion",
                               "created": CREATED, "model": model_name, "choices": [ch],
                               "usage": None})
            if routed_ext is not None:
                events.append({"id": ids_out[0], "object": "text_completion",
                               "created": CREATED, "model": model_name, "choices": [],
                               "usage": None, "sglext": {"routed_experts": routed_ext}})
            if include_usage(req):
                events.append({"id": ids_out[0], "object": "text_completion",
                               "created": CREATED, "model": model_name, "choices": [],
                               "usage": without_nulls(usage)})
            return Stream(events, done=True)
        out = []
        for k, c in enumerate(choices):
            ch = {"index": k, "text": c.text(),
                  "logprobs": None if top is None else self.completion_logprobs(c, top),
                  "finish_reason": "length", "matched_stop": None}
            if want_ids:
                ch["token_ids"] = list(c.gen)
                ch["prompt_token_ids"] = list(c.prompt)
            out.append(ch)
        return self.openai_response("text_completion", ids_out[0], model_name, out, usage,
                                    routed_ext)

    def models(self):
        return {"object": "list", "data": [{
            "id": self.m.name, "object": "model", "created": CREATED, "owned_by": "sglang",
            "root": self.m.name, "parent": None, "max_model_len": self.m.max_model_len}]}

    routes = {
        "/generate": "generate",
        "/v1/chat/completions": "chat",
        "/v1/completions": "completions",
    }
    public = ("/health", "/health_generate", "/metrics")


# -- HTTP -----------------------------------------------------------------------------------


class Stream:
    def __init__(self, events: List[Any], done: bool):
        self.events = events
        self.done = done


class Ctx:
    def __init__(self, handler: "Handler", path: str, body: Any):
        self.handler = handler
        self.hash = id_hash(path, body)
        self.drop_routing = bool(isinstance(body, dict) and body.get("standin_drop_routing"))
        self.corrupt_routing = body.get("standin_corrupt_routing") if isinstance(body, dict) else None

    def header(self, name: str) -> Optional[str]:
        return self.handler.headers.get(name)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 4096
    allow_reuse_address = True

    def __init__(self, addr, engine, args):
        self.engine = engine
        self.args = args
        self.lock = threading.Lock()
        self.counts: Dict[Tuple[str, str], int] = {}
        super().__init__(addr, Handler)

    def count(self, path: str, status: int) -> None:
        with self.lock:
            key = (path, str(status))
            self.counts[key] = self.counts.get(key, 0) + 1


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def version_string(self) -> str:
        return "uvicorn"

    def log_message(self, fmt: str, *args: Any) -> None:
        if self.server.args.verbose:
            sys.stderr.write("standin: %s %s\n" % (self.address_string(), fmt % args))

    # plumbing
    def read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline(65537)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def send_bytes(self, status: int, data: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_json(self, status: int, obj: Any) -> None:
        self.send_bytes(status, dumps(obj).encode("utf-8"), "application/json")

    def send_json_chunked(self, obj: Any, piece: int) -> None:
        data = dumps(obj).encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for at in range(0, len(data), piece):
            part = data[at:at + piece]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def send_stream(self, stream: Stream, close_after: Optional[int]) -> None:
        chunked = self.request_version != "HTTP/1.0"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        interval = self.server.args.stream_interval_ms / 1000.0
        lines = ["data: %s\n\n" % dumps(e) for e in stream.events]
        if stream.done:
            lines.append("data: [DONE]\n\n")
        for k, line in enumerate(lines):
            if close_after is not None and k >= close_after:
                self.close_connection = True
                return
            data = line.encode("utf-8")
            if chunked:
                data = b"%x\r\n%s\r\n" % (len(data), data)
            self.wfile.write(data)
            self.wfile.flush()
            if interval and k + 1 < len(lines):
                time.sleep(interval)
        if chunked:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    def authorized(self, path: str) -> bool:
        key = self.server.args.api_key
        if not key or path in self.server.engine.public:
            return True
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and token == key

    def route(self) -> str:
        return self.path.split("?", 1)[0]

    # methods
    def do_GET(self) -> None:
        path = self.route()
        self.read_body()
        if not self.authorized(path):
            self.send_json(401, {"error": "Unauthorized"})
            return
        eng = self.server.engine
        if path == "/health" or (path == "/health_generate" and isinstance(eng, Sglang)):
            self.send_bytes(200, b"", "application/json")
        elif path == "/v1/models":
            self.send_json(200, eng.models())
        elif path == "/metrics":
            self.send_bytes(200, self.metrics().encode("utf-8"),
                            "text/plain; version=0.0.4; charset=utf-8")
        elif path in eng.routes:
            self.send_json(405, {"detail": "Method Not Allowed"})
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.route()
        raw = self.read_body()
        eng = self.server.engine
        if not self.authorized(path):
            self.send_json(401, {"error": "Unauthorized"})
            return
        method = eng.routes.get(path)
        if method is None:
            status = 405 if path in ("/health", "/v1/models", "/metrics") else 404
            self.send_json(status, {"detail": "Method Not Allowed" if status == 405
                                    else "Not Found"})
            return
        try:
            body = json.loads(raw.decode("utf-8")) if raw else None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            self.send_json(400, eng.error_body(path, 400, "Invalid JSON body: %s" % e))
            self.server.count(path, 400)
            return
        if not isinstance(body, dict):
            self.send_json(400, eng.error_body(path, 400, "The request body must be a JSON "
                                                          "object"))
            self.server.count(path, 400)
            return
        if body.get("standin_close"):
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        try:
            delay = self.server.args.delay_ms + float(body.get("standin_sleep_ms") or 0)
            status = body.get("standin_error")
            status = None if status is None else int(status)
        except (TypeError, ValueError):
            delay, status = 0, 400
        if delay > 0:
            time.sleep(delay / 1000.0)
        if status is not None:
            self.send_json(status, eng.error_body(path, status,
                                                  "standin_error: injected status %d" % status))
            self.server.count(path, status)
            return
        try:
            result = getattr(eng, method)(Ctx(self, path, body), body)
        except BadRequest as e:
            self.send_json(e.status, eng.error_body(path, e.status, str(e), e.param))
            self.server.count(path, e.status)
            return
        except Exception as e:  # a stand-in bug: answer like an engine's 500, keep serving
            self.send_json(500, eng.error_body(path, 500, "%s: %s" % (type(e).__name__, e)))
            self.server.count(path, 500)
            return
        self.server.count(path, 200)
        if isinstance(result, Stream):
            close_after = body.get("standin_close_after_events")
            try:
                self.send_stream(result, None if close_after is None else int(close_after))
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
        elif body.get("standin_chunked"):
            self.send_json_chunked(result, max(1, int(body["standin_chunked"])))
        else:
            self.send_json(200, result)

    def do_PUT(self) -> None:
        self.read_body()
        self.send_json(405 if self.route() in self.server.engine.routes else 404,
                       {"detail": "Method Not Allowed"
                        if self.route() in self.server.engine.routes else "Not Found"})

    do_DELETE = do_PUT
    do_PATCH = do_PUT

    def metrics(self) -> str:
        srv = self.server
        prefix = "vllm:" if srv.args.engine == "vllm" else "sglang:"
        name = srv.engine.m.name
        with srv.lock:
            counts = sorted(srv.counts.items())
        out = [
            "# HELP %snum_requests_running Number of requests in model execution batches."
            % prefix,
            "# TYPE %snum_requests_running gauge" % prefix,
            '%snum_requests_running{model_name="%s"} 0.0' % (prefix, name),
            "# HELP standin_http_requests_total Requests answered by the stand-in engine.",
            "# TYPE standin_http_requests_total counter",
        ]
        for (path, status), v in counts:
            out.append('standin_http_requests_total{path="%s",status="%s"} %d.0'
                       % (path, status, v))
        return "\n".join(out) + "\n"


# -- main -----------------------------------------------------------------------------------


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("vllm", "sglang"), required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0: an ephemeral port")
    ap.add_argument("--num-layers", type=int, default=4)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--num-experts", type=int, default=8)
    ap.add_argument("--dense-layers", default="",
                    help="comma-separated dense layer indices (zeros in the payload)")
    ap.add_argument("--routing-dtype", default=None,
                    help="numpy integer dtype of the routing payload (default vLLM: uint8 when "
                         "E <= 256 else int16; SGLang: int32, and routed_experts_dtype is "
                         "added to meta_info when given)")
    ap.add_argument("--no-routing", action="store_true",
                    help="an engine started without routing capture")
    ap.add_argument("--ignore-start", action="store_true",
                    help="a build that ignores the start offset: rows always start at 0")
    ap.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    ap.add_argument("--delay-ms", type=float, default=0.0,
                    help="sleep before answering each generation request")
    ap.add_argument("--stream-interval-ms", type=float, default=0.0,
                    help="sleep between the events of a stream")
    ap.add_argument("--return-sampling-mask", action="store_true",
                    help="vLLM: every choice carries its sampling mask (vLLM's engine flag)")
    ap.add_argument("--max-tokens-default", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--model-name", default="standin-moe")
    ap.add_argument("--verbose", action="store_true", help="log each request to stderr")
    args = ap.parse_args(argv)
    try:
        args.dense_layers = [int(x) for x in args.dense_layers.split(",") if x.strip()]
    except ValueError:
        ap.error("--dense-layers takes comma-separated integers")
    if args.num_layers < 1 or args.topk < 1 or args.num_experts < 1:
        ap.error("--num-layers, --topk and --num-experts must be positive")
    if args.topk > args.num_experts:
        ap.error("--topk must be at most --num-experts")
    if any(not 0 <= d < args.num_layers for d in args.dense_layers):
        ap.error("--dense-layers must be layer indices below --num-layers")
    if args.vocab_size < 256:
        ap.error("--vocab-size must be at least 256 (text is tokenized as bytes)")
    if args.routing_dtype is not None:
        try:
            dt = np.dtype(args.routing_dtype)
        except TypeError:
            ap.error("--routing-dtype %r is not a numpy dtype" % args.routing_dtype)
        if dt.kind not in "iu":
            ap.error("--routing-dtype must be an integer dtype")
        if args.num_experts - 1 > np.iinfo(dt).max:
            ap.error("--routing-dtype %s cannot hold expert id %d" % (dt, args.num_experts - 1))
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    model = Model(args)
    engine = Vllm(model) if args.engine == "vllm" else Sglang(model)
    threading.stack_size(512 * 1024)  # thousands of connection threads
    server = Server((args.host, args.port), engine, args)
    sys.stdout.write("PORT %d\n" % server.server_address[1])
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
