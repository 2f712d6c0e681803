"""`python3 -m rollpack put --from-jsonl` against the in-process fake server
(the same CLI against rollpackd is in test_roundtrip)."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

from rollpack import ndarray as nd
from rollpack._proto import rollouts_pb2
from rollpack.jsonl import make_record
from tests import engines as eng
from tests.fake_server import Serve

S = eng.SMALL
HERE = os.path.dirname(os.path.abspath(__file__))
PYPATH = os.path.dirname(HERE)


def golden_records():
    """One record per engine format, with the truth each must decode to."""
    out = []
    n = 30
    toks = eng.tokens(n, seed=3)
    truth = eng.routed(n - 1, S, seed=4)
    out.append((make_record("vllm", "v", toks, eng.vllm_choice(truth[5:], 5)), toks, truth[5:], 5))
    resp = {"choices": [eng.vllm_choice(truth, index=0), eng.vllm_choice(truth[2:], 2, index=1)]}
    out.append((make_record("vllm", "v1", toks, resp, choice_index=1), toks, truth[2:], 2))
    p = 12
    r021 = eng.vllm021_response(truth[:p], [truth[p:]], S)
    rec = make_record("vllm-0.21", "o", toks, r021)
    rec["tokens"] = toks.tolist()
    out.append((rec, toks, truth, 0))
    out.append((make_record("sglang", "g", toks, {"text": "", "meta_info": eng.sglang_meta_info(
        truth[7:], 7)}, scalars={"reward": 0.5}, group_id="grp"), toks, truth[7:], 7))
    rec = make_record("ndarray", "d", toks, eng.ndarray_dict(eng.compact(truth, S)),
                      token_fields={"logprobs": {"data": __import__("base64").b64encode(
                          np.arange(n, dtype=np.float32).tobytes()).decode(), "shape": [n],
                          "dtype": "float32"}})
    out.append((rec, toks, truth, 0))
    return out


def run_cli(*args, stdin=None):
    env = dict(os.environ, PYTHONPATH=PYPATH)
    return subprocess.run([sys.executable, "-m", "rollpack"] + list(args), input=stdin,
                          capture_output=True, text=True, env=env, timeout=120)


class Cli(unittest.TestCase):
    def setUp(self):
        self.srv = Serve()
        self.addCleanup(self.srv.stop)
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def write(self, lines):
        path = os.path.join(self.dir.name, "in.jsonl")
        with open(path, "w") as f:
            for l in lines:
                f.write((l if isinstance(l, str) else json.dumps(l)) + "\n")
        return path

    def test_put_from_jsonl(self):
        recs = golden_records()
        path = self.write([r for r, *_ in recs] + [""])
        res = run_cli("put", "--from-jsonl", path, "--server", self.srv.address, "--pool", "pool",
                      "--model-json", json.dumps(S.to_dict()), "--token", "tk")
        self.assertEqual(res.returncode, 0, res.stderr)
        summary = json.loads(res.stdout)
        self.assertEqual((summary["accepted"], summary["model_created"]), (len(recs), True))
        for rec, toks, rows, off in recs:
            pb = rollouts_pb2.Sample()
            pb.ParseFromString(self.srv.servicer.samples[("pool", rec["sample_id"])])
            np.testing.assert_array_equal(nd.from_proto(pb.tokens), toks)
            self.assertEqual(pb.routed_experts_row_offset, off)
            np.testing.assert_array_equal(nd.from_proto(pb.routed_experts), eng.compact(rows, S))
        pb = rollouts_pb2.Sample()
        pb.ParseFromString(self.srv.servicer.samples[("pool", "d")])
        self.assertEqual(nd.from_proto(pb.token_fields["logprobs"])[7], 7.0)
        self.assertEqual(self.srv.servicer.metadata[-1]["authorization"], "Bearer tk")
        # again from stdin, pool model fetched from the server: all duplicates
        with open(path) as f:
            text = f.read()
        res = run_cli("put", "--from-jsonl", "-", "--server", self.srv.address, "--pool", "pool",
                      stdin=text)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(json.loads(res.stdout)["duplicates"], len(recs))

    def test_bad_lines(self):
        recs = golden_records()
        bad_rows = make_record("sglang", "bad", recs[0][1], eng.sglang_meta_info(recs[0][2][:3]))
        lines = [recs[0][0], "{not json", bad_rows, {"engine": "tgi", "sample_id": "x"}, recs[3][0]]
        path = self.write(lines)
        res = run_cli("put", "--from-jsonl", path, "--server", self.srv.address, "--pool", "pool",
                      "--model-json", json.dumps(S.to_dict()))
        self.assertEqual(res.returncode, 1)
        self.assertIn("in.jsonl:2: not JSON", res.stderr)
        self.assertEqual(sorted(k[1] for k in self.srv.servicer.samples), ["v"])
        res = run_cli("put", "--from-jsonl", path, "--server", self.srv.address, "--pool", "pool",
                      "--keep-going")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(json.loads(res.stdout)["skipped"], 3)
        self.assertIn("in.jsonl:3: SGLang meta_info.routed_experts holds", res.stderr)
        self.assertIn("in.jsonl:4: engine is 'tgi'", res.stderr)
        self.assertEqual(sorted(k[1] for k in self.srv.servicer.samples), ["g", "v"])

    def test_usage_and_server_errors(self):
        path = self.write([golden_records()[0][0]])
        res = run_cli("put", "--from-jsonl", path, "--server", self.srv.address, "--pool", "none")
        self.assertEqual(res.returncode, 1)
        self.assertIn('pool "none" does not exist', res.stderr)
        self.assertEqual(run_cli("put", "--pool", "p").returncode, 2)


if __name__ == "__main__":
    unittest.main()
