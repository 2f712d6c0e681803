"""Ragged token fields on Sample (layout.md section 13) and the sampling-mask
adapters for vLLM's and SGLang's formats."""

import os
import subprocess
import sys
import types
import unittest

import numpy as np

from rollpack import ModelSpec, PayloadError, Producer, Sample
from rollpack import adapters as ad
from rollpack import ndarray as nd
from rollpack._proto import scheduler_pb2, trainer_pb2
from rollpack.ragged import Ragged
from tests.server_case import ServerTest

SPEC = ModelSpec("m", num_layers=2, num_experts=4, topk=1, vocab_size=1000)
SPEC_BIG_VOCAB = ModelSpec("m", num_layers=2, num_experts=4, topk=1, vocab_size=151936)
SPEC_NO_VOCAB = ModelSpec("m", num_layers=2, num_experts=4, topk=1)

PROMPT = [11, 12, 13]
GENERATED = [21, 22]
TOKENS = np.array(PROMPT + GENERATED, dtype=np.int32)
LISTS = [[21, 5, 9], [22]]  # the kept ids of each generated token


def routed(n):
    """Rows for tokens [0, n - 1) of the 2-layer top-1 model, no layer all zero."""
    return ((np.arange(n - 1)[:, None, None] + np.arange(2)[None, :, None] + 1) % 4).astype(
        np.uint8)


def mask_field(pb, name="sampling_mask"):
    field = pb.ragged_token_fields[name]
    return nd.from_proto(field.values), nd.from_proto(field.offsets)


