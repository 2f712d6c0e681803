"""Token-field schemas declared at registration (docs/producer.md, "Token-field
schema") against a real rollpackd: producers sending a field in different
numeric dtypes (bool, int64 and int32 masks; float64, float16 and float32
logprobs) all land in the declared dtype, JSONL lists follow the schema,
values that do not fit and undeclared float64 are refused by name."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from rollpack import adapters as ad
from rollpack import errors
from rollpack._proto import ndarray_pb2, trainer_pb2, trainer_pb2_grpc
from rollpack.controller import Controller
from rollpack.jsonl import make_record
from rollpack.producer import Producer
from rollpack.sample import Sample
from tests import engines as eng
from tests.rollpackd import Rollpackd

S = eng.SMALL
SCHEMA = {"token_fields": {"loss_mask": "uint8",
                           "logprobs": {"dtype": "float32", "allow_narrowing": True}}}


def sample(sid, n, mask, logprobs, seed=0):
    toks = eng.tokens(n, seed=seed)
    truth = eng.routed(n - 1, S, seed=seed + 1)
    return Sample(sid, toks, *ad.from_ndarray_dict(eng.ndarray_dict(truth), toks, S),
                  token_fields={"loss_mask": mask, "logprobs": logprobs})


class TokenSchema(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Rollpackd()
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()

    def producer(self, pool):
        p = Producer(self.d.address, pool, timeout=30)
        self.addCleanup(p.close)
        return p

    def test_mixed_dtypes_are_stored_as_declared(self):
        p = self.producer("schema")
        self.assertTrue(p.register_model(S, options=SCHEMA))
        n = 12
        lp = -np.arange(n, dtype=np.float64) / 8
        p.put([
            sample("bool-f64", n, np.arange(n) % 2 == 0, lp, seed=1),
            sample("i64-f16", n, np.ones(n, dtype=np.int64), lp.astype(np.float16), seed=2),
            sample("i32-f32", n, np.zeros(n, dtype=np.int32), lp.astype(np.float32), seed=3),
        ])
        info = p.pool_info()
        self.assertEqual(dict(info.token_field_dtypes),
                         {"loss_mask": ndarray_pb2.UINT8, "logprobs": ndarray_pb2.FLOAT32})
        declared = {f.name: f for f in info.options.token_fields}
        self.assertTrue(declared["logprobs"].allow_narrowing)
        # A trainer gets uint8 masks and float32 logprobs, values intact.
        c = Controller(self.d.address, timeout=30)
        self.addCleanup(c.close)
        c.create_step("schema-step", "schema", num_samples=3,
                      topology={"dp": 1, "max_tokens_per_rank": 1 << 16})
        import grpc
        with grpc.insecure_channel(self.d.address) as ch:
            mbs = list(trainer_pb2_grpc.TrainerStub(ch).FetchMicrobatches(
                trainer_pb2.FetchRequest(step_id="schema-step", all_fields=True), timeout=30))
        masks = [mb.token_fields["loss_mask"] for mb in mbs]
        self.assertTrue(all(m.dtype == ndarray_pb2.UINT8 for m in masks))
        logprobs = np.concatenate([np.frombuffer(mb.token_fields["logprobs"].data, "<f4")
                                   for mb in mbs])
        self.assertTrue(all(mb.token_fields["logprobs"].dtype == ndarray_pb2.FLOAT32 for mb in mbs))
        # Every sample's values, whatever their dtype, in some order (padding is 0).
        self.assertEqual(int((logprobs == np.float32(-11 / 8)).sum()), 3)

    def test_refusals_name_field_token_and_value(self):
        p = self.producer("schema-refusals")
        p.register_model(S, options=SCHEMA)
        n = 6
        mask = np.ones(n, dtype=np.int64)
        mask[4] = 300
        with self.assertRaises(errors.InvalidArgument) as bad:
            p.put([sample("big", n, mask, np.zeros(n, np.float32))])
        self.assertIn('token_fields["loss_mask"] is 300 at token 4 (element 4), outside [0, 255] '
                      "of the pool's uint8", str(bad.exception))
        with self.assertRaises(errors.InvalidArgument) as lossy:
            p.put([sample("float-mask", n, np.ones(n, np.float32), np.zeros(n, np.float32))])
        self.assertIn("is float32, the pool declares uint8", str(lossy.exception))
        # Undeclared pools keep taking what the first sample fixed, but no float64.
        q = self.producer("no-schema")
        q.register_model(S)
        with self.assertRaises(errors.InvalidArgument) as f64:
            q.put([sample("f64", n, np.ones(n, np.uint8), np.zeros(n, np.float64))])
        self.assertIn("is float64, which a pool takes only into a field it declares float32 "
                      "with allow_narrowing", str(f64.exception))
        # Another declaration for the same pool is refused.
        with self.assertRaises(errors.FailedPrecondition):
            p.register_model(S, options={"token_fields": {"loss_mask": "int32"}})

    def test_jsonl_lists_follow_the_schema(self):
        n = 9
        recs = []
        for i in range(3):
            toks = eng.tokens(n, seed=10 + i)
            truth = eng.routed(n, S, seed=20 + i)
            recs.append(make_record(
                "ndarray", "j%d" % i, toks, eng.ndarray_dict(eng.compact(truth, S)),
                token_fields={"loss_mask": [1] * (n - 1) + [0],  # JSON ints: int64
                              "logprobs": [-0.25] * n}))      # JSON floats: float64
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "in.jsonl")
            with open(path, "w") as f:
                for r in recs:
                    f.write(json.dumps(r) + "\n")
            env = dict(os.environ)
            out = subprocess.run(
                [sys.executable, "-m", "rollpack", "put", "--server", self.d.address,
                 "--pool", "jsonl-schema", "--from-jsonl", path, "--model-json", json.dumps(S.to_dict()),
                 "--options-json", json.dumps(SCHEMA)],
                env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(json.loads(out.stdout.splitlines()[-1])["accepted"], 3)
        info = self.producer("jsonl-schema").pool_info()
        self.assertEqual(info.token_field_dtypes["loss_mask"], ndarray_pb2.UINT8)


if __name__ == "__main__":
    unittest.main()
