"""Engine adapters added for issue 22: Megatron-core inference, TensorRT-LLM
R3, vLLM's int16 device capture and SGLang's per-turn slices. Golden payloads
are built here in each engine's documented format (the adapter docstrings cite
the source) from a known routed-experts array.

Run: PYTHONPATH=client/python /usr/bin/python3 -m unittest -v tests.test_adapters_engines
(from client/python).
"""

import json
import os
import subprocess
import sys
import types
import unittest

import numpy as np

from rollpack import ModelSpec, PayloadError, Sample
from rollpack import adapters as ad
from rollpack.sample import narrow_routed_experts
from tests import engines as eng

try:
    import torch
except ImportError:  # the adapters never need it; the tests of tensors skip
    torch = None

S = eng.SMALL  # N=6, M=[1,2,4,5], E=16, K=4
M = list(S.resolved_moe_layers)
needs_torch = unittest.skipIf(torch is None, "torch is not installed")


def mtp_spec(d, routing):
    """S with D MTP layers (layout.md section 10)."""
    return ModelSpec("mtp-moe", num_layers=6, moe_layers=M, num_experts=16, topk=4,
                     num_mtp_layers=d, mtp_routing=routing)


class Base(unittest.TestCase):
    def assertRows(self, got, truth, offset):
        """``truth`` is [rows, N, K] (full) or [rows, |M|, K]; compared on MoE layers."""
        arr, off = got
        self.assertEqual(off, offset)
        arr = np.asarray(arr)
        if arr.shape[1] == S.num_layers:
            arr = arr[:, M, :]
        if truth.shape[1] == S.num_layers:
            truth = truth[:, M, :]
        np.testing.assert_array_equal(arr.astype(np.int64), truth.astype(np.int64))

    def refuse(self, fn, *words):
        with self.assertRaises(PayloadError) as cm:
            fn()
        msg = str(cm.exception)
        for w in words:
            self.assertIn(w, msg)
        return msg


# -- Megatron-core inference -------------------------------------------------
# DynamicInferenceRequest.routing_indices: numpy [prompt + generated - 1,
# moe_layers (+ MTP routers), topk], int16 (int32 past 32768 experts).

def megatron_request(p, g, seed=0, dtype=np.int16, layers=None):
    """A finished DynamicInferenceRequest stand-in and its truth [n-1, |M|, K]."""
    truth = eng.compact(eng.routed(p + g - 1, S, seed=seed), S)
    if layers is not None:
        truth = layers(truth)
    toks = eng.tokens(p + g, seed=seed + 1)
    req = types.SimpleNamespace(
        request_id=7, prompt_tokens=toks[:p].astype(np.int64), generated_tokens=toks[p:].tolist(),
        routing_indices=truth.astype(dtype))
    return req, toks, truth


def megatron_serialized(req, wrapper="ndarray", drop_prompt=False):
    """DynamicInferenceRequest.serialize() as the client receives it (through
    msgpack or JSON: the tuples arrive as lists)."""
    ri = req.routing_indices
    if wrapper == "ndarray":  # Megatron-LM >= PR 4301
        value = ("ndarray", {"data": ri.tolist(), "dtype": str(ri.dtype)})
    elif wrapper == "tensor":  # before: a torch tensor
        value = ("tensor", ri.tolist())
    else:
        value = ri.tolist()
    obj = {"request_id": req.request_id, "status": "COMPLETED",
           "prompt_tokens": None if drop_prompt else ("tensor", req.prompt_tokens.tolist()),
           "prompt_length": len(req.prompt_tokens), "generated_tokens": req.generated_tokens,
           "routing_indices": value}
    return json.loads(json.dumps(obj))


def megatron_completions(req, wrapper="ndarray", chat=False):
    """The text-generation server's /v1/(chat/)completions response."""
    ser = megatron_serialized(req, wrapper)
    choice = {"index": 0, "finish_reason": "length", "moe_topk_indices": ser["routing_indices"]}
    # What the server puts there: a slice of the same value (of the wrapper after PR 4301).
    choice["prompt_moe_topk_indices"] = ser["routing_indices"][:len(req.prompt_tokens)]
    if chat:
        choice["message"] = {"role": "assistant", "content": ""}
    else:
        choice.update(text="", prompt_token_ids=req.prompt_tokens.tolist(),
                      generation_token_ids=req.generated_tokens)
    return json.loads(json.dumps({"id": "cmpl-1", "object": "text_completion",
                                  "choices": [choice]}))