class RaggedFields(unittest.TestCase):
    def test_values_and_offsets_go_on_the_wire_in_the_narrow_dtype(self):
        values = np.array([21, 5, 9, 22], np.int32)
        offsets = np.array([0, 0, 0, 0, 3, 4], np.int64)
        s = Sample("a", TOKENS, routed(5), ragged_token_fields={"sampling_mask": (values,
                                                                                   offsets)})
        self.assertTrue(np.shares_memory(s.ragged_token_fields["sampling_mask"].values, values))
        v, o = mask_field(s.to_proto(SPEC))
        self.assertEqual(v.dtype, np.uint16)  # vocab_size 1000 <= 65536
        self.assertEqual(o.dtype, np.int64)
        np.testing.assert_array_equal(v, values)
        np.testing.assert_array_equal(o, offsets)
        v, o = mask_field(s.to_proto(SPEC_BIG_VOCAB))
        self.assertEqual(v.dtype, np.int32)
        v, _ = mask_field(s.to_proto(SPEC_NO_VOCAB))
        self.assertEqual(v.dtype, np.int32)

    def test_int32_offsets_and_uint16_values_are_kept_other_integers_converted(self):
        s = Sample("a", [1, 2], routed(2), ragged_token_fields={
            "m": (np.array([7], np.uint16), np.array([0, 1, 1], np.int32))})
        self.assertEqual(s.ragged_token_fields["m"].values.dtype, np.uint16)
        self.assertEqual(s.ragged_token_fields["m"].offsets.dtype, np.int32)
        s = Sample("b", [1, 2], routed(2), ragged_token_fields={
            "m": (np.array([7], np.int64), np.array([0, 1, 1], np.uint8))})
        self.assertEqual(s.ragged_token_fields["m"].values.dtype, np.int32)
        self.assertEqual(s.ragged_token_fields["m"].offsets.dtype, np.int64)
        s = Sample("c", [1, 2], routed(2), ragged_token_fields={"m": ([], [0, 0, 0])})
        self.assertEqual(s.ragged_token_fields["m"].values.size, 0)

    def test_the_servers_rules_are_checked_naming_the_token_and_value(self):
        def refused(field, n=3, spec=SPEC):
            with self.assertRaises(PayloadError) as cm:
                Sample("s", list(range(1, n + 1)), routed(n),
                       ragged_token_fields={"sampling_mask": field}).to_proto(spec)
            return str(cm.exception)

        self.assertIn("offsets has 3 entries; one list per token needs n + 1 = 4",
                      refused(([1], [0, 0, 1])))
        self.assertIn("offsets[0] is 1, must be 0", refused(([1, 2], [1, 1, 2, 2])))
        self.assertIn("offsets[2] is 1, below offsets[1] = 2 (token 1's list)",
                      refused(([1, 2], [0, 2, 1, 2])))
        self.assertIn("offsets end at 1, values holds 2", refused(([1, 2], [0, 1, 1, 1])))
        self.assertIn("token 2 holds id -4; ids are never negative",
                      refused((np.array([1, -4], np.int32), [0, 0, 1, 2])))
        self.assertIn("token 1 holds id -4", refused((np.array([-4], np.int64), [0, 0, 1, 1])))
        self.assertIn("token 2 holds id 1000, outside [0, 1000) (vocab_size)",
                      refused(([3, 1000], [0, 1, 1, 2])))
        self.assertIn("must be integers", refused((np.array([1.5]), [0, 1, 1, 1])))
        self.assertIn("(values, offsets) pair", refused([[1], [2], [3]]))
        self.assertIn("sample 's': ragged_token_fields['sampling_mask']", refused(([1], [0, 1])))
        self.assertIn("repeats id 5 in the list of token 1: a sampling mask holds each kept id "
                      "once", refused(([3, 9, 5, 2, 5], [0, 1, 5, 5])))
        # The same ids in two tokens' lists are no repeat.
        Sample("s", [1, 2, 3], routed(3),
               ragged_token_fields={"sampling_mask": ([5, 5, 5], [0, 1, 2, 3])}).to_proto(SPEC)
        with self.assertRaises(PayloadError) as cm:
            Sample("s", [1, 2], routed(2), token_fields={"x": np.zeros(2, np.float32)},
                   ragged_token_fields={"x": ([], [0, 0, 0])})
        self.assertIn("'x' is both a token field and a ragged token field", str(cm.exception))

    def test_a_piece_carries_the_lists_of_its_own_tokens(self):
        s = Sample("a", [22], None, piece=1, partial=True,
                   ragged_token_fields={"sampling_mask": ([22, 4], [0, 2])})
        v, o = mask_field(s.to_proto(SPEC))
        np.testing.assert_array_equal(o, [0, 2])
        np.testing.assert_array_equal(v, [22, 4])

    def test_extend_appends_or_replaces_the_lists(self):
        s = Sample("a", [1, 2, 3], routed(3), ragged_token_fields={"m": ([2, 3], [0, 0, 1, 2])})
        s.extend([1, 2, 3, 4, 5], routed(5), 0, ragged_token_fields={"m": ([4, 5, 6], [0, 0, 3])})
        np.testing.assert_array_equal(s.ragged_token_fields["m"].values, [2, 3, 4, 5, 6])
        np.testing.assert_array_equal(s.ragged_token_fields["m"].offsets, [0, 0, 1, 2, 2, 5])
        s.extend([1, 2, 3, 4, 5, 6], routed(6), 0,
                 ragged_token_fields={"m": ([9], [0, 0, 0, 0, 0, 0, 1])})
        np.testing.assert_array_equal(s.ragged_token_fields["m"].offsets, [0, 0, 0, 0, 0, 0, 1])
        with self.assertRaises(PayloadError) as cm:
            s.extend([1, 2, 3, 4, 5, 6, 7], routed(7), 0)
        self.assertIn("ragged_token_fields['m'] is held", str(cm.exception))

    def test_model_spec_carries_vocab_size(self):
        self.assertEqual(ModelSpec.from_proto(SPEC.to_proto()).vocab_size, 1000)
        self.assertEqual(ModelSpec.from_dict(SPEC.to_dict()), SPEC)
        self.assertNotIn("vocab_size", SPEC_NO_VOCAB.to_dict())
        with self.assertRaises(ValueError) as cm:
            ModelSpec("m", num_layers=2, vocab_size=-1)
        self.assertIn("vocab_size is -1, must be >= 0", str(cm.exception))


# vLLM's outputs, as its Python API and HTTP server give them.
def csr_mask(lists):
    ids = [t for row in lists for t in row]
    offsets = np.cumsum([0] + [len(r) for r in lists]).tolist()
    return types.SimpleNamespace(token_ids=ids, offsets=offsets)


