#!/usr/bin/env python3
"""The capture port from a rollout worker's side, with nothing but an HTTP client.

A rollout worker that already talks to vLLM's OpenAI server changes one thing: its base URL
points at rollpackd's capture port (docs/capture.md). Every generation is then stored in
rollpackd's pool with its MoE routing, and the worker gets vLLM's answer without the routing
payload. Headers say what the sample is (its GRPO group, policy version, session); the answer's
headers say what was stored.

    python3 docs/examples/capture_quickstart.py http://127.0.0.1:8001 [MODEL]

Standard library only. It prints one line per request: what was stored, under which ids.
"""

import json
import sys
import urllib.request

BASE = sys.argv[1].rstrip("/") if len(sys.argv) > 1 else "http://127.0.0.1:8001"
MODEL = sys.argv[2] if len(sys.argv) > 2 else "standin-moe"


def post(path, body, headers=None):
    """POST JSON; returns (status, response headers, parsed body)."""
    request = urllib.request.Request(
        BASE + path, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.status, response.headers, json.loads(response.read() or b"null")


def report(what, headers):
    print("%-28s %-10s %s" % (what, headers.get("X-Rollpack-Capture"),
                              headers.get("X-Rollpack-Sample-Ids", "")))


# 1. A GRPO group: n = 4 answers to one prompt are stored as 4 samples of one group
#    (ids B#0..B#3, group B, size 4), from policy version 7.
_, headers, body = post(
    "/v1/chat/completions",
    {"model": MODEL, "n": 4, "max_tokens": 16,
     "messages": [{"role": "user", "content": "What is 17 * 23?"}]},
    {"X-Rollpack-Policy-Version": "7"})
report("GRPO group of 4", headers)
assert "routed_experts" not in json.dumps(body), "the routing payload stays in rollpackd"

# 2. A multi-turn agent session: each turn sends the whole conversation as token ids (so the
#    prefix the sample already holds is exact), and rollpackd stores only what is new, one
#    piece per turn; the engine is never asked again for the stored prefix's routing.
#    `return_token_ids` is the worker's own request: the answer keeps the ids it asked for.
session = {"X-Rollpack-Session": "episode-42"}
prompt = [101, 2023, 2003, 1037, 3231]
for turn, tool_result in enumerate([[], [4, 5, 6], [7, 8]]):
    prompt = prompt + tool_result  # e.g. a tool's output, tokenized by the worker
    last = turn == 2
    _, headers, body = post(
        "/v1/completions",
        {"model": MODEL, "prompt": prompt, "max_tokens": 8, "return_token_ids": True},
        {**session, "X-Rollpack-Final": "true" if last else "false"})
    report("session turn %d%s" % (turn + 1, " (final)" if last else ""), headers)
    prompt = prompt + body["choices"][0]["token_ids"]

# 3. A reward known only later goes with the sample's scalars: either as a header on the
#    request (X-Rollpack-Scalars: {"reward": 1.0}) or, for a session, when it is sealed:
_, headers, body = post("/v1/completions",
                        {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4},
                        {"X-Rollpack-Session": "episode-43",
                         "X-Rollpack-Scalars": json.dumps({"reward": 0.0})})
report("session episode-43", headers)
_, _, sealed = post("/rollpack/v1/sessions/episode-43/finish", {"scalars": {"reward": 0.0}})
print("%-28s sealed %s (%d tokens)" % ("finish episode-43", sealed["sample_id"],
                                        sealed["tokens"]))
