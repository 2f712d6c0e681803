"""GRPO with rewards after the fact (lifecycle.md section 6) against a real
rollpackd, end to end: groups put without rewards into a pool that requires
"reward" are not selectable; rewards are annotated later (Producer,
Controller, `rollpack pool annotate`), with every refusal; a step created
with ADVANTAGE_GRPO hands each rank micro-batches whose group_ids,
policy_versions, scalars and advantages equal a plain numpy reference
((r - mean) / (std + 1e-6), population std, per group); RLOO and GRPO_MEAN
on the same samples again (a reuse step); Controller.sequences and `rollpack
step plan --groups`; the estimator's refusals.

Needs torch and librollpack_trainer.so (as test_trainer): without them it
skips, unless ROLLPACK_TRAINER_REQUIRED=1 (CTest). ROLLPACK_TEST_DEVICE=cuda:0
runs the ranks' clients on a GPU (scalars and advantages then on the device).
"""

import json
import os
import subprocess
import sys
import unittest

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

import rollpack
from rollpack import errors
from tests.rollpackd import Rollpackd
from tests.test_trainer import _need_trainer

DEVICE = os.environ.get("ROLLPACK_TEST_DEVICE", "cpu")
HERE = os.path.dirname(os.path.abspath(__file__))
NUM_LAYERS, MOE, E, K = 4, [1, 3], 16, 2
TOPO = dict(dp=2, cp=2, tp=1, pp=2, max_tokens_per_rank=256)
GROUPS, SIZE = 4, 4
# Rewards per group: q1's are all equal (std 0: advantages 0, not a division
# by zero); q3 gets its rewards from the CLI.
REWARDS = {"q0": [1.0, 0.0, 0.0, 1.0], "q1": [0.5, 0.5, 0.5, 0.5],
           "q2": [0.0, 0.25, 1.0, 0.75], "q3": [1.0, 0.0, 0.0, 0.0]}


def cli(*args, stdin=None):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    return subprocess.run([sys.executable, "-m", "rollpack"] + list(args), input=stdin,
                          capture_output=True, text=True, env=env, timeout=120)


def samples(rng):
    out, truth = [], {}
    for g in range(GROUPS):
        for i in range(SIZE):
            sid, group = "q%d-%d" % (g, i), "q%d" % g
            n = int(rng.integers(20, 90))
            toks = rng.integers(1, 30000, size=n).astype(np.int32)
            ex = np.argsort(rng.random((n - 1, NUM_LAYERS, E)), axis=2)[:, :, :K].astype(np.int32)
            scalars = {"acc": float(i) / 4}
            if g == 2 and i < 2:
                scalars["extra"] = 1.0  # not every sample has it: left out of micro-batches
            version = 1 + (g + i) % 3
            out.append(rollpack.Sample(sid, toks, ex, group_id=group, group_size=SIZE,
                                       policy_version=version, scalars=scalars))
            truth[sid] = (group, version, REWARDS[group][i], scalars["acc"])
    return out, truth


def reference(truth, ids, estimator, eps=1e-6):
    """Per sample id, the advantage over its group's samples among ``ids``."""
    by_group = {}
    for sid in ids:
        by_group.setdefault(truth[sid][0], []).append(sid)
    out = {}
    for members in by_group.values():
        r = np.array([truth[s][2] for s in members], np.float64)
        if estimator == "grpo":
            a = (r - r.mean()) / (r.std() + eps)
        elif estimator == "grpo_mean":
            a = r - r.mean()
        else:  # rloo
            a = r - (r.sum() - r) / (len(r) - 1)
        out.update(zip(members, a))
    return out