class Megatron(Base):
    def test_request_object_is_a_view_and_counts_its_tokens(self):
        req, toks, truth = megatron_request(9, 6)
        got = ad.from_megatron_inference(req, None, S)
        self.assertRows(got, truth, 0)
        self.assertEqual(got.array.dtype, np.int16)
        self.assertTrue(np.shares_memory(got.array, req.routing_indices))
        self.assertRows(ad.from_megatron_inference(req, toks, S), truth, 0)
        self.assertRows(ad.from_megatron_inference(req.routing_indices, toks, S), truth, 0)

    def test_serialized_forms(self):
        req, toks, truth = megatron_request(5, 8, seed=3)
        for wrapper in ("ndarray", "tensor", "list"):
            got = ad.from_megatron_inference(megatron_serialized(req, wrapper), None, S)
            self.assertRows(got, truth, 0)
        got = ad.from_megatron_inference(megatron_serialized(req), None, S)
        self.assertEqual(got.array.dtype, np.int16)  # the wrapper's dtype is kept
        # return_prompt_tokens off: prompt_tokens dropped, prompt_length counts.
        dropped = megatron_serialized(req, drop_prompt=True)
        self.assertIsNone(dropped["prompt_tokens"])
        self.assertRows(ad.from_megatron_inference(dropped, None, S), truth, 0)

    def test_http_choices(self):
        req, toks, truth = megatron_request(4, 7, seed=5)
        for wrapper in ("ndarray", "list"):
            resp = megatron_completions(req, wrapper)
            self.assertRows(ad.from_megatron_inference(resp, None, S), truth, 0)
            self.assertRows(ad.from_megatron_inference(resp["choices"][0], None, S), truth, 0)
        chat = megatron_completions(req, chat=True)
        self.assertRows(ad.from_megatron_inference(chat, toks, S), truth, 0)
        self.refuse(lambda: ad.from_megatron_inference(chat, None, S), "pass tokens")

    def test_record_is_merged(self):
        req, toks, truth = megatron_request(6, 3, seed=2)
        record = types.SimpleNamespace(requests=[req], merge=lambda: req)
        self.assertRows(ad.from_megatron_inference(record, None, S), truth, 0)

    @needs_torch
    def test_torch_tensor_before_pr_4301(self):
        req, toks, truth = megatron_request(6, 5, seed=4)
        req.routing_indices = torch.from_numpy(truth.astype(np.int32))
        req.prompt_tokens = torch.from_numpy(toks[:6].astype(np.int64))
        got = ad.from_megatron_inference(req, None, S)
        self.assertRows(got, truth, 0)
        self.assertTrue(np.shares_memory(got.array, req.routing_indices.numpy()))

    def test_int32_for_many_experts(self):
        wide = ModelSpec("wide", num_layers=2, num_experts=40000, topk=2)
        rows = np.random.default_rng(0).permutation(40000)[:2 * 2 * 4].reshape(4, 2, 2)
        got = ad.from_megatron_inference(rows.astype(np.int32), 5, wide)
        np.testing.assert_array_equal(got.array, rows)

    def test_mtp_routers(self):
        d = 2

        def with_mtp(t):
            extra = eng.compact(eng.routed(t.shape[0], S, seed=99), S)[:, :d]
            return np.concatenate([t, extra], axis=1)
        req, toks, truth = megatron_request(5, 5, seed=6, layers=with_mtp)
        # The samples carry no MTP routing: the MTP routers' entries are dropped (a view).
        got = ad.from_megatron_inference(req, None, mtp_spec(d, routing=False))
        self.assertEqual(got.array.shape[1], len(M))
        self.assertRows(got, truth[:, :len(M)], 0)
        self.assertTrue(np.shares_memory(got.array, req.routing_indices))
        # With mtp_routing they are kept: [rows, |M| + D, K].
        kept = ad.from_megatron_inference(req, None, mtp_spec(d, routing=True))
        np.testing.assert_array_equal(kept.array, truth)
        Sample("mtp", toks, *kept).check(mtp_spec(d, routing=True))
        Sample("no-mtp", toks, *got).check(mtp_spec(d, routing=False))
        # Without MTP in the spec, |M| + D layers are refused.
        self.refuse(lambda: ad.from_megatron_inference(req, None, S), "6 layers",
                    "RouterReplay", "4 MoE layers")

    def test_refusals(self):
        req, toks, truth = megatron_request(6, 4)
        self.refuse(lambda: ad.from_megatron_inference(req, toks[:-1], S),
                    "tokens has 9 tokens", "number 10")
        self.refuse(lambda: ad.from_megatron_inference(truth[:-1], toks, S), "8 rows",
                    "10 tokens", "must number 9")
        self.refuse(lambda: ad.from_megatron_inference(eng.routed(9, S), toks, S),
                    "6 layers", "RouterReplay", "4 MoE layers")  # full axis: not Megatron's
        self.refuse(lambda: ad.from_megatron_inference(truth[:, :, :3], toks, S),
                    "3 experts per token", "topk 4")
        self.refuse(lambda: ad.from_megatron_inference(truth.astype(np.float32), toks, S),
                    "float32", "integers")
        none = types.SimpleNamespace(routing_indices=None, prompt_tokens=[1], generated_tokens=[])
        self.refuse(lambda: ad.from_megatron_inference(none, None, S), "moe_enable_routing_replay")
        bad = megatron_serialized(req)
        bad["routing_indices"] = ["ndarray", {"data": truth.tolist(), "dtype": "float16"}]
        self.refuse(lambda: ad.from_megatron_inference(bad, None, S), "not an integer dtype")
        bad["routing_indices"] = ["blob", {}]
        self.refuse(lambda: ad.from_megatron_inference(bad, None, S), "'blob'")
        ragged = megatron_serialized(req, "list")
        ragged["routing_indices"][2] = ragged["routing_indices"][2][:-1]
        self.refuse(lambda: ad.from_megatron_inference(ragged, None, S), "rectangular")
        self.refuse(lambda: ad.from_megatron_inference({"text": "x"}, toks, S),
                    "neither routing_indices nor moe_topk_indices")
        self.refuse(lambda: ad.from_megatron_inference(megatron_completions(req), None, S,
                                                       choice_index=1), "choice_index is 1")
        self.refuse(lambda: ad.from_megatron_inference(truth, None, S), "pass tokens")
        self.refuse(lambda: ad.from_megatron_inference(truth, toks, ModelSpec("d", 6)), "dense")


