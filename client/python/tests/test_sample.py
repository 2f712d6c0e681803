"""Sample, ModelSpec, NDArray encoding, narrowing and multi-turn stitching."""

import unittest

import numpy as np

from rollpack import ModelSpec, PayloadError, Sample
from rollpack import adapters as ad
from rollpack import ndarray as nd
from tests import engines as eng

S, W, A = eng.SMALL, eng.WIDE, eng.ALL_MOE


def decode(pb):
    return nd.from_proto(pb)


class Spec(unittest.TestCase):
    def test_rules_match_the_server(self):
        for kw, words in (
                (dict(num_layers=0), "num_layers is 0"),
                (dict(num_layers=4, moe_layers=[1, 4], num_experts=8, topk=2), "moe_layers[1] is 4"),
                (dict(num_layers=4, moe_layers=[2, 1], num_experts=8, topk=2), "strictly increasing"),
                (dict(num_layers=4, num_experts=70000, topk=2), "num_experts is 70000"),
                (dict(num_layers=4, num_experts=0, topk=2), "dense"),
                (dict(num_layers=4, num_experts=8, topk=9), "topk is 9")):
            with self.assertRaises(ValueError) as cm:
                ModelSpec("m", **kw)
            self.assertIn(words, str(cm.exception))

    def test_proto_and_dict_round_trip(self):
        for s in (S, W, A, ModelSpec("dense", num_layers=3)):
            self.assertEqual(ModelSpec.from_proto(s.to_proto()), s)
            self.assertEqual(ModelSpec.from_dict(s.to_dict()), s)
        self.assertEqual(A.resolved_moe_layers, (0, 1, 2, 3))
        with self.assertRaises(ValueError):
            ModelSpec.from_dict({"num_layers": 2, "bogus": 1})


class Encode(unittest.TestCase):
    def test_tokens_are_not_copied_when_int32(self):
        t = eng.tokens(10)
        s = Sample("a", t, eng.routed(9, S))
        self.assertTrue(np.shares_memory(s.tokens, t))
        s64 = Sample("b", t.astype(np.int64), eng.routed(9, S))
        self.assertEqual(s64.tokens.dtype, np.int32)

    def test_uint8_narrowing_drops_dense_layers(self):
        n = 11
        truth = eng.routed(n - 1, S)
        pb = Sample("a", eng.tokens(n), truth, token_fields={"logprobs": np.zeros(n, np.float32)},
                    scalars={"reward": 1.5}, group_id="g", policy_version=3).to_proto(S)
        r = decode(pb.routed_experts)
        self.assertEqual(r.dtype, np.uint8)
        self.assertEqual(r.shape, (n - 1, 4, 4))
        np.testing.assert_array_equal(r, eng.compact(truth, S))
        np.testing.assert_array_equal(decode(pb.tokens), eng.tokens(n))
        self.assertEqual(decode(pb.token_fields["logprobs"]).dtype, np.float32)
        self.assertEqual((pb.scalars["reward"], pb.group_id, pb.policy_version), (1.5, "g", 3))

    def test_uint16_for_wide_models_and_int16_with_missing_rows(self):
        n = 9
        truth = eng.routed(n - 1, W)
        r = decode(Sample("a", eng.tokens(n), truth).to_proto(W).routed_experts)
        self.assertEqual(r.dtype, np.uint16)
        np.testing.assert_array_equal(r, eng.compact(truth, W))
        miss = eng.routed(n - 1, S, missing=(2, 5))
        r = decode(Sample("b", eng.tokens(n), miss).to_proto(S).routed_experts)
        self.assertEqual(r.dtype, np.int16)
        np.testing.assert_array_equal(r, eng.compact(miss, S))

    def test_already_narrow_is_sent_as_is(self):
        n = 6
        truth = eng.routed(n - 1, A).astype(np.uint8)
        s = Sample("a", eng.tokens(n), truth)
        r = decode(s.to_proto(A).routed_experts)
        self.assertEqual(r.dtype, np.uint8)
        np.testing.assert_array_equal(r, truth)
        self.assertIs(__import__("rollpack").narrow_routed_experts(truth, A), truth)

    def test_zero_rows_and_dense_model(self):
        s = Sample("a", [5], np.zeros((0, 6, 4), np.int32))
        self.assertEqual(decode(s.to_proto(S).routed_experts).shape, (0, 4, 4))
        d = ModelSpec("d", num_layers=2)
        pb = Sample("b", [1, 2]).to_proto(d)
        self.assertFalse(pb.HasField("routed_experts"))

    def test_refusals(self):
        n = 8
        truth = eng.routed(n - 1, S)
        cases = [
            (lambda: Sample("", [1]), "sample_id"),
            (lambda: Sample("a", []), "empty"),
            (lambda: Sample("a", [[1]]), "1-D"),
            (lambda: Sample("a", [1.5]), "integers"),
            (lambda: Sample("a", [1], truth[0]), "[rows, layers, topk]"),
            (lambda: Sample("a", [1], truth.astype(np.float32)), "integers"),
            (lambda: Sample("a", [1, 2], row_offset=-1), "row_offset"),
            (lambda: Sample("a", [1, 2], token_fields={"x": np.zeros(3)}), "first dimension"),
            (lambda: Sample("a", eng.tokens(n), truth).to_proto(W), "has 6 layers; model 'wide-moe' has num_layers 3"),
            (lambda: Sample("a", eng.tokens(n), truth[:, :, :3]).to_proto(S), "topk is 4"),
            (lambda: Sample("a", eng.tokens(n + 2), truth).to_proto(S), "must end at n = 10"),
            (lambda: Sample("a", eng.tokens(n), truth, 2).to_proto(S), "rows [2, 9)"),
            (lambda: Sample("a", eng.tokens(n)).to_proto(S), "routed_experts is required"),
            (lambda: Sample("a", eng.tokens(n), truth).to_proto(ModelSpec("d", 6)), "dense"),
            (lambda: Sample("a", eng.tokens(n), truth + 16).to_proto(S), "expert id"),
            (lambda: Sample("a", eng.tokens(n), truth - 2).to_proto(S), "holds -2"),
            (lambda: Sample("a", eng.tokens(n), eng.routed(n - 1, W).astype(np.uint8)).to_proto(W),
             "truncated"),
        ]
        for fn, words in cases:
            with self.assertRaises(PayloadError, msg=words) as cm:
                fn()
            self.assertIn(words, str(cm.exception))

    def test_ndarray_codec(self):
        for a in (np.arange(6, dtype=">i4").reshape(2, 3), np.float16([1, 2]), np.uint16(7),
                  np.zeros((0, 2), np.int64), np.arange(10, dtype=np.int32)[::3]):
            b = nd.from_proto(nd.to_proto(a))
            np.testing.assert_array_equal(a, b)
            self.assertEqual(b.dtype.kind + str(b.dtype.itemsize), a.dtype.kind + str(a.dtype.itemsize))
        with self.assertRaises(ValueError):
            nd.to_proto(np.zeros(2, np.complex64))
        pb = nd.to_proto(np.arange(4, dtype=np.int32))
        pb.shape[:] = [5]
        with self.assertRaises(ValueError):
            nd.from_proto(pb)