def completion(mask, token_ids=GENERATED):
    return types.SimpleNamespace(token_ids=list(token_ids), sampling_mask=mask,
                                 routed_experts=None)


class VllmSamplingMask(unittest.TestCase):
    def expect_placed(self, field):
        self.assertIsInstance(field, Ragged)
        np.testing.assert_array_equal(field.values, [21, 5, 9, 22])
        np.testing.assert_array_equal(field.offsets, [0, 0, 0, 0, 3, 4])

    def test_every_form_vllm_gives(self):
        lists_mask = types.SimpleNamespace(token_ids=LISTS)
        request_output = types.SimpleNamespace(outputs=[completion(csr_mask(LISTS))])
        for output in (csr_mask(LISTS), lists_mask, completion(csr_mask(LISTS)),
                       completion(lists_mask), request_output,
                       {"index": 0, "token_ids": GENERATED, "sampling_mask": LISTS},
                       {"token_ids": [21, 5, 9, 22], "offsets": [0, 3, 4]}, LISTS):
            with self.subTest(output=output):
                self.expect_placed(ad.from_vllm_sampling_mask(output, TOKENS))

    def test_a_sample_built_from_it(self):
        out = completion(csr_mask(LISTS))
        s = Sample("a", TOKENS, routed(5), ragged_token_fields={
            "sampling_mask": ad.from_vllm_sampling_mask(out, TOKENS)})
        v, o = mask_field(s.to_proto(SPEC))
        np.testing.assert_array_equal(v, [21, 5, 9, 22])
        np.testing.assert_array_equal(o, [0, 0, 0, 0, 3, 4])

    def test_n_instead_of_tokens_skips_the_membership_check(self):
        field = ad.from_vllm_sampling_mask([[1], [2]], 4)
        np.testing.assert_array_equal(field.offsets, [0, 0, 0, 1, 2])

    def test_what_does_not_fit_is_refused(self):
        def refused(output, tokens=TOKENS, **kw):
            with self.assertRaises(PayloadError) as cm:
                ad.from_vllm_sampling_mask(output, tokens, **kw)
            return str(cm.exception)

        self.assertIn("--return-sampling-mask", refused(completion(None)))
        self.assertIn("3 lists for 2 generated tokens",
                      refused(completion(types.SimpleNamespace(token_ids=LISTS + [[1]]))))
        self.assertIn("has 6 lists (one per generated token) but the sample has 5 tokens",
                      refused([[1]] * 6))
        self.assertIn("generated token 1 (position 4, id 22) is not in its own list",
                      refused([[21], [5, 6]]))
        self.assertIn("last 2 tokens are not the generated ones",
                      refused(completion(types.SimpleNamespace(token_ids=LISTS),
                                         token_ids=[21, 23])))
        self.assertIn("ids lie in [0, 2^31)", refused([[21], [-1]]))
        self.assertIn("offsets end at 5, values holds 4",
                      refused(types.SimpleNamespace(token_ids=[21, 5, 9, 22], offsets=[0, 3, 5])))
        self.assertIn("one list of token ids per generated token", refused("nope"))
        # Shifted by one: caught by the membership check, not without it.
        self.assertIn("not in its own list", refused([[22], [21, 5, 9]]))
        ad.from_vllm_sampling_mask([[22], [21, 5, 9]], TOKENS, check_sampled=False)

    def test_empty_lists_are_allowed_on_generated_tokens(self):
        field = ad.from_vllm_sampling_mask([[], [22]], TOKENS)
        np.testing.assert_array_equal(field.offsets, [0, 0, 0, 0, 0, 1])

    def test_prime_rl_ids_and_counts(self):
        mask = types.SimpleNamespace(ids=np.array([21, 5, 9, 22], np.int32),
                                     counts=np.array([3, 1], np.int32))
        self.expect_placed(ad.from_vllm_sampling_mask(mask, TOKENS))


