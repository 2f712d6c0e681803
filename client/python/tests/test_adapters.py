"""Engine adapters: golden payloads in each engine's format -> (array, offset).

Run: PYTHONPATH=client/python /usr/bin/python3 -m unittest -v tests.test_adapters
(from client/python).
"""

import base64
import unittest

import numpy as np

from rollpack import ModelSpec, PayloadError, Sample
from rollpack import adapters as ad
from tests import engines as eng

S = eng.SMALL  # N=6, M=[1,2,4,5], E=16, K=4


class Base(unittest.TestCase):
    def assertRows(self, got, truth, offset, spec=S):
        arr, off = got
        self.assertEqual(off, offset)
        self.assertEqual(arr.shape[2], spec.topk)
        m = list(spec.resolved_moe_layers)
        if arr.shape[1] == spec.num_layers:
            arr = arr[:, m, :]
        if truth.shape[1] == spec.num_layers:
            truth = truth[:, m, :]
        np.testing.assert_array_equal(np.asarray(arr, dtype=np.int64), truth.astype(np.int64))

    def refuse(self, fn, *words):
        with self.assertRaises(PayloadError) as cm:
            fn()
        msg = str(cm.exception)
        for w in words:
            self.assertIn(w, msg)
        return msg


class VllmOutput(Base):
    def test_full_layout_n_minus_1_rows_is_a_view(self):
        n = 20
        truth = eng.routed(n - 1, S)
        out = eng.vllm_output(truth)
        got = ad.from_vllm_output(out, eng.tokens(n), S)
        self.assertRows(got, truth, 0)
        self.assertTrue(np.shares_memory(got.array, out.routed_experts))

    def test_request_output_and_plain_array_and_n_rows(self):
        n = 9
        truth = eng.routed(n, S)
        ro = type("RequestOutput", (), {"outputs": [eng.vllm_output(truth)]})()
        self.assertRows(ad.from_vllm_output(ro, n, S), truth, 0)
        self.assertRows(ad.from_vllm_output(truth, n, S), truth, 0)

    def test_compact_axis_and_prompt_start(self):
        n, s = 30, 12
        truth = eng.routed(n - 1, S)
        self.assertRows(ad.from_vllm_output(eng.compact(truth[s:], S), n, S, prompt_start=s),
                        truth[s:], s)

    def test_refusals(self):
        n = 10
        truth = eng.routed(n - 1, S)
        self.refuse(lambda: ad.from_vllm_output(truth[:, :5], n, S), "5 layers", "num_layers 6",
                    "4 MoE layers")
        self.refuse(lambda: ad.from_vllm_output(truth[:, :, :3], n, S), "3 experts per token",
                    "topk 4")
        self.refuse(lambda: ad.from_vllm_output(truth[:-2], n, S), "7 rows", "10 tokens")
        self.refuse(lambda: ad.from_vllm_output(np.zeros((n, 6, 4)), n, S), "float64")
        self.refuse(lambda: ad.from_vllm_output(type("C", (), {"routed_experts": None})(), n, S),
                    "enable_return_routed_experts")
        self.refuse(lambda: ad.from_vllm_output(truth, n, eng.ModelSpec("d", num_layers=6)),
                    "dense")
        self.refuse(lambda: ad.from_vllm_output(truth[0], n, S), "[rows, layers, topk]")


