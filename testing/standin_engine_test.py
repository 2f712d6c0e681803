#!/usr/bin/python3
"""Self-check of testing/standin_engine.py: starts the stand-in as a process for each engine,
hits every endpoint and checks the formats against formulas recomputed here (not imported
from the stand-in): token ids, logprobs, the routing payloads decoded with numpy (.npy for
vLLM, raw values for SGLang), row counts for start offsets, n > 1, batches, streaming, error
injection, the API key, keep-alive and many concurrent connections.

    /usr/bin/python3 testing/standin_engine_test.py
"""

import base64
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import unittest
import urllib.error
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(HERE, "standin_engine.py")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
VOCAB = 32000


# -- the formulas, recomputed ---------------------------------------------------------------


def gen_tokens(prompt, i, count):
    seed = sum((k + 1) * t for k, t in enumerate(prompt)) % 1000003
    return [(seed + 7919 * j + 104729 * i) % VOCAB for j in range(count)]


def gen_logprobs(gen, i):
    return [-(((g + 3 * j + 5 * i) % 64) + 1) / 64.0 for j, g in enumerate(gen)]


def rows(tokens, start, layers, topk, experts, dense=()):
    out = np.zeros((max(len(tokens) - 1 - start, 0), layers, topk), dtype=np.int64)
    for p in range(start, len(tokens) - 1):
        for layer in range(layers):
            if layer in dense:
                continue
            for k in range(topk):
                out[p - start, layer, k] = (7 * p + 3 * layer + 11 * tokens[p] + k) % experts
    return out


def chat_tokens(messages):
    text = "".join("<|%s|>%s\n" % (m["role"], m["content"]) for m in messages)
    return list((text + "<|assistant|>").encode("utf-8"))


def text_of(gen):
    return "".join("<%d>" % t for t in gen)


def decode_npy(b64):
    return np.load(io.BytesIO(base64.b64decode(b64)), allow_pickle=False)


def decode_raw(b64, dtype, layers, topk):
    return np.frombuffer(base64.b64decode(b64), dtype=np.dtype(dtype).newbyteorder("<")) \
        .reshape(-1, layers, topk)


# -- the process ----------------------------------------------------------------------------


class Standin:
    def __init__(self, *args):
        self.proc = subprocess.Popen([PYTHON, ENGINE] + list(args), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError("stand-in did not start: %r %s" % (line, self.proc.stderr.read()))
        self.port = int(line.split()[1])
        self.base = "http://127.0.0.1:%d" % self.port

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()

    def request(self, path, body=None, headers=None, method=None, raw=False):
        """(status, headers, body bytes or parsed JSON)."""
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers=dict({"Content-Type": "application/json"},
                                                  **(headers or {})))
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                status, hdrs, payload = r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            status, hdrs, payload = e.code, e.headers, e.read()
        if raw:
            return status, hdrs, payload
        return status, hdrs, (json.loads(payload) if payload else None)

    def post(self, path, body, **kw):
        status, _, out = self.request(path, body, **kw)
        return status, out

    def events(self, path, body):
        status, hdrs, payload = self.request(path, body, raw=True)
        assert status == 200, payload
        assert hdrs["Content-Type"].startswith("text/event-stream"), hdrs
        text = payload.decode("utf-8")
        assert text.endswith("data: [DONE]\n\n"), text[-200:]
        chunks = [c for c in text.split("\n\n") if c]
        assert all(c.startswith("data: ") for c in chunks), chunks
        return [json.loads(c[6:]) for c in chunks[:-1]]


class StandinCase(unittest.TestCase):
    ARGS = ()
    L, K, E = 4, 2, 8
    DENSE = ()

    @classmethod
    def setUpClass(cls):
        cls.s = Standin(*cls.ARGS)

    @classmethod
    def tearDownClass(cls):
        cls.s.close()


# -- vLLM -----------------------------------------------------------------------------------