class Stitch(unittest.TestCase):
    """Multi-turn: turn 2's prompt = turn 1's tokens + new user/tool tokens;
    the engine returns turn 2's rows from a start offset."""

    def setUp(self):
        self.n1, self.n2 = 30, 55
        self.all_tokens = eng.tokens(self.n2)
        self.truth = eng.routed(self.n2 - 1, S, seed=5)  # rows of the final sequence

    def turn1(self):
        t = self.all_tokens[:self.n1]
        return Sample("mt", t, *ad.from_vllm_choice(eng.vllm_choice(self.truth[:self.n1 - 1]), t, S),
                      token_fields={"loss_mask": np.ones(self.n1, np.uint8)})

    def test_extend_from_start_offset(self):
        for start in (self.n1 - 1, 10, 0):
            s = self.turn1()
            payload = eng.vllm_choice(self.truth[start:], start)
            s.extend(self.all_tokens, *ad.from_vllm_choice(payload, self.all_tokens, S),
                     token_fields={"loss_mask": np.zeros(self.n2 - self.n1, np.uint8)})
            self.assertEqual(s.row_offset, 0)
            np.testing.assert_array_equal(s.routed_experts, self.truth)
            self.assertEqual(s.token_fields["loss_mask"].tolist(),
                             [1] * self.n1 + [0] * (self.n2 - self.n1))
            s.check(S)

    def test_extend_mixed_layouts_with_spec(self):
        s = self.turn1()
        later = eng.compact(self.truth[self.n1 - 1:], S)
        s.extend(self.all_tokens, later, self.n1 - 1, spec=S,
                 token_fields={"loss_mask": np.ones(self.n2, np.uint8)})
        np.testing.assert_array_equal(s.routed_experts, eng.compact(self.truth, S))

    def test_refusals(self):
        lm = {"loss_mask": np.ones(self.n2, np.uint8)}
        cases = [
            (lambda s: s.extend(self.all_tokens, self.truth[self.n1 + 1:], self.n1 + 1,
                                token_fields=lm), "start must be within [0, 29]"),
            (lambda s: s.extend(self.all_tokens[:10], self.truth[:9], 0), "fewer than"),
            (lambda s: s.extend(np.concatenate([[7], self.all_tokens[1:]]) + 0,
                                self.truth, 0, token_fields=lm), "position 0"),
            (lambda s: s.extend(self.all_tokens, self.truth[29:], 29), "loss_mask"),
            (lambda s: s.extend(self.all_tokens, self.truth[29:], 29,
                                token_fields={"loss_mask": np.ones(3)}), "expected 55"),
            (lambda s: s.extend(self.all_tokens, eng.compact(self.truth[29:], S), 29,
                                token_fields=lm), "pass spec="),
            (lambda s: s.extend(self.all_tokens, self.truth[29:-3], 29, token_fields=lm),
             "must end at n = 55"),
        ]
        for fn, words in cases:
            s = self.turn1()
            with self.assertRaises(PayloadError, msg=words) as cm:
                fn(s)
            self.assertIn(words, str(cm.exception))
            self.assertEqual(s.num_tokens, self.n1)  # unchanged on refusal


if __name__ == "__main__":
    unittest.main()
