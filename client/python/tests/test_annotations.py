"""Rewards after the fact and advantages on the client side (lifecycle.md
section 6), without rollpackd: the AnnotateSamples requests
Producer/AsyncProducer/Controller.annotate build from each form they take,
and their refusals; CreateStep's advantage fields; `rollpack pool annotate |
register`, `put --required-scalar` against the in-process fake server; and
rollpack.step_sequences (which streams `step plan --groups` reads, decoding
and checking what a micro-batch says about its sequences). The same against
a real rollpackd, end to end, is test_grpo."""

import asyncio
import json
import os
import subprocess
import sys
import types
import unittest

import numpy as np

import rollpack
from rollpack import errors, step_sequences
from rollpack._proto import ndarray_pb2, rollouts_pb2, scheduler_pb2, trainer_pb2
from rollpack import ndarray as nd
from rollpack.annotations import advantage_estimator, annotate_request
from tests import engines as eng
from tests.fake_server import Serve

S = eng.SMALL
HERE = os.path.dirname(os.path.abspath(__file__))


def run_cli(*args, stdin=None):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    return subprocess.run([sys.executable, "-m", "rollpack"] + list(args), input=stdin,
                          capture_output=True, text=True, env=env, timeout=120)


def entries(req):
    return [(a.sample_id, dict(a.scalars)) for a in req.annotations]


class Requests(unittest.TestCase):
    def test_every_form_gives_the_same_request(self):
        want = [("a", {"reward": 1.0, "acc": 0.5}), ("b", {"reward": 0.0})]
        forms = [
            {"a": {"reward": 1, "acc": 0.5}, "b": {"reward": 0.0}},
            [("a", {"reward": 1.0, "acc": np.float32(0.5)}), ("b", {"reward": np.int64(0)})],
            [{"sample_id": "a", "scalars": {"reward": 1.0, "acc": 0.5}},
             {"sample_id": "b", "scalars": {"reward": 0.0}}],
            [rollouts_pb2.SampleAnnotation(sample_id="a", scalars={"reward": 1.0, "acc": 0.5}),
             rollouts_pb2.SampleAnnotation(sample_id="b", scalars={"reward": 0.0})],
            iter([("a", {"reward": 1.0, "acc": 0.5}), ("b", {"reward": 0.0})]),
        ]
        for form in forms:
            req = annotate_request("p", form)
            self.assertEqual(req.pool, "p")
            self.assertEqual(entries(req), want, form)
        # Duplicates and unknown ids are the server's to refuse (all or nothing).
        self.assertEqual(len(annotate_request("p", [("a", {}), ("a", {"r": 1})]).annotations), 2)
        self.assertEqual(len(annotate_request("p", {}).annotations), 0)

    def test_refusals_name_the_entry(self):
        cases = [
            ("abc", "annotations is a string"),
            ([("", {"r": 1})], "annotations[0]: sample_id is ''"),
            ([("a", {"r": 1}), (7, {"r": 1})], "annotations[1]: sample_id is 7"),
            ([("a", [1.0])], "annotations[0] (sample 'a'): scalars is [1.0], not a dict"),
            ([("a", {"r": True})], "scalar 'r' is True, not a number"),
            ([("a", {"r": "1"})], "scalar 'r' is '1', not a number"),
            ([("a", {"": 1.0})], "scalar name '' is not a non-empty string"),
            ([{"id": "a"}], "annotations[0]: a dict needs \"sample_id\" and \"scalars\""),
            ([42], "annotations[0] is 42: a (sample_id, {name: value}) pair"),
        ]
        for form, message in cases:
            with self.assertRaises(errors.PayloadError) as cm:
                annotate_request("p", form)
            self.assertIn(message, str(cm.exception), form)
            self.assertIsInstance(cm.exception, ValueError)
        with self.assertRaises(ValueError):
            annotate_request("", {"a": {"r": 1}})

    def test_advantage_names(self):
        for name, want in [(None, scheduler_pb2.ADVANTAGE_NONE),
                           ("none", scheduler_pb2.ADVANTAGE_NONE),
                           ("grpo", scheduler_pb2.ADVANTAGE_GRPO),
                           ("GRPO-mean", scheduler_pb2.ADVANTAGE_GRPO_MEAN),
                           ("grpo_mean", scheduler_pb2.ADVANTAGE_GRPO_MEAN),
                           ("ADVANTAGE_RLOO", scheduler_pb2.ADVANTAGE_RLOO),
                           (scheduler_pb2.ADVANTAGE_RLOO, scheduler_pb2.ADVANTAGE_RLOO)]:
            self.assertEqual(advantage_estimator(name), want, name)
        for bad in ("ppo", 9, True, 1.0):
            with self.assertRaises(ValueError):
                advantage_estimator(bad)

    def test_create_step_sends_the_estimator(self):
        sent = []
        with rollpack.Controller("127.0.0.1:1") as c:
            c._scheduler = types.SimpleNamespace(
                CreateStep=lambda req, timeout, metadata: sent.append(req) or
                scheduler_pb2.StepInfo(step_id=req.step_id))
            c.create_step("s", "p", num_groups=2, topology={"dp": 1, "max_tokens_per_rank": 8},
                          advantage="grpo", advantage_scalar="score", advantage_eps=1e-3)
            c.create_step("t", "p", num_groups=2, topology={"dp": 1, "max_tokens_per_rank": 8})
            with self.assertRaises(ValueError):
                c.create_step("u", "p", num_groups=1, topology={"dp": 1}, advantage="ppo")
        self.assertEqual((sent[0].advantage, sent[0].advantage_scalar, sent[0].advantage_eps),
                         (scheduler_pb2.ADVANTAGE_GRPO, "score", 1e-3))
        self.assertEqual((sent[1].advantage, sent[1].advantage_scalar, sent[1].advantage_eps),
                         (scheduler_pb2.ADVANTAGE_NONE, "", 0.0))