# -- TensorRT-LLM ---------------------------------------------------------------
# CompletionOutput.routed_experts: (seq_len - 1, num_moe_layers, top_k), int16.

def trtllm_request_output(p, g, seed=0, as_tensor=True, full=False):
    truth = eng.routed(p + g - 1, S, seed=seed)
    arr = (truth if full else eng.compact(truth, S)).astype(np.int16)
    if as_tensor:
        arr = torch.from_numpy(arr)
    toks = eng.tokens(p + g, seed=seed + 1)
    comp = types.SimpleNamespace(index=0, text="", token_ids=toks[p:].tolist(),
                                 finish_reason="length", routed_experts=arr)
    out = types.SimpleNamespace(request_id=1, prompt_token_ids=toks[:p].tolist(),
                                outputs=[comp], finished=True)
    return out, toks, truth


class TensorRTLLM(Base):
    @needs_torch
    def test_cpu_tensor_is_viewed(self):
        out, toks, truth = trtllm_request_output(7, 9)
        got = ad.from_trtllm_output(out, None, S)
        self.assertRows(got, truth, 0)
        self.assertEqual(got.array.dtype, np.int16)
        self.assertTrue(np.shares_memory(got.array, out.outputs[0].routed_experts.numpy()))
        self.assertRows(ad.from_trtllm_output(out.outputs[0], toks, S), truth, 0)
        self.assertRows(ad.from_trtllm_output(out, len(toks), S), truth, 0)

    def test_numpy_full_axis_and_second_completion(self):
        out, toks, truth = trtllm_request_output(3, 5, seed=2, as_tensor=False, full=True)
        other, _, truth2 = trtllm_request_output(3, 5, seed=8, as_tensor=False)
        out.outputs.append(other.outputs[0])
        out.outputs[1].token_ids = toks[3:].tolist()
        self.assertRows(ad.from_trtllm_output(out, None, S), truth, 0)
        self.assertRows(ad.from_trtllm_output(out, None, S, index=1), truth2, 0)

    def test_refusals(self):
        out, toks, truth = trtllm_request_output(4, 4, as_tensor=False)
        comp = out.outputs[0]
        self.refuse(lambda: ad.from_trtllm_output(out, toks[:-2], S), "7 rows", "6 tokens")
        self.refuse(lambda: ad.from_trtllm_output(out, None, S, index=1), "1 completions",
                    "index is 1")
        self.refuse(lambda: ad.from_trtllm_output(comp, None, S), "pass tokens")
        comp.routed_experts = None
        self.refuse(lambda: ad.from_trtllm_output(out, None, S), "Router Replay")
        self.refuse(lambda: ad.from_trtllm_output(eng.compact(truth, S)[:, :3], toks, S),
                    "3 layers", "num_layers 6")
        self.refuse(lambda: ad.from_trtllm_output(eng.compact(truth, S)[:, :, :2], toks, S),
                    "2 experts per token")
        self.refuse(lambda: ad.from_trtllm_output(truth.astype(np.float64), toks, S), "float64")
        if torch is not None:
            f = torch.zeros((7, 4, 4), dtype=torch.bfloat16)
            self.refuse(lambda: ad.from_trtllm_output(f, toks, S), "bfloat16", "integers")