class Vllm021(Base):
    def test_prompt_shared_by_n_choices(self):
        p, outs = 7, [5, 9, 1]
        prompt_rows = eng.routed(p, S, seed=3)
        choice_rows = [eng.routed(o - 1, S, seed=10 + i) for i, o in enumerate(outs)]
        resp = eng.vllm021_response(prompt_rows, choice_rows, S)
        for i, o in enumerate(outs):
            got = ad.from_vllm_v021_response(resp, p + o, S, choice_index=i)
            self.assertRows(got, np.concatenate([prompt_rows, choice_rows[i]]), 0)
            self.assertEqual(got.array.shape[1], S.num_moe_layers)  # compact axis

    def test_text_body_and_full_axis(self):
        import json
        p, o = 4, 3
        prompt_rows, comp = eng.routed(p, S, seed=1), eng.routed(o - 1, S, seed=2)
        resp = {"prompt_routed_experts": prompt_rows.tolist(),
                "choices": [{"routed_experts": comp.tolist()}]}
        self.assertRows(ad.from_vllm_v021_response(json.dumps(resp), p + o, S),
                        np.concatenate([prompt_rows, comp]), 0)

    def test_single_token_completion_has_no_rows(self):
        p = 5
        prompt_rows = eng.routed(p, S)
        resp = eng.vllm021_response(prompt_rows, [prompt_rows[:0]], S)
        self.assertRows(ad.from_vllm_v021_response(resp, p + 1, S), prompt_rows, 0)

    def test_refusals(self):
        p, o = 6, 4
        pr, cr = eng.routed(p, S), eng.routed(o - 1, S, seed=4)
        resp = eng.vllm021_response(pr, [cr], S)
        self.refuse(lambda: ad.from_vllm_v021_response(resp, p + o + 3, S), "9 rows", "13 tokens")
        self.refuse(lambda: ad.from_vllm_v021_response(resp, p + o, S, choice_index=1),
                    "1 choices", "choice_index is 1")
        bad = dict(resp, prompt_routed_experts=None)
        self.refuse(lambda: ad.from_vllm_v021_response(bad, p + o, S), "prompt_routed_experts",
                    "missing")
        ragged = dict(resp, prompt_routed_experts=resp["prompt_routed_experts"][:-1] + [[[1, 2]]])
        self.refuse(lambda: ad.from_vllm_v021_response(ragged, p + o, S), "rectangular")
        mixed = dict(resp, prompt_routed_experts=pr.tolist())  # full axis vs compact choice
        self.refuse(lambda: ad.from_vllm_v021_response(mixed, p + o, S), "[rows, 6, 4]",
                    "[rows, 4, 4]")


class VllmChoice(Base):
    def test_npy_from_zero_and_view(self):
        n = 17
        truth = eng.routed(n - 1, S)
        got = ad.from_vllm_choice(eng.vllm_choice(truth), eng.tokens(n), S)
        self.assertRows(got, truth, 0)
        self.assertFalse(got.array.flags.owndata)  # a view of the decoded bytes

    def test_prompt_start_echoed_or_passed(self):
        n, s = 40, 25
        truth = eng.routed(n - 1, S)
        self.assertRows(ad.from_vllm_choice(eng.vllm_choice(truth[s:], s), n, S), truth[s:], s)
        self.assertRows(ad.from_vllm_choice(eng.vllm_choice(truth[s:], s, echo_start=False), n, S,
                                            prompt_start=s), truth[s:], s)

    def test_start_ignored_is_detected_by_row_count(self):
        n, s = 40, 25
        truth = eng.routed(n - 1, S)
        self.assertRows(ad.from_vllm_choice(eng.vllm_choice(truth, s), n, S), truth, 0)

    def test_dtypes_orders_and_compact(self):
        n = 12
        truth = eng.routed(n - 1, S)
        for a in (truth.astype(">i4"), truth.astype(np.int16), np.asfortranarray(truth),
                  eng.compact(truth, S).astype(np.uint8), truth.astype(np.int64)):
            self.assertRows(ad.from_vllm_choice(eng.vllm_choice(a), n, S), truth, 0)

    def test_refusals(self):
        n = 12
        truth = eng.routed(n - 1, S)
        c = eng.vllm_choice(truth)
        self.refuse(lambda: ad.from_vllm_choice(c, n + 2, S), "11 rows", "14 tokens")
        self.refuse(lambda: ad.from_vllm_choice({"index": 0}, n, S), "missing")
        self.refuse(lambda: ad.from_vllm_choice({"routed_experts": "!!!"}, n, S), "base64")
        raw = base64.b64encode(b"not an npy file at all").decode()
        self.refuse(lambda: ad.from_vllm_choice({"routed_experts": raw}, n, S), "NUMPY")
        full = base64.b64decode(c["routed_experts"])
        trunc = base64.b64encode(full[:-8]).decode()
        self.refuse(lambda: ad.from_vllm_choice({"routed_experts": trunc}, n, S), "header says")
        f = eng.vllm_choice(truth.astype(np.float32))
        self.refuse(lambda: ad.from_vllm_choice(f, n, S), "not an integer dtype")
        self.refuse(lambda: ad.from_vllm_choice({"routed_experts": truth.tolist()}, n, S),
                    "0.21 format")
        self.refuse(lambda: ad.from_vllm_choice(eng.vllm_choice(truth[:, :3]), n, S), "3 layers")
        self.refuse(lambda: ad.from_vllm_choice(eng.vllm_choice(truth[3:], 5), n, S), "8 rows")