class AgainstFakeServer(unittest.TestCase):
    def setUp(self):
        self.srv = Serve()
        self.addCleanup(self.srv.stop)
        with rollpack.Producer(self.srv.address, "pool") as p:
            p.register_model(S)

    def test_producer_controller_async(self):
        with rollpack.Producer(self.srv.address, "pool", token="tk") as p:
            self.assertEqual(p.annotate({"a": {"reward": 1.0}, "b": {"reward": 0.5}}), 2)
            # The pool named first, as Controller.annotate takes it.
            self.assertEqual(p.annotate("pool", [("e", {"reward": 2.0})]), 1)
            with self.assertRaises(TypeError):
                p.annotate("pool")
            with self.assertRaises(errors.NotFound):
                p.annotate("other", {"a": {"reward": 1.0}})
            with self.assertRaises(errors.InvalidArgument) as cm:
                p.annotate([("a", {"reward": 1.0}), ("a", {"reward": 2.0})])
            self.assertIn('sample "a" is annotated twice', str(cm.exception))
        self.assertEqual(self.srv.servicer.metadata[-1]["authorization"], "Bearer tk")
        with rollpack.Controller(self.srv.address) as c:
            self.assertEqual(c.annotate("pool", [{"sample_id": "c", "scalars": {"r": 2}}]), 1)
            with self.assertRaises(errors.NotFound) as cm:
                c.annotate("nope", {"a": {"r": 1}})
            self.assertIn("AnnotateSamples of pool 'nope'", str(cm.exception))

        async def run():
            async with rollpack.AsyncProducer(self.srv.address, "pool") as p:
                return await p.annotate("pool", [("d", {"reward": -1})])
        self.assertEqual(asyncio.run(run()), 1)
        got = [entries(r) for r in self.srv.servicer.annotations]
        self.assertEqual(got, [[("a", {"reward": 1.0}), ("b", {"reward": 0.5})],
                               [("e", {"reward": 2.0})], [("c", {"r": 2.0})],
                               [("d", {"reward": -1.0})]])

    def test_cli_pool_annotate(self):
        lines = "\n".join([json.dumps({"sample_id": "c", "scalars": {"reward": 0.25}}), "",
                           json.dumps({"sample_id": "d", "scalars": {"reward": 1, "acc": 1}})])
        res = run_cli("pool", "annotate", "pool", "--server", self.srv.address,
                      "--sample", "a", "--scalar", "reward=1.0", "--scalar", "acc=0.5",
                      "--sample", "b", "--scalar", "reward=-2e-1", "--from-jsonl", "-",
                      "--json", stdin=lines)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(json.loads(res.stdout), {"pool": "pool", "annotated": 4})
        self.assertEqual(entries(self.srv.servicer.annotations[-1]),
                         [("a", {"reward": 1.0, "acc": 0.5}), ("b", {"reward": -0.2}),
                          ("c", {"reward": 0.25}), ("d", {"reward": 1.0, "acc": 1.0})])
        res = run_cli("pool", "annotate", "--pool", "pool", "--server", self.srv.address,
                      "--sample", "e", "--scalar", "reward=0")
        self.assertEqual((res.returncode, res.stdout.strip()),
                         (0, "pool pool: 1 annotations accepted"), res.stderr)
        # Usage: exit 2, nothing sent.
        sent = len(self.srv.servicer.annotations)
        for args, message in [
                (("--scalar", "reward=1"), "give --sample ID before its scalars"),
                (("--sample", "a", "--scalar", "reward"), "NAME=VALUE with a number"),
                (("--sample", "a", "--scalar", "reward=x"), "NAME=VALUE with a number"),
                (("--sample", "a", "--scalar", "r=1", "--scalar", "r=2"), "has scalar 'r'"),
                ((), "nothing to add"),
                (("--pool", "other", "--sample", "a"), "pool 'pool' and --pool 'other' differ")]:
            res = run_cli("pool", "annotate", "pool", "--server", self.srv.address, *args)
            self.assertEqual(res.returncode, 2, (args, res.stderr))
            self.assertIn(message, res.stderr, args)
        res = run_cli("pool", "annotate", "pool", "--server", self.srv.address,
                      "--from-jsonl", "-", stdin='{"sample_id": "a"}\n')
        self.assertEqual(res.returncode, 1)
        self.assertIn('-:1: not {"sample_id": ID, "scalars": {NAME: VALUE}}', res.stderr)
        self.assertEqual(len(self.srv.servicer.annotations), sent)
        # The server's refusal: exit 1, its message.
        res = run_cli("pool", "annotate", "nope", "--server", self.srv.address,
                      "--sample", "a", "--scalar", "r=1")
        self.assertEqual(res.returncode, 1)
        self.assertIn('pool "nope" does not exist', res.stderr)

    def test_cli_required_scalars(self):
        model = json.dumps(S.to_dict())
        res = run_cli("pool", "register", "grpo", "--server", self.srv.address, "--model-json",
                      model, "--options-json", '{"default_group_size": 4}',
                      "--required-scalar", "reward", "--required-scalar", "acc")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("pool grpo: model", res.stdout)
        o = self.srv.servicer.options["grpo"]
        self.assertEqual((list(o.required_scalars), o.default_group_size), (["reward", "acc"], 4))
        res = run_cli("put", "--from-jsonl", "-", "--server", self.srv.address, "--pool", "p2",
                      "--model-json", model, "--required-scalar", "reward", stdin="")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(list(self.srv.servicer.options["p2"].required_scalars), ["reward"])
        res = run_cli("put", "--from-jsonl", "-", "--server", self.srv.address, "--pool", "p3",
                      "--required-scalar", "reward", stdin="")
        self.assertNotEqual(res.returncode, 0)
        self.assertIn("--required-scalar needs --model-json", res.stderr)
        res = run_cli("pool", "register", "p4", "--server", self.srv.address)
        self.assertEqual(res.returncode, 2)
        self.assertIn("--model-json is required", res.stderr)