class Grpo(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.trainer = _need_trainer(sequence_info=True)
        cls.d = Rollpackd()
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        cls.c = rollpack.Controller(cls.d.address, timeout=60)
        cls.addClassCleanup(cls.c.close)
        cls.p = rollpack.Producer(cls.d.address, "grpo", timeout=60)
        cls.addClassCleanup(cls.p.close)
        spec = rollpack.ModelSpec("tiny", num_layers=NUM_LAYERS, moe_layers=MOE, num_experts=E,
                                  topk=K)
        cls.p.register_model(spec, options={"required_scalars": ["reward"],
                                            "default_group_size": SIZE})
        cls.samples, cls.truth = samples(np.random.default_rng(11))
        cls.p.put(cls.samples)

    @classmethod
    def tearDownClass(cls):
        rc = cls.d.stop()
        if rc != 0:
            raise AssertionError("rollpackd exited with %s:\n%s" % (rc, cls.d.output()))

    def rewards(self, group):
        return {"%s-%d" % (group, i): {"reward": r} for i, r in enumerate(REWARDS[group])}

    def ranks(self):
        for dp in range(TOPO["dp"]):
            for cp in range(TOPO["cp"]):
                for pp in range(TOPO["pp"]):
                    yield (dp, cp, 0, pp)

    def check_step(self, step_id, estimator, ids, eps=1e-6):
        """Every rank's micro-batches against the truth and the reference;
        returns the sample ids seen (each rank of a DP x CP group sees its
        group's sequences)."""
        ref = reference(self.truth, ids, estimator, eps)
        seen = set()
        for rank in self.ranks():
            delivery = "proxy" if rank == (1, 1, 0, 1) else "auto"
            for mb in self.trainer.TrainerClient(self.d.address, step_id, rank, DEVICE,
                                                 delivery=delivery):
                what = "%s rank %s micro-batch %d" % (step_id, rank, mb.index)
                n = len(mb.sample_ids)
                self.assertEqual(mb.group_ids, [self.truth[s][0] for s in mb.sample_ids], what)
                self.assertEqual(mb.policy_versions.dtype, torch.int64)
                self.assertEqual(mb.policy_versions.tolist(),
                                 [self.truth[s][1] for s in mb.sample_ids], what)
                self.assertEqual(sorted(mb.scalars), ["acc", "reward"], what)
                for name, col in (("reward", 2), ("acc", 3)):
                    t = mb.scalars[name]
                    self.assertEqual((t.dtype, tuple(t.shape), t.device),
                                     (torch.float64, (n,), mb.cu_seqlens.device), what)
                    np.testing.assert_array_equal(
                        t.cpu().numpy(), [self.truth[s][col] for s in mb.sample_ids],
                        err_msg=what)
                if estimator is None:
                    self.assertIsNone(mb.advantages, what)
                else:
                    self.assertEqual((mb.advantages.dtype, tuple(mb.advantages.shape),
                                      mb.advantages.device),
                                     (torch.float32, (n,), torch.device(DEVICE)), what)
                    np.testing.assert_allclose(mb.advantages.cpu().numpy(),
                                               [ref[s] for s in mb.sample_ids], rtol=1e-6,
                                               atol=1e-6, err_msg=what)
                seen.update(mb.sample_ids)
        self.assertEqual(seen, set(ids))
        return seen

    def test_1_nothing_selectable_before_annotation(self):
        info = self.p.pool_info()
        self.assertEqual(list(info.options.required_scalars), ["reward"])
        self.assertEqual(info.num_unannotated_samples, GROUPS * SIZE)
        self.assertEqual(info.num_complete_groups, 0)
        with self.assertRaises(errors.RollpackError):
            self.c.create_step("early", "grpo", num_groups=1, topology=TOPO)
        with self.assertRaises(errors.FailedPrecondition) as cm:
            self.c.create_step("early", "grpo", sample_ids=["q0-0"], topology=TOPO)
        self.assertIn("q0-0", str(cm.exception))
        self.assertIn("reward", str(cm.exception))

    def test_2_annotate_then_grpo_on_every_rank(self):
        self.assertEqual(self.p.annotate({**self.rewards("q0"), **self.rewards("q1")}), 8)
        self.assertEqual(self.c.annotate("grpo", list(self.rewards("q2").items())), 4)
        # The same values again: no-ops, counted.
        self.assertEqual(self.p.annotate({"q0-0": {"reward": 1.0}}), 1)
        with self.assertRaises(errors.FailedPrecondition) as cm:
            self.p.annotate({"q0-0": {"reward": 0.5}})
        for part in ("q0-0", "reward", "0.5"):
            self.assertIn(part, str(cm.exception))
        with self.assertRaises(errors.NotFound) as cm:
            self.p.annotate({"q0-0": {"x": 1.0}, "nope": {"reward": 1.0}})
        self.assertIn("nope", str(cm.exception))
        with self.assertRaises(errors.InvalidArgument) as cm:
            self.c.annotate("grpo", [("q3-0", {"reward": 1.0}), ("q3-0", {"reward": 1.0})])
        self.assertIn("q3-0", str(cm.exception))
        info = self.p.pool_info()
        self.assertEqual((info.num_unannotated_samples, info.num_complete_groups), (SIZE, 3))
        # The last group from the CLI, as JSON lines on stdin.
        lines = "".join(json.dumps({"sample_id": s, "scalars": v}) + "\n"
                        for s, v in self.rewards("q3").items())
        res = cli("pool", "annotate", "grpo", "--server", self.d.address, "--from-jsonl", "-",
                  "--json", stdin=lines)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(json.loads(res.stdout)["annotated"], SIZE)
        res = cli("pool", "show", "grpo", "--server", self.d.address)
        self.assertIn("required reward; 0 sealed free samples still missing one", res.stdout)

        step = self.c.create_step("g1", "grpo", num_groups=GROUPS, topology=TOPO,
                                  advantage="grpo", reuse_samples=True)
        self.assertEqual(step.num_samples, GROUPS * SIZE)
        ids = list(self.truth)
        with self.assertRaises(errors.FailedPrecondition) as cm:
            self.p.annotate({"q1-0": {"late": 1.0}})
        self.assertIn("q1-0", str(cm.exception))
        self.assertIn("g1", str(cm.exception))
        self.check_step("g1", "grpo", ids)

        # What the controller reads back, and the CLI's plan view.
        ref = reference(self.truth, ids, "grpo")
        seqs = self.c.sequences("g1")
        self.assertEqual(sorted(s.sample_id for s in seqs), sorted(ids))
        for s in seqs:
            group, version, reward, acc = self.truth[s.sample_id]
            self.assertEqual((s.group_id, s.policy_version, s.scalars),
                             (group, version, {"acc": acc, "reward": reward}))
            self.assertAlmostEqual(s.advantage, ref[s.sample_id], places=5)
        res = cli("step", "plan", "g1", "--groups", "--server", self.d.address)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("groups: %d, sequences: %d" % (GROUPS, GROUPS * SIZE), res.stdout)
        rows = {line.split()[1]: line.split() for line in res.stdout.splitlines()
                if line.startswith("  q")}
        self.assertEqual(len(rows), GROUPS * SIZE)
        for sid, row in rows.items():  # GROUP SAMPLE VERSION MB acc reward ADVANTAGE
            self.assertEqual(row[0], self.truth[sid][0])
            self.assertAlmostEqual(float(row[5]), self.truth[sid][2])
            self.assertAlmostEqual(float(row[6]), ref[sid], places=4)
        res = cli("step", "plan", "g1", "--groups", "--json", "--server", self.d.address)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(len(json.loads(res.stdout)["sequences"]), GROUPS * SIZE)
        self.assertEqual(self.c.release("g1").returned_samples, GROUPS * SIZE)

        # The same samples again (their rewards stay), other estimators.
        res = cli("step", "create", "g2", "--pool", "grpo", "--num-groups", str(GROUPS),
                  "--advantage", "rloo", "--reuse-samples", "--server", self.d.address,
                  "--dp", "2", "--cp", "2", "--pp", "2", "--max-tokens-per-rank", "256")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertIn("advantage rloo of reward", res.stdout)
        self.check_step("g2", "rloo", ids)
        self.c.release("g2")
        self.c.create_step("g3", "grpo", num_groups=2, topology=TOPO, advantage="grpo_mean",
                           reuse_samples=True)
        g3 = [s.sample_id for s in self.c.sequences("g3")]
        self.check_step("g3", "grpo_mean", g3)
        self.c.release("g3")
        self.c.create_step("g4", "grpo", num_groups=GROUPS, topology=TOPO, advantage="grpo",
                           advantage_eps=0.5, reuse_samples=True)
        self.check_step("g4", "grpo", ids, eps=0.5)
        self.c.release("g4")
        self.c.create_step("g5", "grpo", num_groups=GROUPS, topology=TOPO, reuse_samples=True)
        self.check_step("g5", None, ids)
        self.c.release("g5")

    def test_3_estimator_refusals(self):
        self.p.annotate({**self.rewards("q0"), **self.rewards("q1"), **self.rewards("q2"),
                         **self.rewards("q3")})  # no-ops when test 2 ran first
        with self.assertRaises(errors.InvalidArgument):
            self.c.create_step("bad-eps", "grpo", num_groups=GROUPS, topology=TOPO,
                               advantage="grpo", advantage_eps=-1.0)
        with self.assertRaises(errors.FailedPrecondition) as cm:
            self.c.create_step("bad-scalar", "grpo", num_groups=GROUPS, topology=TOPO,
                               advantage="grpo", advantage_scalar="extra")
        self.assertIn("extra", str(cm.exception))
        with self.assertRaises(errors.FailedPrecondition) as cm:
            self.c.create_step("part", "grpo", sample_ids=["q0-0", "q0-1", "q0-2"],
                               topology=dict(TOPO, dp=1, cp=1, pp=1), advantage="grpo")
        self.assertIn("q0", str(cm.exception))
        self.assertEqual(self.c.steps("grpo"), [])


if __name__ == "__main__":
    unittest.main()