class SglangSamplingMask(unittest.TestCase):
    META = {"id": "rid", "output_token_sampling_mask": LISTS,
            "output_token_sampling_logprobs": [-0.5, 0.0], "output_token_sampling_mask_length": 2}

    def test_generate_item_chat_choice_meta_info_and_lists(self):
        for output in ({"text": "x", "output_ids": GENERATED, "meta_info": self.META},
                       {"index": 0, "token_ids": GENERATED, "meta_info": self.META},
                       self.META, LISTS):
            with self.subTest(output=output):
                field = ad.from_sglang_sampling_mask(output, TOKENS)
                np.testing.assert_array_equal(field.values, [21, 5, 9, 22])
                np.testing.assert_array_equal(field.offsets, [0, 0, 0, 0, 3, 4])

    def test_what_does_not_fit_is_refused(self):
        def refused(output, tokens=TOKENS):
            with self.assertRaises(PayloadError) as cm:
                ad.from_sglang_sampling_mask(output, tokens)
            return str(cm.exception)

        self.assertIn("return_sampling_mask: true", refused({"meta_info": {"id": "x"}}))
        self.assertIn("output_token_sampling_mask_length says 3",
                      refused(dict(self.META, output_token_sampling_mask_length=3)))
        self.assertIn("has 2 lists for 3 generated tokens",
                      refused({"output_ids": [13, 21, 22], "meta_info": self.META}))
        self.assertIn("is not in its own list", refused([[21], [23]]))


class RoundTrip(ServerTest):
    """Through a real rollpackd: what a trainer rank is sent is what was put."""

    def fetch(self, pool, sample_id, step):
        topo = scheduler_pb2.Topology(dp=1, cp=1, tp=1, pp=1, max_tokens_per_rank=1 << 16)
        self.sched.CreateStep(scheduler_pb2.CreateStepRequest(
            step_id=step, pool=pool, sample_ids=[sample_id], topology=topo), timeout=30)
        mbs = list(self.trainer.FetchMicrobatches(trainer_pb2.FetchRequest(
            step_id=step, rank=trainer_pb2.RankCoords(), all_fields=True), timeout=30))
        self.sched.ReleaseStep(scheduler_pb2.ReleaseStepRequest(step_id=step), timeout=30)
        self.assertEqual(len(mbs), 1)
        field = mbs[0].ragged_token_fields["sampling_mask"]
        return nd.from_proto(field.values), nd.from_proto(field.offsets)

    def test_a_whole_sample_and_one_sent_in_pieces(self):
        p = Producer(self.d.address, "masks", timeout=30)
        self.addCleanup(p.close)
        p.register_model(SPEC)
        out = completion(csr_mask(LISTS))
        p.put(Sample("whole", TOKENS, routed(5), ragged_token_fields={
            "sampling_mask": ad.from_vllm_sampling_mask(out, TOKENS)}))
        values, offsets = self.fetch("masks", "whole", "s1")
        self.assertEqual(values.dtype, np.uint16)  # vocab_size 1000
        np.testing.assert_array_equal(values, [21, 5, 9, 22])
        np.testing.assert_array_equal(offsets[:6], [0, 0, 0, 0, 3, 4])
        self.assertEqual(int(offsets[-1]), 4)  # padding rows, if any: empty lists

        r = p.rollout("pieces")
        r.append(TOKENS, routed(5), ragged_token_fields={
            "sampling_mask": ad.from_vllm_sampling_mask(out, TOKENS)})
        r.seal([7, 31], routed(3), 4, ragged_token_fields={
            "sampling_mask": ([31, 2], [0, 0, 2])})
        values, offsets = self.fetch("masks", "pieces", "s2")
        np.testing.assert_array_equal(values, [21, 5, 9, 22, 31, 2])
        np.testing.assert_array_equal(offsets[:8], [0, 0, 0, 0, 3, 4, 4, 6])

        # The pool says which ragged fields it carries, and `rollpack pool show` prints them.
        self.assertEqual(list(p.pool_info().ragged_token_fields), ["sampling_mask"])
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        shown = subprocess.run([sys.executable, "-m", "rollpack", "pool", "show", "masks",
                                "--server", self.d.address], capture_output=True, text=True,
                               env=env, timeout=120)
        self.assertEqual(shown.returncode, 0, shown.stderr)
        self.assertIn("token fields  sampling_mask ragged", shown.stdout)


if __name__ == "__main__":
    unittest.main()
