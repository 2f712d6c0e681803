"""Golden engine payloads -> adapters -> Producer -> a running rollpackd ->
Scheduler.CreateStep (dp=cp=tp=pp=1) -> Trainer.FetchMicrobatches(all_fields)
-> compared bit for bit with the routed experts the payloads were made from.

One sample per step: the micro-batch holds that sample alone, alignment 1,
so tokens come back as sent, replay_experts is [n, |M|, K] (uint8 when
E <= 256, else uint16) on the MoE layers, and replay_mask is 1 exactly on
the covered, non-missing tokens (rows with mask 0 hold filler ids).
"""

import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc
import numpy as np

import rollpack
from rollpack import ModelSpec, Producer, Sample
from rollpack import adapters as ad
from rollpack import ndarray as nd
from rollpack._proto import scheduler_pb2, scheduler_pb2_grpc, trainer_pb2
from tests import engines as eng
from tests.rollpackd import Rollpackd
from tests.server_case import ServerTest

S, W = eng.SMALL, eng.WIDE
_steps = itertools.count()


class RoundTrip(ServerTest):
    CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1)]

    def producer(self, pool, spec):
        p = Producer(self.d.address, pool, timeout=30)
        self.addCleanup(p.close)
        p.register_model(spec)
        return p

    def fetch(self, pool, sample_id):
        step = "step-%d" % next(_steps)
        topo = scheduler_pb2.Topology(dp=1, cp=1, tp=1, pp=1, max_tokens_per_rank=1 << 20)
        self.sched.CreateStep(scheduler_pb2.CreateStepRequest(
            step_id=step, pool=pool, sample_ids=[sample_id], topology=topo), timeout=30)
        mbs = list(self.trainer.FetchMicrobatches(trainer_pb2.FetchRequest(
            step_id=step, rank=trainer_pb2.RankCoords(), all_fields=True), timeout=30))
        self.sched.ReleaseStep(scheduler_pb2.ReleaseStepRequest(step_id=step), timeout=30)
        self.assertEqual(len(mbs), 1)
        self.assertEqual(list(mbs[0].sample_ids), [sample_id])
        return mbs[0]

    def check(self, pool, spec, sample_id, tokens, truth, covered, missing=(), fields=None):
        """``truth``: full-layout int32 rows of tokens 0..len-1 of the whole
        sequence; ``covered``: (start, end) of the rows the payload carried."""
        mb = self.fetch(pool, sample_id)
        n = len(tokens)
        np.testing.assert_array_equal(nd.from_proto(mb.tokens), tokens)
        self.assertEqual(nd.from_proto(mb.cu_seqlens).tolist(), [0, n])
        m = list(spec.resolved_moe_layers)
        self.assertEqual(list(mb.replay_layers), m)
        rep, mask = nd.from_proto(mb.replay_experts), nd.from_proto(mb.replay_mask)
        self.assertEqual(rep.dtype, np.uint8 if spec.num_experts <= 256 else np.uint16)
        self.assertEqual(rep.shape, (n, len(m), spec.topk))
        want_mask = np.zeros(n, np.uint8)
        want_mask[covered[0]:covered[1]] = 1
        want_mask[list(missing)] = 0
        np.testing.assert_array_equal(mask, want_mask)
        rows = np.flatnonzero(want_mask)
        np.testing.assert_array_equal(rep[rows].astype(np.int64),
                                      truth[rows][:, m, :].astype(np.int64))
        for k, v in (fields or {}).items():
            got = nd.from_proto(mb.token_fields[k])
            self.assertEqual(got.dtype, v.dtype)
            np.testing.assert_array_equal(got, v)

    # -- one test per engine format ------------------------------------------
    def test_vllm_in_process(self):
        p = self.producer("vllm-out", S)
        n = 50
        toks, truth = eng.tokens(n), eng.routed(n - 1, S, seed=1)
        lp = np.linspace(-3, 0, n, dtype=np.float32)
        r = p.put(Sample("a", toks, *ad.from_vllm_output(eng.vllm_output(truth), toks, S),
                         token_fields={"logprobs": lp}, scalars={"reward": 1.0}))
        self.assertEqual((r.accepted, r.duplicates), (1, 0))
        self.check("vllm-out", S, "a", toks, truth, (0, n - 1), fields={"logprobs": lp})

    def test_vllm_021_n_choices_share_the_prompt(self):
        p = self.producer("vllm021", S)
        plen, outs = 20, [15, 30, 2]
        prompt = eng.tokens(plen, seed=2)
        prows = eng.routed(plen, S, seed=3)
        crows = [eng.routed(o - 1, S, seed=10 + i) for i, o in enumerate(outs)]
        resp = eng.vllm021_response(prows, crows, S)
        seqs = [np.concatenate([prompt, eng.tokens(o, seed=20 + i)]) for i, o in enumerate(outs)]
        p.put(Sample("c%d" % i, t, *ad.from_vllm_v021_response(resp, t, S, choice_index=i),
                     group_id="g") for i, t in enumerate(seqs))
        for i, t in enumerate(seqs):
            truth = np.concatenate([prows, crows[i]])
            self.check("vllm021", S, "c%d" % i, t, truth, (0, len(t) - 1))

    def test_vllm_npy_prompt_start_and_missing_rows(self):
        p = self.producer("vllm-npy", S)
        n, s = 64, 17
        toks, truth = eng.tokens(n), eng.routed(n - 1, S, seed=4, missing=(30, 31, 50))
        choice = eng.vllm_choice(truth[s:].astype(np.int16), s)
        p.put(Sample("p", toks, *ad.from_vllm_choice(choice, toks, S)))
        self.check("vllm-npy", S, "p", toks, truth, (s, n - 1), missing=(30, 31, 50))

    def test_sglang_start_len_honoured_and_ignored(self):
        p = self.producer("sglang", S)
        n, s = 40, 12
        toks, truth = eng.tokens(n), eng.routed(n - 1, S, seed=5)
        honoured = eng.sglang_meta_info(truth[s:], s)
        ignored = eng.sglang_meta_info(truth, s)
        p.put([Sample("h", toks, *ad.from_sglang_meta_info(honoured, toks, S)),
               Sample("i", toks, *ad.from_sglang_meta_info({"meta_info": ignored}, toks, S))])
        self.check("sglang", S, "h", toks, truth, (s, n - 1))
        self.check("sglang", S, "i", toks, truth, (0, n - 1))

    def test_ndarray_dict_wide_model_uint16(self):
        p = self.producer("wide", W)
        n = 33
        toks, truth = eng.tokens(n), eng.routed(n, W, seed=6)  # n rows: ends at n
        d = eng.ndarray_dict(truth.astype(np.int64), "torch.int64")
        p.put(Sample("w", toks, *ad.from_ndarray_dict(d, toks, W)))
        self.check("wide", W, "w", toks, truth, (0, n))

    def test_multi_turn_stitching(self):
        p = self.producer("multiturn", S)
        n1, n2 = 25, 60
        toks = eng.tokens(n2, seed=7)
        truth = eng.routed(n2 - 1, S, seed=8)
        s = Sample("mt", toks[:n1], *ad.from_sglang_meta_info(eng.sglang_meta_info(truth[:n1 - 1]),
                                                             toks[:n1], S),
                   token_fields={"loss_mask": np.ones(n1, np.uint8)})
        start = n1 - 1
        s.extend(toks, *ad.from_sglang_meta_info(eng.sglang_meta_info(truth[start:], start), toks, S),
                 token_fields={"loss_mask": np.zeros(n2 - n1, np.uint8)})
        p.put(s)
        mask = np.concatenate([np.ones(n1, np.uint8), np.zeros(n2 - n1, np.uint8)])
        self.check("multiturn", S, "mt", toks, truth, (0, n2 - 1), fields={"loss_mask": mask})

    # -- server refusals surface with the server's message -------------------
    def test_server_refusals(self):
        p = self.producer("refuse", S)
        n = 20
        toks, truth = eng.tokens(n), eng.routed(n - 1, S, seed=9)
        self.assertEqual(p.put(Sample("ok", toks, truth)).accepted, 1)
        self.assertEqual(p.put(Sample("ok", toks, truth)).duplicates, 1)  # idempotent
        with self.assertRaises(rollpack.AlreadyExists) as cm:
            p.put(Sample("ok", toks, truth[:, :, ::-1].copy()))
        self.assertIn("ok", cm.exception.details)
        dup = truth.copy()
        dup[3, 2, 1] = dup[3, 2, 0]  # an id repeated within (token 3, layer 2)
        with self.assertRaises(rollpack.InvalidArgument) as cm:
            p.put([Sample("fine", toks, truth), Sample("dup", toks, dup)])
        self.assertIn("dup", cm.exception.details)
        zero = truth.copy()
        zero[:, 4, :] = 0  # a MoE layer all zero: a broken capture
        with self.assertRaises(rollpack.InvalidArgument) as cm:
            p.put(Sample("zero", toks, zero))
        self.assertIn("zero", cm.exception.details)
        with self.assertRaises(rollpack.FailedPrecondition):
            p.register_model(ModelSpec("other", num_layers=6, num_experts=16, topk=4))
        self.assertTrue(p.register_model(S) is False)
        info = p.pool_info()
        self.assertEqual(info.num_samples, 1)  # "fine" shared the refused message

    def test_uint8_id_limit_and_token_field_schema(self):
        p = self.producer("schema", S)
        n = 10
        toks, truth = eng.tokens(n), eng.routed(n - 1, S, seed=11)
        p.put(Sample("f1", toks, truth, token_fields={"lp": np.zeros(n, np.float32)}))
        with self.assertRaises(rollpack.InvalidArgument) as cm:
            p.put(Sample("f2", toks, truth, token_fields={"lp": np.zeros(n, np.float16)}))
        self.assertIn("f2", cm.exception.details)


    # -- memory limit: RESOURCE_EXHAUSTED is retried until trainers free memory
    def test_resource_exhausted_retried_until_a_step_is_released(self):
        n = 2000
        toks = eng.tokens(n, seed=12)
        a = Sample("a", toks, eng.routed(n - 1, S, seed=13))
        b = Sample("b", toks, eng.routed(n - 1, S, seed=14))
        probe = self.producer("probe", S).put(a)
        self.assertGreater(probe.stored_bytes, 0)
        limit = probe.stored_bytes * 3 // 2
        with Rollpackd("--max-memory", str(limit)) as d:
            fast = dict(timeout=30, initial_backoff=0.05, max_backoff=0.3)
            with Producer(d.address, "mem", max_attempts=2, **fast) as p:
                p.register_model(S)
                self.assertEqual(p.put(a).accepted, 1)
                with self.assertRaises(rollpack.ResourceExhausted) as cm:
                    p.put(b)
                self.assertIn("after 2 attempts", str(cm.exception))
                self.assertTrue(cm.exception.details)
            with grpc.insecure_channel(d.address) as ch:
                sched = scheduler_pb2_grpc.SchedulerStub(ch)
                sched.CreateStep(scheduler_pb2.CreateStepRequest(
                    step_id="free-a", pool="mem", sample_ids=["a"], topology=scheduler_pb2.Topology(
                        dp=1, cp=1, tp=1, pp=1, max_tokens_per_rank=1 << 20)), timeout=30)

                def release():
                    time.sleep(0.5)
                    sched.ReleaseStep(scheduler_pb2.ReleaseStepRequest(step_id="free-a"), timeout=30)
                t = threading.Thread(target=release)
                t.start()
                try:
                    with Producer(d.address, "mem", max_attempts=60, **fast) as p:
                        r = p.put(b)
                finally:
                    t.join()
                self.assertEqual(r.accepted, 1)
                self.assertGreaterEqual(r.retries, 1)
        self.assertEqual(d.returncode, 0, d.output())

    # -- the CLI -----------------------------------------------------------------
    def test_cli_put_from_jsonl(self):
        from rollpack.jsonl import make_record
        n, s = 45, 9
        toks, truth = eng.tokens(n, seed=15), eng.routed(n - 1, S, seed=16)
        recs = [make_record("vllm", "cli-v", toks, eng.vllm_choice(truth[s:], s)),
                make_record("sglang", "cli-g", toks, {"meta_info": eng.sglang_meta_info(truth)})]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "captured.jsonl")
            with open(path, "w") as f:
                f.write("\n".join(json.dumps(r) for r in recs) + "\n")
            env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(
                os.path.abspath(__file__))))
            res = subprocess.run([sys.executable, "-m", "rollpack", "put", "--from-jsonl", path,
                                  "--server", self.d.address, "--pool", "cli", "--model-json",
                                  json.dumps(S.to_dict())], capture_output=True, text=True,
                                 env=env, timeout=120)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(json.loads(res.stdout)["accepted"], 2)
        self.check("cli", S, "cli-v", toks, truth, (s, n - 1))
        self.check("cli", S, "cli-g", toks, truth, (0, n - 1))


if __name__ == "__main__":
    unittest.main()