# -- vLLM int16 capture taken on the device -------------------------------------
# CompletionOutput.routed_experts: int16 [seq_len - 1, num_layers, top_k], -1 = missing.

def vllm_device_output(p, g, seed=0, missing=(), device=None, as_numpy=False):
    truth = eng.routed(p + g - 1, S, seed=seed, missing=missing).astype(np.int16)
    arr = truth.copy() if as_numpy else torch.from_numpy(truth.copy())
    if device is not None:
        arr = arr.to(device)
    toks = eng.tokens(p + g, seed=seed + 1)
    comp = types.SimpleNamespace(index=0, text="", token_ids=toks[p:].tolist(), routed_experts=arr)
    out = types.SimpleNamespace(request_id="r", prompt_token_ids=toks[:p].tolist(), outputs=[comp])
    return out, toks, truth


class VllmDeviceCapture(Base):
    @needs_torch
    def test_cpu_tensor_viewed_int16_kept_with_missing_rows(self):
        out, toks, truth = vllm_device_output(10, 6, missing=(0, 3))
        got = ad.from_vllm_device_capture(out, None, S)
        self.assertRows(got, truth, 0)
        self.assertEqual(got.array.dtype, np.int16)
        self.assertTrue(np.shares_memory(got.array, out.outputs[0].routed_experts.numpy()))
        self.assertTrue((got.array[3, M, :] == -1).all())
        s = Sample("v", toks, *got)
        s.check(S)
        self.assertEqual(narrow_routed_experts(s.routed_experts, S).dtype, np.int16)

    def test_numpy_prompt_start_and_completion_output(self):
        n, st = 30, 11
        truth = eng.routed(n - 1, S, seed=3).astype(np.int16)
        comp = types.SimpleNamespace(routed_experts=truth[st:].copy())
        got = ad.from_vllm_device_capture(comp, eng.tokens(n), S, prompt_start=st)
        self.assertRows(got, truth[st:], st)
        self.assertTrue(np.shares_memory(got.array, comp.routed_experts))
        self.assertRows(ad.from_vllm_device_capture(eng.compact(truth, S), n, S), truth, 0)

    @unittest.skipIf(torch is None or not torch.cuda.is_available(), "no CUDA device")
    def test_cuda_tensor_copied_to_host_once(self):
        out, toks, truth = vllm_device_output(8, 8, missing=(2,), device="cuda")
        got = ad.from_vllm_device_capture(out, None, S)
        self.assertIsInstance(got.array, np.ndarray)
        self.assertEqual(got.array.dtype, np.int16)
        self.assertRows(got, truth, 0)

    def test_refusals(self):
        out, toks, truth = vllm_device_output(5, 5, as_numpy=True)
        comp = out.outputs[0]
        self.refuse(lambda: ad.from_vllm_device_capture(truth.astype(np.int32), toks, S),
                    "dtype int32", "expected int16", "from_vllm_output")
        self.refuse(lambda: ad.from_vllm_device_capture(truth.astype(np.float32), toks, S),
                    "float32", "expected int16")
        self.refuse(lambda: ad.from_vllm_device_capture(out, toks[:-3], S), "9 rows", "7 tokens")
        self.refuse(lambda: ad.from_vllm_device_capture(truth[:, :5], toks, S), "5 layers")
        self.refuse(lambda: ad.from_vllm_device_capture(truth[0], toks, S), "[rows, layers, topk]")
        self.refuse(lambda: ad.from_vllm_device_capture(comp, None, S), "pass tokens")
        comp.routed_experts = None
        self.refuse(lambda: ad.from_vllm_device_capture(out, None, S),
                    "enable_return_routed_experts")
        if torch is not None:
            t = torch.from_numpy(truth.astype(np.int32))
            self.refuse(lambda: ad.from_vllm_device_capture(t, toks, S), "dtype int32")

    def test_torch_stays_optional(self):
        code = ("import sys; sys.modules['torch'] = None\n"
                "import numpy as np, rollpack\n"
                "from rollpack import adapters as ad\n"
                "spec = rollpack.ModelSpec('m', num_layers=2, num_experts=8, topk=2)\n"
                "a = np.zeros((4, 2, 2), np.int16); a[..., 1] = 1\n"
                "got = ad.from_vllm_device_capture(a, 5, spec)\n"
                "assert np.shares_memory(got.array, a) and got.array.dtype == np.int16\n"
                "print('ok')\n")
        env = dict(os.environ)
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        if os.environ.get("ROLLPACK_TEST_INSTALLED") != "1":
            env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "ok")