class SGLang(Base):
    def test_flat_int32_full_layout(self):
        n = 33
        truth = eng.routed(n - 1, S)
        got = ad.from_sglang_meta_info(eng.sglang_meta_info(truth), eng.tokens(n), S)
        self.assertRows(got, truth, 0)
        self.assertEqual(got.array.shape, (n - 1, S.num_layers, S.topk))
        self.assertFalse(got.array.flags.owndata)

    def test_whole_response_start_len_and_dtype(self):
        n, s = 50, 20
        truth = eng.routed(n - 1, S)
        resp = {"text": "", "meta_info": eng.sglang_meta_info(truth[s:], s, dtype=np.int16)}
        self.assertRows(ad.from_sglang_meta_info(resp, n, S), truth[s:], s)
        m = eng.sglang_meta_info(truth[s:], 0)
        del m["routed_experts_start_len"]
        self.assertRows(ad.from_sglang_meta_info(m, n, S, start_len=s), truth[s:], s)

    def test_builds_that_ignore_start_len(self):
        n, s = 50, 20
        truth = eng.routed(n - 1, S)
        m = eng.sglang_meta_info(truth, s)  # asked for s, got everything
        self.assertRows(ad.from_sglang_meta_info(m, n, S), truth, 0)

    def test_compact_flat(self):
        n = 8
        truth = eng.routed(n - 1, S)
        self.assertRows(ad.from_sglang_meta_info(eng.sglang_meta_info(eng.compact(truth, S)), n, S),
                        truth, 0)

    def test_refusals(self):
        n, s = 20, 5
        truth = eng.routed(n - 1, S)
        msg = self.refuse(lambda: ad.from_sglang_meta_info(eng.sglang_meta_info(truth[2:], s), n,
                                                           S), "408 int32 values", "start_len 5")
        self.assertIn(str((n - 1 - s) * 6 * 4), msg)
        self.refuse(lambda: ad.from_sglang_meta_info({"routed_experts": None}, n, S), "missing")
        odd = {"routed_experts": base64.b64encode(b"\x00" * 7).decode()}
        self.refuse(lambda: ad.from_sglang_meta_info(odd, n, S), "multiple")
        self.refuse(lambda: ad.from_sglang_meta_info(
            dict(eng.sglang_meta_info(truth), routed_experts_dtype="float32"), n, S),
            "not an integer dtype")
        self.refuse(lambda: ad.from_sglang_meta_info(eng.sglang_meta_info(truth), n,
                                                     ModelSpec("x", 6, [], 16, 3)), "values")
        self.refuse(lambda: ad.from_sglang_meta_info(eng.sglang_meta_info(truth), n, S,
                                                     start_len=-1), ">= 0")


class NdarrayDict(Base):
    def test_round_trip_dtypes(self):
        n = 14
        truth = eng.routed(n - 1, S)
        for a, name in ((truth, None), (truth.astype(np.int64), "torch.int64"),
                        (eng.compact(truth, S).astype(np.uint8), "uint8"),
                        (truth.astype(np.int16), "torch.int16")):
            got = ad.from_ndarray_dict(eng.ndarray_dict(a, name), eng.tokens(n), S)
            self.assertRows(got, truth, 0)
            self.assertFalse(got.array.flags.owndata)

    def test_2d_shape_and_offset(self):
        n, s = 14, 4
        truth = eng.routed(n - 1, S)
        d = eng.ndarray_dict(truth[s:].reshape(n - 1 - s, -1))
        self.assertRows(ad.from_ndarray_dict(d, n, S, row_offset=s), truth[s:], s)
        d["row_offset"] = s
        self.assertRows(ad.from_ndarray_dict(d, n, S), truth[s:], s)

    def test_refusals(self):
        n = 14
        truth = eng.routed(n - 1, S)
        d = eng.ndarray_dict(truth)
        self.refuse(lambda: ad.from_ndarray_dict({"data": d["data"]}, n, S), "shape, dtype")
        self.refuse(lambda: ad.from_ndarray_dict(dict(d, shape=[n, 6, 4]), n, S), "bytes")
        self.refuse(lambda: ad.from_ndarray_dict(dict(d, dtype="bfloat16x"), n, S), "dtype")
        self.refuse(lambda: ad.from_ndarray_dict(dict(d, dtype="float32"), n, S), "integer")
        self.refuse(lambda: ad.from_ndarray_dict(d, n + 5, S), "13 rows")
        self.refuse(lambda: ad.from_ndarray_dict(dict(d, shape=["a"]), n, S), "integers")


class FeedsSample(Base):
    def test_adapter_output_feeds_sample(self):
        n = 16
        truth = eng.routed(n - 1, S)
        toks = eng.tokens(n)
        s = Sample("a", toks, *ad.from_vllm_choice(eng.vllm_choice(truth), toks, S))
        s.check(S)
        self.assertEqual(s.row_offset, 0)
        self.assertTrue(np.shares_memory(s.tokens, toks))


if __name__ == "__main__":
    unittest.main()