def _array(dtype, values):
    a = np.asarray(values, nd.numpy_dtype(dtype))
    return ndarray_pb2.NDArray(dtype=dtype, shape=[len(a)], data=a.tobytes())


def _mb(index, ids, groups, versions, rewards, advantages=None):
    m = trainer_pb2.Microbatch(step_id="s", index=index, sample_ids=ids, group_ids=groups,
                               policy_versions=versions)
    m.scalars["reward"].CopyFrom(_array(ndarray_pb2.FLOAT64, rewards))
    if advantages is not None:
        m.advantages.CopyFrom(_array(ndarray_pb2.FLOAT32, advantages))
    return m


class StepSequences(unittest.TestCase):
    def plan(self, groups):
        """groups: per micro-batch, (first_rank, cp_size, sample ids)."""
        plan = scheduler_pb2.Plan(step_id="s")
        for i, mb in enumerate(groups):
            m = plan.microbatches.add(index=i)
            for first, size, ids in mb:
                m.groups.add(first_rank=first, cp_size=size, sample_ids=ids)
        return plan

    def test_streams_to_read(self):
        info = scheduler_pb2.StepInfo(topology=scheduler_pb2.Topology(dp=2, cp=2))
        static = self.plan([[(0, 2, ["a"]), (2, 2, ["b"])], [(0, 2, ["c"]), (2, 2, ["d"])]])
        self.assertEqual(step_sequences.streams_to_read(static, info), [(0, 0, 0, 0), (1, 0, 0, 0)])
        # Dynamic CP: groups of 1, 2 and 4 ranks; their first ranks.
        dynamic = self.plan([[(0, 1, ["a"]), (1, 1, ["b"]), (2, 2, ["c"])],
                             [(0, 4, ["d"])]])
        self.assertEqual(step_sequences.streams_to_read(dynamic, info),
                         [(0, 0, 0, 0), (0, 1, 0, 0), (1, 0, 0, 0)])
        # pp = 4: the stage with the fewest replay layers, a middle one on ties.
        info = scheduler_pb2.StepInfo(topology=scheduler_pb2.Topology(dp=1, pp=4))
        for p, layers in enumerate([[0, 1], [2], [3], [4, 5]]):
            info.stage_layers.add(pp_rank=p, replay_layers=layers)
        self.assertEqual(step_sequences.streams_to_read(static, info)[0][3], 1)
        info.stage_layers[0].ClearField("replay_layers")
        self.assertEqual(step_sequences.streams_to_read(static, info)[0][3], 0)

    def test_decode_collect_table(self):
        plan = self.plan([[(0, 1, ["a", "b"]), (1, 1, ["c"])], [(0, 2, ["d"])]])
        rank0 = [_mb(0, ["a", "b"], ["q", "q"], [3, 4], [1.0, 0.0], [1.0, -1.0]),
                 _mb(1, ["d"], [""], [4], [0.5], [0.0])]
        rank1 = [_mb(0, ["c"], ["r"], [4], [0.25], [0.0]),
                 _mb(1, ["d"], [""], [4], [0.5], [0.0])]
        got = step_sequences.collect(plan, [iter(rank0), iter(rank1)])
        self.assertEqual([s.sample_id for s in got], ["a", "b", "c", "d"])
        self.assertEqual(got[0], step_sequences.SequenceInfo("a", "q", 3, {"reward": 1.0}, 1.0, 0))
        self.assertEqual(got[3].group_id, "")
        self.assertEqual(list(step_sequences.by_group(got)), ["q", "r", ""])
        lines = step_sequences.table(got)
        self.assertEqual(lines[0].split(), ["GROUP", "SAMPLE", "VERSION", "MB", "reward",
                                            "ADVANTAGE"])
        self.assertEqual(lines[2].split(), ["q", "b", "4", "0", "0", "-1"])
        self.assertEqual(lines[4].split(), ["-", "d", "4", "1", "0.5", "0"])
        no_adv = [_mb(0, ["a"], ["q"], [1], [1.0])]
        self.assertIsNone(step_sequences.decode(no_adv[0])[0].advantage)
        self.assertEqual(step_sequences.table(step_sequences.decode(no_adv[0]))[1].split()[-1],
                         "-")
        with self.assertRaises(errors.PayloadError) as cm:
            step_sequences.collect(plan, [iter(rank0)])
        self.assertIn("sample 'c' of step 's' (micro-batch 0) is in no micro-batch read",
                      str(cm.exception))

    def test_decode_refuses_what_does_not_fit(self):
        m = _mb(2, ["a", "b"], ["q", "q"], [1, 1], [1.0, 0.0, 2.0])
        with self.assertRaises(errors.PayloadError) as cm:
            step_sequences.decode(m)
        self.assertIn("micro-batch 2 of step 's': scalars['reward'] is FLOAT64 [3] (24 bytes), "
                      "not FLOAT64 [2]", str(cm.exception))
        m = _mb(2, ["a", "b"], ["q", "q"], [1, 1], [1.0, 0.0], [0.5, 0.5])
        m.advantages.dtype = ndarray_pb2.FLOAT64
        with self.assertRaises(errors.PayloadError) as cm:
            step_sequences.decode(m)
        self.assertIn("advantages is FLOAT64 [2] (8 bytes), not FLOAT32 [2]", str(cm.exception))
        m = _mb(2, ["a", "b"], ["q"], [1, 1], [1.0, 0.0])
        with self.assertRaises(errors.PayloadError) as cm:
            step_sequences.decode(m)
        self.assertIn("2 sequences but 1 group_ids and 2 policy_versions", str(cm.exception))
        m = trainer_pb2.Microbatch(step_id="s", index=0, sample_ids=["a"])
        with self.assertRaises(errors.FailedPrecondition) as cm:
            step_sequences.decode(m)
        self.assertIn("older than lifecycle.md section 6", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