# -- SGLang per-turn slices -------------------------------------------------------
# Turn t returns meta_info.routed_experts = rows [routed_experts_start_len, n_t - 1).

def sglang_conversation(lengths, seed=0):
    """Token sequences of a conversation whose turn t has lengths[t] tokens in
    all, and the truth [n_last - 1, N, K] (a turn routes its tokens as the
    last turn does: a deterministic engine)."""
    toks = eng.tokens(lengths[-1], seed=seed + 1)
    truth = eng.routed(lengths[-1] - 1, S, seed=seed)
    return [toks[:n] for n in lengths], truth


def sglang_turns(seqs, truth, starts, echo=True, dtype=None):
    turns = []
    for toks, s in zip(seqs, starts):
        meta = eng.sglang_meta_info(truth[s:len(toks) - 1], s, dtype=dtype)
        if echo:
            turns.append((meta, toks))
        else:
            del meta["routed_experts_start_len"]
            turns.append((meta, toks, s))
    return turns


class SGLangTurns(Base):
    def test_three_turns_assemble_into_one_sample(self):
        lengths = [12, 20, 31]
        seqs, truth = sglang_conversation(lengths)
        starts = [0, lengths[0] - 1, lengths[1] - 1]
        got = ad.from_sglang_turns(sglang_turns(seqs, truth, starts), S)
        self.assertRows(got, truth, 0)
        self.assertEqual(got.array.shape, (lengths[-1] - 1, S.num_layers, S.topk))
        s = Sample("mt", seqs[-1], *got)
        s.check(S)

    def test_start_len_passed_per_turn_compact_and_whole_responses(self):
        lengths = [6, 15]
        seqs, truth = sglang_conversation(lengths, seed=4)
        comp = eng.compact(truth, S)
        turns = [({"meta_info": eng.sglang_meta_info(comp[:5])}, seqs[0]),
                 ({"text": "", "meta_info": eng.sglang_meta_info(comp[5:14], 5)}, seqs[1])]
        self.assertRows(ad.from_sglang_turns(turns, S), truth, 0)
        t2 = sglang_turns(seqs, truth, [0, 5], echo=False, dtype=np.int16)
        self.assertRows(ad.from_sglang_turns(t2, S), truth, 0)
        # A /v1/chat/completions choice carries the field in sgl_ext.
        chat = [({"index": 0, "sgl_ext": m}, t) for m, t in sglang_turns(seqs, truth, [0, 5])]
        self.assertRows(ad.from_sglang_turns(chat, S), truth, 0)

    def test_one_turn_is_a_view(self):
        seqs, truth = sglang_conversation([9])
        got = ad.from_sglang_turns(sglang_turns(seqs, truth, [0]), S)
        self.assertRows(got, truth, 0)
        self.assertFalse(got.array.flags.owndata)

    def test_identical_overlap_when_allowed(self):
        lengths = [10, 18, 25]
        seqs, truth = sglang_conversation(lengths, seed=2)
        # Turn 1 asked for less than it could (start 4), turn 2 came from a
        # build that ignores start_len (rows from 0): identical copies.
        turns = sglang_turns(seqs, truth, [0, 4, 17])
        turns[2] = (eng.sglang_meta_info(truth[:24], 17), seqs[2])
        self.refuse(lambda: ad.from_sglang_turns(turns, S), "turn 1", "token 4", "9",
                    "allow_identical_overlap")
        self.assertRows(ad.from_sglang_turns(turns, S, allow_identical_overlap=True), truth, 0)

    def test_refusals(self):
        lengths = [10, 18, 25]
        seqs, truth = sglang_conversation(lengths, seed=7)
        # Gap: turn 1 asked for start_len = n_0 (10) instead of n_0 - 1: token 9's row is lost.
        gap = sglang_turns(seqs, truth, [0, 10, 17])
        self.refuse(lambda: ad.from_sglang_turns(gap, S), "turn 1", "start at token 10",
                    "end at 9", "[9, 10) are missing")
        # Overlapping rows that differ (a non-deterministic recompute).
        diff = truth.copy()
        diff[6, M[2], :] = np.roll(diff[6, M[2], :], 1)
        turns = sglang_turns(seqs, truth, [0, 5, 17])
        turns[1] = (eng.sglang_meta_info(diff[5:17], 5), seqs[1])
        self.refuse(lambda: ad.from_sglang_turns(turns, S, allow_identical_overlap=True),
                    "turn 1 disagrees", "token 6", "layer %d" % M[2])
        # Tokens that do not extend the previous turn's.
        other = [seqs[0], seqs[1].copy(), seqs[2]]
        other[1][3] += 1
        self.refuse(lambda: ad.from_sglang_turns(sglang_turns(other, truth, [0, 9, 17]), S),
                    "turn 1", "token 3", "must extend")
        shorter = [seqs[1], seqs[0]]
        self.refuse(lambda: ad.from_sglang_turns(sglang_turns(shorter, truth, [0, 17]), S),
                    "turn 1 has 10 tokens", "fewer")
        # Layer axes that differ between turns.
        mixed = sglang_turns(seqs, truth, [0, 9, 17])
        mixed[1] = (eng.sglang_meta_info(eng.compact(truth[9:17], S), 9), seqs[1])
        self.refuse(lambda: ad.from_sglang_turns(mixed, S), "turn 1 has 4 layers", "turn 0 has 6")
        # A turn whose own payload does not fit is named.
        short = sglang_turns(seqs, truth, [0, 9, 17])
        short[2] = (eng.sglang_meta_info(truth[17:22], 17), seqs[2])
        self.refuse(lambda: ad.from_sglang_turns(short, S), "SGLang turn 2", "start_len 17")
        self.refuse(lambda: ad.from_sglang_turns([], S), "no turns")
        self.refuse(lambda: ad.from_sglang_turns([(short[0][0],)], S), "turn 0 must be")


class Exports(unittest.TestCase):
    def test_one_import_path(self):
        for name in ("from_megatron_inference", "from_trtllm_output", "from_vllm_device_capture",
                     "from_sglang_turns", "from_vllm_output", "from_vllm_choice",
                     "from_vllm_v021_response", "from_sglang_meta_info", "from_ndarray_dict",
                     "decode_npy", "parse_dtype", "RoutedExperts"):
            self.assertIn(name, ad.__all__)
            self.assertTrue(callable(getattr(ad, name)))
        from rollpack.adapters import megatron, sglang, trtllm, vllm
        self.assertIs(ad.from_trtllm_output, trtllm.from_trtllm_output)
        self.assertIs(ad.from_megatron_inference, megatron.from_megatron_inference)
        self.assertIs(ad.from_sglang_turns, sglang.from_sglang_turns)
        self.assertIs(ad.from_vllm_device_capture, vllm.from_vllm_device_capture)


if __name__ == "__main__":
    unittest.main()