class VllmTest(StandinCase):
    L, K, E = 4, 2, 8
    DENSE = (0,)
    ARGS = ("--engine", "vllm", "--num-layers", "4", "--topk", "2", "--num-experts", "8",
            "--dense-layers", "0")

    def check_routing(self, b64, tokens, start):
        a = decode_npy(b64)
        self.assertEqual(a.dtype, np.uint8)
        self.assertEqual(a.shape, (len(tokens) - 1 - start, self.L, self.K))
        np.testing.assert_array_equal(a, rows(tokens, start, self.L, self.K, self.E, self.DENSE))
        for r in a:  # K distinct experts per (token, MoE layer)
            for layer in range(1, self.L):
                self.assertEqual(len(set(r[layer].tolist())), self.K)

    def test_completions(self):
        prompt = [3, 1, 4, 1, 5]
        st, out = self.s.post("/v1/completions", {"prompt": prompt, "max_tokens": 4,
                                                  "return_token_ids": True, "logprobs": 0,
                                                  "routed_experts_prompt_start": 2})
        self.assertEqual(st, 200, out)
        self.assertTrue(out["id"].startswith("cmpl-"))
        self.assertEqual(out["object"], "text_completion")
        self.assertEqual(out["created"], 1700000000)
        c = out["choices"][0]
        gen = gen_tokens(prompt, 0, 4)
        self.assertEqual(c["token_ids"], gen)
        self.assertEqual(c["prompt_token_ids"], prompt)
        self.assertEqual(c["text"], text_of(gen))
        self.assertEqual(c["logprobs"]["token_logprobs"], gen_logprobs(gen, 0))
        self.assertEqual(c["logprobs"]["top_logprobs"][0], {"<%d>" % gen[0]: gen_logprobs(gen,
                                                                                         0)[0]})
        self.assertEqual(c["finish_reason"], "length")
        self.check_routing(c["routed_experts"], prompt + gen, 2)
        self.assertEqual(out["usage"], {"prompt_tokens": 5, "total_tokens": 9,
                                        "completion_tokens": 4, "prompt_tokens_details": None})
        # Not asked: vLLM serializes the fields as null; routing is server-wide.
        st, out = self.s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        c = out["choices"][0]
        for key in ("token_ids", "prompt_token_ids", "logprobs", "prompt_logprobs"):
            self.assertIn(key, c)
            self.assertIsNone(c[key])
        self.check_routing(c["routed_experts"], list(b"hi") + gen_tokens(list(b"hi"), 0, 2), 0)

    def test_completions_n_and_batch(self):
        st, out = self.s.post("/v1/completions", {"prompt": [[7, 8, 9], [10, 11]], "n": 2,
                                                  "max_tokens": 3, "return_token_ids": True})
        self.assertEqual(st, 200, out)
        self.assertEqual([c["index"] for c in out["choices"]], [0, 1, 2, 3])
        for k, c in enumerate(out["choices"]):
            prompt = [[7, 8, 9], [10, 11]][k // 2]
            gen = gen_tokens(prompt, k % 2, 3)
            self.assertEqual(c["token_ids"], gen)
            self.check_routing(c["routed_experts"], prompt + gen, 0)
        self.assertNotEqual(out["choices"][0]["token_ids"], out["choices"][1]["token_ids"])

    def test_chat(self):
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo"}]
        body = {"model": "standin-moe", "messages": msgs, "max_tokens": 3,
                "return_token_ids": True, "logprobs": True, "top_logprobs": 0,
                "routed_experts_prompt_start": 4, "n": 2}
        st, out = self.s.post("/v1/chat/completions", body)
        self.assertEqual(st, 200, out)
        prompt = chat_tokens(msgs)
        self.assertEqual(out["prompt_token_ids"], prompt)
        self.assertEqual(out["object"], "chat.completion")
        for i, c in enumerate(out["choices"]):
            gen = gen_tokens(prompt, i, 3)
            self.assertEqual(c["token_ids"], gen)
            self.assertEqual(c["message"]["content"], text_of(gen))
            self.assertEqual([e["logprob"] for e in c["logprobs"]["content"]],
                             gen_logprobs(gen, i))
            self.assertEqual(c["logprobs"]["content"][0]["top_logprobs"], [])
            self.check_routing(c["routed_experts"], prompt + gen, 4)
        st, out = self.s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
        self.assertIsNone(out["prompt_token_ids"])
        self.assertIsNone(out["choices"][0]["logprobs"])
        self.assertIsNone(out["choices"][0]["token_ids"])
        self.assertNotIn("tool_calls", out["choices"][0]["message"])
        st, out = self.s.post("/v1/chat/completions", {"model": "other", "messages": msgs})
        self.assertEqual(st, 404)
        self.assertEqual(out["error"]["type"], "NotFoundError")

    def test_generate(self):
        prompt = [11, 12, 13, 14]
        body = {"token_ids": prompt, "sampling_params": {
            "max_tokens": 3, "n": 2, "logprobs": 0, "routed_experts_prompt_start": 4}}
        st, out = self.s.post("/inference/v1/generate", body)
        self.assertEqual(st, 200, out)
        self.assertTrue(out["request_id"].startswith("generate-tokens-"))
        for i, c in enumerate(out["choices"]):
            gen = gen_tokens(prompt, i, 3)
            self.assertEqual(c["token_ids"], gen)
            content = c["logprobs"]["content"]
            self.assertEqual([e["logprob"] for e in content], gen_logprobs(gen, i))
            self.assertEqual(content[0]["token"], "token_id:%d" % gen[0])
            self.check_routing(c["routed_experts"], prompt + gen, 4)
        st, out = self.s.post("/inference/v1/generate",
                              {"token_ids": prompt, "sampling_params": {"max_tokens": 1}})
        self.assertIsNone(out["choices"][0]["logprobs"])
        self.assertEqual(len(decode_npy(out["choices"][0]["routed_experts"])), 4)
        st, out = self.s.post("/inference/v1/generate", {"token_ids": prompt})
        self.assertEqual(st, 400)

    def test_streaming(self):
        ev = self.s.events("/v1/completions", {"prompt": [1, 2], "max_tokens": 3, "stream": True,
                                               "return_token_ids": True})
        self.assertEqual([e["choices"][0]["token_ids"][0] for e in ev], gen_tokens([1, 2], 0, 3))
        self.assertEqual(ev[0]["choices"][0]["prompt_token_ids"], [1, 2])
        self.assertTrue(all("routed_experts" not in e["choices"][0] for e in ev))
        ev = self.s.events("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}})
        self.assertEqual(ev[0]["choices"][0]["delta"]["role"], "assistant")
        self.assertEqual(ev[-1]["choices"], [])
        self.assertEqual(ev[-1]["usage"]["completion_tokens"], 2)
        prompt = [4, 5, 6]
        ev = self.s.events("/inference/v1/generate", {
            "token_ids": prompt, "stream": True,
            "sampling_params": {"max_tokens": 3, "n": 2, "routed_experts_prompt_start": 1}})
        self.assertEqual(len(ev), 6)
        for i in range(2):
            mine = [e["choices"][0] for e in ev if e["choices"][0]["index"] == i]
            gen = gen_tokens(prompt, i, 3)
            self.assertEqual([c["token_ids"][0] for c in mine], gen)
            self.assertEqual([c["finish_reason"] for c in mine], [None, None, "length"])
            self.assertEqual([c["routed_experts"] is None for c in mine], [True, True, False])
            self.check_routing(mine[-1]["routed_experts"], prompt + gen, 1)

    def test_deterministic_ids(self):
        body = {"prompt": [1, 2, 3], "max_tokens": 2}
        a = self.s.request("/v1/completions", body, raw=True)[2]
        b = self.s.request("/v1/completions", body, raw=True)[2]
        self.assertEqual(a, b)
        added = dict(body, return_token_ids=True, logprobs=0, routed_experts_prompt_start=1)
        c = json.loads(self.s.request("/v1/completions", added, raw=True)[2])
        self.assertEqual(c["id"], json.loads(a)["id"])
        other = json.loads(self.s.request("/v1/completions", dict(body, max_tokens=3),
                                          raw=True)[2])
        self.assertNotEqual(other["id"], c["id"])
        st, out = self.s.post("/v1/completions", body, headers={"X-Request-Id": "abc"})
        self.assertEqual(out["id"], "cmpl-abc")

    def test_errors(self):
        st, out = self.s.post("/v1/completions", {"prompt": [1], "standin_error": 500})
        self.assertEqual(st, 500)
        self.assertEqual(out["error"]["code"], 500)
        self.assertEqual(out["error"]["type"], "InternalServerError")
        st, out = self.s.post("/inference/v1/generate", {"token_ids": [1], "standin_error": 503,
                                                         "sampling_params": {}})
        self.assertEqual((st, out["error"]["code"]), (503, 503))
        with self.assertRaises((http.client.RemoteDisconnected, ConnectionResetError,
                                urllib.error.URLError)):
            self.s.request("/v1/completions", {"prompt": [1], "standin_close": True})
        st, out = self.s.post("/v1/completions", {"prompt": [1, 2],
                                                  "routed_experts_prompt_start": 3})
        self.assertEqual(st, 400)
        self.assertEqual(out["error"]["type"], "BadRequestError")
        st, out = self.s.post("/v1/completions", {"prompt": [1], "standin_drop_routing": True})
        self.assertIsNone(out["choices"][0]["routed_experts"])
        st, _, payload = self.s.request("/v1/completions", b"{not json", raw=True)
        self.assertEqual(st, 400)
        st, out = self.s.post("/v2/nothing", {})
        self.assertEqual((st, out), (404, {"detail": "Not Found"}))

    def test_sleep_and_truncated_stream(self):
        st, out = self.s.post("/v1/completions", {"prompt": [1], "standin_sleep_ms": 50})
        self.assertEqual(st, 200)
        conn = http.client.HTTPConnection("127.0.0.1", self.s.port, timeout=10)
        conn.request("POST", "/inference/v1/generate", json.dumps({
            "token_ids": [1], "stream": True, "sampling_params": {"max_tokens": 5},
            "standin_close_after_events": 2}))
        r = conn.getresponse()
        with self.assertRaises(http.client.IncompleteRead):
            r.read()
        conn.close()

    def test_models_health_metrics(self):
        st, _, out = self.s.request("/v1/models")
        self.assertEqual(out["data"][0]["id"], "standin-moe")
        self.assertEqual(out["data"][0]["owned_by"], "vllm")
        st, _, payload = self.s.request("/health", raw=True)
        self.assertEqual((st, payload), (200, b""))
        st, hdrs, payload = self.s.request("/metrics", raw=True)
        self.assertEqual(st, 200)
        self.assertIn(b"vllm:num_requests_running", payload)
        self.assertTrue(hdrs["Content-Type"].startswith("text/plain"))

    def test_keep_alive(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.s.port, timeout=10)
        sockets = set()
        for k in range(5):
            conn.request("POST", "/v1/completions", json.dumps({"prompt": [k + 1],
                                                                "max_tokens": 1}),
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            self.assertEqual(r.status, 200)
            self.assertIsNotNone(r.getheader("Content-Length"))
            r.read()
            sockets.add(id(conn.sock))
        # A stream (chunked) keeps the connection too.
        conn.request("POST", "/v1/completions", json.dumps({"prompt": [1], "max_tokens": 2,
                                                            "stream": True}))
        r = conn.getresponse()
        self.assertEqual(r.getheader("Transfer-Encoding"), "chunked")
        self.assertTrue(r.read().endswith(b"data: [DONE]\n\n"))
        conn.request("GET", "/health")
        self.assertEqual(conn.getresponse().status, 200)
        sockets.add(id(conn.sock))
        self.assertEqual(len(sockets), 1)
        conn.close()

    def test_many_connections(self):
        """2,000 connections open at once, each with a request in flight."""
        count = int(os.environ.get("STANDIN_TEST_CONNECTIONS", "2000"))
        body = json.dumps({"prompt": [1, 2], "max_tokens": 1}).encode()
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        socks = []
        try:
            for _ in range(count):
                s = socket.create_connection(("127.0.0.1", self.s.port), timeout=60)
                s.sendall(req)
                socks.append(s)
            for s in socks:
                f = s.makefile("rb")
                r = http.client.HTTPResponse(s)
                r.fp = f
                r.begin()
                self.assertEqual(r.status, 200)
                self.assertIn(b"routed_experts", r.read())
        finally:
            for s in socks:
                s.close()


class VllmVariantsTest(unittest.TestCase):
    def test_int16_ignore_start_and_no_routing(self):
        s = Standin("--engine", "vllm", "--num-layers", "2", "--topk", "3",
                    "--num-experts", "300", "--ignore-start")
        try:
            st, out = s.post("/v1/completions", {"prompt": [9, 8, 7], "max_tokens": 2,
                                                 "routed_experts_prompt_start": 2})
            a = decode_npy(out["choices"][0]["routed_experts"])
            self.assertEqual(a.dtype, np.int16)
            tokens = [9, 8, 7] + gen_tokens([9, 8, 7], 0, 2)
            np.testing.assert_array_equal(a, rows(tokens, 0, 2, 3, 300))  # rows from 0
        finally:
            s.close()
        s = Standin("--engine", "vllm", "--no-routing", "--routing-dtype", "int32")
        try:
            st, out = s.post("/v1/chat/completions", {"messages": [{"role": "user",
                                                                     "content": "a"}]})
            self.assertIn("routed_experts", out["choices"][0])
            self.assertIsNone(out["choices"][0]["routed_experts"])
        finally:
            s.close()

    def test_api_key(self):
        s = Standin("--engine", "vllm", "--api-key", "sekret")
        try:
            st, out = s.post("/v1/completions", {"prompt": [1]})
            self.assertEqual((st, out), (401, {"error": "Unauthorized"}))
            st, out = s.post("/v1/completions", {"prompt": [1]},
                             headers={"Authorization": "Bearer wrong"})
            self.assertEqual(st, 401)
            st, out = s.post("/v1/completions", {"prompt": [1]},
                             headers={"Authorization": "Bearer sekret"})
            self.assertEqual(st, 200)
            self.assertEqual(s.request("/v1/models")[0], 401)
            self.assertEqual(s.request("/health", raw=True)[0], 200)
            self.assertEqual(s.request("/metrics", raw=True)[0], 200)
        finally:
            s.close()


# -- SGLang ---------------------------------------------------------------------------------


class SglangTest(StandinCase):
    L, K, E = 3, 2, 16
    DENSE = (1,)
    ARGS = ("--engine", "sglang", "--num-layers", "3", "--topk", "2", "--num-experts", "16",
            "--dense-layers", "1", "--max-tokens-default", "5")

    def check_routing(self, b64, tokens, start, dtype="int32"):
        a = decode_raw(b64, dtype, self.L, self.K)
        self.assertEqual(a.shape, (len(tokens) - 1 - start, self.L, self.K))
        np.testing.assert_array_equal(a, rows(tokens, start, self.L, self.K, self.E, self.DENSE))

    def test_generate(self):
        prompt = [21, 22, 23, 24, 25]
        st, out = self.s.post("/generate", {
            "input_ids": prompt, "sampling_params": {"max_new_tokens": 3},
            "return_logprob": True, "return_routed_experts": True,
            "routed_experts_start_len": 3})
        self.assertEqual(st, 200, out)
        self.assertIsInstance(out, dict)
        gen = gen_tokens(prompt, 0, 3)
        self.assertEqual(out["output_ids"], gen)
        self.assertEqual(out["text"], text_of(gen))
        m = out["meta_info"]
        self.assertEqual(m["prompt_tokens"], 5)
        self.assertEqual(m["completion_tokens"], 3)
        self.assertEqual(m["finish_reason"], {"type": "length", "length": 3})
        self.assertEqual(m["output_token_logprobs"],
                         [[lp, t, None] for lp, t in zip(gen_logprobs(gen, 0), gen)])
        self.assertEqual(m["input_token_logprobs"], [])
        self.assertNotIn("routed_experts_dtype", m)
        self.check_routing(m["routed_experts"], prompt + gen, 3)
        # Not asked: no routing, no logprobs.
        st, out = self.s.post("/generate", {"text": "abc"})
        m = out["meta_info"]
        self.assertNotIn("routed_experts", m)
        self.assertNotIn("output_token_logprobs", m)
        self.assertEqual(out["output_ids"], gen_tokens(list(b"abc"), 0, 5))  # default tokens
        st, out = self.s.post("/generate", {"input_ids": prompt, "return_logprob": True,
                                            "logprob_start_len": 0})
        lps = out["meta_info"]["input_token_logprobs"]
        self.assertEqual(lps[0], [None, 21, None])
        self.assertEqual(lps[1], [-(((22 + 1) % 64) + 1) / 64.0, 22, None])

    def test_generate_n_and_batch(self):
        prompt = [1, 2, 3]
        st, out = self.s.post("/generate", {"input_ids": prompt, "return_routed_experts": True,
                                            "sampling_params": {"max_new_tokens": 2, "n": 3}})
        self.assertIsInstance(out, list)
        self.assertEqual(len(out), 3)
        self.assertEqual(len({o["meta_info"]["id"] for o in out}), 3)
        for i, o in enumerate(out):
            gen = gen_tokens(prompt, i, 2)
            self.assertEqual(o["output_ids"], gen)
            self.check_routing(o["meta_info"]["routed_experts"], prompt + gen, 0)
        st, out = self.s.post("/generate", {"input_ids": [[1, 2], [3, 4, 5]],
                                            "return_routed_experts": True,
                                            "routed_experts_start_len": 1,
                                            "sampling_params": {"max_new_tokens": 2}})
        self.assertEqual(len(out), 2)
        for p, o in zip([[1, 2], [3, 4, 5]], out):
            self.check_routing(o["meta_info"]["routed_experts"], p + gen_tokens(p, 0, 2), 1)
        st, out = self.s.post("/generate", {"input_ids": [1], "rid": "my-rid"})
        self.assertEqual(out["meta_info"]["id"], "my-rid")

    def test_generate_stream(self):
        prompt = [7, 7, 7]
        ev = self.s.events("/generate", {"input_ids": prompt, "stream": True,
                                         "return_routed_experts": True, "return_logprob": True,
                                         "sampling_params": {"max_new_tokens": 3, "n": 2}})
        self.assertEqual(len(ev), 6)
        for i in range(2):
            mine = [e for e in ev if e["index"] == i]
            gen = gen_tokens(prompt, i, 3)
            self.assertEqual([e["output_ids"] for e in mine], [gen[:1], gen[:2], gen])
            self.assertEqual([("routed_experts" in e["meta_info"]) for e in mine],
                             [False, False, True])
            self.assertIsNone(mine[0]["meta_info"]["finish_reason"])
            self.assertEqual(len(mine[-1]["meta_info"]["output_token_logprobs"]), 3)
            self.check_routing(mine[-1]["meta_info"]["routed_experts"], prompt + gen, 0)
        ev = self.s.events("/generate", {"text": "a", "stream": True})
        self.assertNotIn("index", ev[0])

    def test_chat(self):
        msgs = [{"role": "user", "content": "hey"}]
        prompt = chat_tokens(msgs)
        body = {"messages": msgs, "max_tokens": 2, "n": 2, "return_routed_experts": True,
                "return_meta_info": True, "return_token_ids": True, "logprobs": True,
                "top_logprobs": 0, "routed_experts_start_len": 5}
        st, out = self.s.post("/v1/chat/completions", body)
        self.assertEqual(st, 200, out)
        self.assertNotIn("sglext", out)
        self.assertEqual(out["metadata"], {"weight_version": "default"})
        for i, c in enumerate(out["choices"]):
            gen = gen_tokens(prompt, i, 2)
            self.assertEqual(c["token_ids"], gen)
            self.assertEqual(c["prompt_token_ids"], prompt)
            self.assertEqual([e["logprob"] for e in c["logprobs"]["content"]],
                             gen_logprobs(gen, i))
            self.assertEqual(c["meta_info"]["output_token_logprobs"][0][:2],
                             [gen_logprobs(gen, i)[0], gen[0]])
            self.check_routing(c["meta_info"]["routed_experts"], prompt + gen, 5)
        self.assertNotEqual(out["choices"][0]["meta_info"]["id"],
                            out["choices"][1]["meta_info"]["id"])
        # Not asked: the keys are absent.
        st, out = self.s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
        c = out["choices"][0]
        for key in ("token_ids", "prompt_token_ids", "meta_info"):
            self.assertNotIn(key, c)
        self.assertIsNone(c["logprobs"])
        self.assertNotIn("sglext", out)
        # Routing without meta_info: response-level sglext, choice 0.
        st, out = self.s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "n": 2,
                                                       "return_routed_experts": True})
        self.check_routing(out["sglext"]["routed_experts"],
                           prompt + gen_tokens(prompt, 0, 2), 0)
        # input_ids bypass the template.
        st, out = self.s.post("/v1/chat/completions", {"messages": msgs, "input_ids": [5, 6],
                                                       "max_tokens": 1, "return_token_ids": True})
        self.assertEqual(out["choices"][0]["prompt_token_ids"], [5, 6])
        # Streaming refuses the non-streaming extensions, like SGLang.
        st, out = self.s.post("/v1/chat/completions", {"messages": msgs, "stream": True,
                                                       "return_meta_info": True})
        self.assertEqual(st, 400)
        self.assertEqual(out["object"], "error")
        ev = self.s.events("/v1/chat/completions", {"messages": msgs, "stream": True,
                                                     "max_tokens": 2})
        self.assertEqual("".join(e["choices"][0]["delta"]["content"] for e in ev),
                         text_of(gen_tokens(prompt, 0, 2)))

    def test_completions(self):
        prompt = [2, 4, 6, 8]
        st, out = self.s.post("/v1/completions", {
            "prompt": prompt, "max_tokens": 3, "return_routed_experts": True,
            "return_token_ids": True, "logprobs": 0, "routed_experts_start_len": 2})
        self.assertEqual(st, 200, out)
        gen = gen_tokens(prompt, 0, 3)
        c = out["choices"][0]
        self.assertEqual(c["token_ids"], gen)
        self.assertEqual(c["prompt_token_ids"], prompt)
        self.assertEqual(c["logprobs"]["token_logprobs"], gen_logprobs(gen, 0))
        self.assertEqual(c["logprobs"]["top_logprobs"], [])
        self.check_routing(out["sglext"]["routed_experts"], prompt + gen, 2)
        st, out = self.s.post("/v1/completions", {"prompt": "xy", "max_tokens": 1})
        self.assertNotIn("sglext", out)
        self.assertNotIn("token_ids", out["choices"][0])
        self.assertIsNone(out["choices"][0]["logprobs"])
        ev = self.s.events("/v1/completions", {"prompt": prompt, "max_tokens": 2,
                                               "stream": True, "return_routed_experts": True})
        self.assertEqual(ev[-1]["choices"], [])
        self.check_routing(ev[-1]["sglext"]["routed_experts"],
                           prompt + gen_tokens(prompt, 0, 2), 0)

    def test_errors(self):
        st, out = self.s.post("/generate", {"input_ids": [1], "standin_error": 500})
        self.assertEqual((st, out), (500, {"error": {"message":
                                                     "standin_error: injected status 500"}}))
        st, out = self.s.post("/v1/chat/completions", {"messages": [], "standin_error": 503})
        self.assertEqual(st, 503)
        self.assertEqual((out["object"], out["code"], out["type"]),
                         ("error", 503, "ServiceUnavailableError"))
        st, out = self.s.post("/generate", {"input_ids": [1, 2],
                                            "routed_experts_start_len": 3})
        self.assertEqual(st, 400)
        self.assertIn("message", out["error"])
        st, out = self.s.post("/generate", {"sampling_params": {}})
        self.assertEqual(st, 400)
        with self.assertRaises((http.client.RemoteDisconnected, ConnectionResetError,
                                urllib.error.URLError)):
            self.s.request("/generate", {"input_ids": [1], "standin_close": True})
        st, out = self.s.post("/generate", {"input_ids": [1], "return_routed_experts": True,
                                            "standin_drop_routing": True})
        self.assertNotIn("routed_experts", out["meta_info"])

    def test_models_health(self):
        st, _, out = self.s.request("/v1/models")
        self.assertEqual(out["data"][0]["owned_by"], "sglang")
        self.assertEqual(self.s.request("/health", raw=True)[:3:2], (200, b""))
        self.assertIn(b"sglang:", self.s.request("/metrics", raw=True)[2])


class SglangVariantsTest(unittest.TestCase):
    def test_dtype_ignore_start_no_routing(self):
        s = Standin("--engine", "sglang", "--num-layers", "2", "--topk", "2",
                    "--num-experts", "4", "--routing-dtype", "int16", "--ignore-start")
        try:
            prompt = [1, 2, 3, 4]
            st, out = s.post("/generate", {"input_ids": prompt, "return_routed_experts": True,
                                           "routed_experts_start_len": 3,
                                           "sampling_params": {"max_new_tokens": 2}})
            m = out["meta_info"]
            self.assertEqual(m["routed_experts_dtype"], "int16")
            a = decode_raw(m["routed_experts"], "int16", 2, 2)
            tokens = prompt + gen_tokens(prompt, 0, 2)
            self.assertEqual(len(a), len(tokens) - 1)  # from 0: a build that ignores the start
            np.testing.assert_array_equal(a, rows(tokens, 0, 2, 2, 4))
        finally:
            s.close()
        s = Standin("--engine", "sglang", "--no-routing", "--api-key", "k")
        try:
            st, out = s.post("/generate", {"input_ids": [1], "return_routed_experts": True},
                             headers={"Authorization": "Bearer k"})
            self.assertEqual(st, 200)
            self.assertNotIn("routed_experts", out["meta_info"])
            self.assertEqual(s.post("/generate", {"input_ids": [1]})[0], 401)
            self.assertEqual(s.request("/health", raw=True)[0], 200)
        finally:
            s.close()


def kept(g, j):
    """The stand-in's sampling mask of generated token j (id g), recomputed."""
    return sorted({(g + 61 * r) % VOCAB for r in range(1 + (g + j) % 4)})


class SamplingMaskTest(unittest.TestCase):
    """vLLM's choices[i].sampling_mask (engine flag) and SGLang's
    meta_info.output_token_sampling_mask (request flag)."""

    def test_vllm_every_choice_with_the_flag_only(self):
        s = Standin("--engine", "vllm", "--return-sampling-mask")
        try:
            prompt = [5, 6, 7]
            gen = gen_tokens(prompt, 0, 3)
            want = [kept(g, j) for j, g in enumerate(gen)]
            for path, body in (
                    ("/inference/v1/generate",
                     {"token_ids": prompt, "sampling_params": {"max_tokens": 3, "top_k": 4}}),
                    ("/v1/completions", {"prompt": prompt, "max_tokens": 3})):
                st, out = s.post(path, body)
                self.assertEqual(st, 200, out)
                self.assertEqual(out["choices"][0]["sampling_mask"], want, path)
                for g, lst in zip(gen, want):
                    self.assertIn(g, lst)
            st, out = s.post("/inference/v1/generate", {
                "token_ids": prompt, "standin_drop_routing": True,
                "sampling_params": {"max_tokens": 3}})
            self.assertIsNone(out["choices"][0]["sampling_mask"])
            events = s.events("/inference/v1/generate", {
                "token_ids": prompt, "stream": True, "sampling_params": {"max_tokens": 3}})
            self.assertEqual([e["choices"][0]["sampling_mask"] for e in events],
                             [[w] for w in want])
        finally:
            s.close()
        s = Standin("--engine", "vllm")
        try:
            st, out = s.post("/inference/v1/generate",
                             {"token_ids": [1], "sampling_params": {"max_tokens": 2}})
            self.assertNotIn("sampling_mask", out["choices"][0])
        finally:
            s.close()

    def test_sglang_when_the_request_asks(self):
        s = Standin("--engine", "sglang")
        try:
            prompt = [5, 6, 7]
            gen = gen_tokens(prompt, 0, 2)
            want = [kept(g, j) for j, g in enumerate(gen)]
            sp = {"max_new_tokens": 2, "top_k": 8}
            st, out = s.post("/generate", {"input_ids": prompt, "sampling_params": sp,
                                           "return_sampling_mask": True})
            self.assertEqual(st, 200, out)
            meta = out["meta_info"]
            self.assertEqual(meta["output_token_sampling_mask"], want)
            self.assertEqual(meta["output_token_sampling_mask_length"], 2)
            self.assertEqual(len(meta["output_token_sampling_logprobs"]), 2)
            st, out = s.post("/generate", {"input_ids": prompt, "sampling_params": sp})
            self.assertNotIn("output_token_sampling_mask", out["meta_info"])
            st, out = s.post("/v1/chat/completions", {
                "messages": [], "input_ids": prompt, "max_tokens": 2, "top_p": 0.9,
                "return_sampling_mask": True, "return_meta_info": True})
            self.assertEqual(st, 200, out)
            self.assertEqual(out["choices"][0]["meta_info"]["output_token_sampling_mask"], want)
            st, out = s.post("/generate", {"input_ids": prompt, "return_sampling_mask": True,
                                           "sampling_params": {"max_new_tokens": 2}})
            self.assertEqual(st, 400)
            self.assertIn("huge masks", json.dumps(out))
            st, _ = s.post("/generate", {"input_ids": prompt, "return_sampling_mask": True,
                                         "stream": True, "sampling_params": sp})
            self.assertEqual(st, 400)
        finally:
            s.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
