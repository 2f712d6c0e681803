"""`rollpack step show STEP` (rollpack/_cli_steps.py, docs/operations.md,
"Controller"): the detail view of one step, not `step list`'s row again:
its settings, stage_layers, per-rank micro-batches and tokens and the plan
picture, from a hand-made plan (exact text) and from a real rollpackd."""

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

from rollpack import _cli_steps
from rollpack._proto import scheduler_pb2
from rollpack.controller import Controller
from rollpack.producer import Producer
from rollpack.sample import Sample
from rollpack import adapters as ad
from tests import engines as eng
from tests.rollpackd import Rollpackd

S = eng.SMALL
HERE = os.path.dirname(os.path.abspath(__file__))


def cli(*args):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    return subprocess.run([sys.executable, "-m", "rollpack"] + list(args), env=env,
                          capture_output=True, text=True, timeout=60)


def hand_made():
    """A step of dp 2 x cp 2 over 2 micro-batches; one holder per member."""
    topo = scheduler_pb2.Topology(dp=2, cp=2, tp=1, pp=2, max_tokens_per_rank=100)
    plan = scheduler_pb2.Plan(step_id="s1", pool="p", topology=topo)
    plan.stats.min_microbatches = 2
    plan.stats.rank_imbalance = 1.25
    plan.stats.padding_overhead = 0.05
    mb0 = plan.microbatches.add(index=0)
    mb0.groups.add(first_rank=0, cp_size=2, sample_ids=["a"], tokens_per_rank=100)
    mb0.groups.add(first_rank=2, cp_size=1, sample_ids=["b"], tokens_per_rank=45)
    mb0.groups.add(first_rank=3, cp_size=1, sample_ids=["c"], tokens_per_rank=5)
    mb1 = plan.microbatches.add(index=1)
    mb1.groups.add(first_rank=0, cp_size=1, sample_ids=["d"], tokens_per_rank=10)
    info = scheduler_pb2.StepInfo(step_id="s1", pool="p", num_samples=4, num_tokens=260,
                                  num_groups=1, num_microbatches=2, topology=topo,
                                  reuse_samples=True, advantage=1, created_unix_nanos=int(
                                      (1000 - 30) * 1e9))
    info.stage_layers.add(pp_rank=0, layers=[0, 1], replay_layers=[1])
    info.stage_layers.add(pp_rank=1, layers=[2, 3], replay_layers=[2, 3])
    info.holders.add(member="10.0.0.1:50051", num_samples=3, num_tokens=200)
    info.holders.add(member="10.0.0.2:50051", num_samples=1, num_tokens=60)
    return info, plan


class ShowLines(unittest.TestCase):
    def test_every_part_of_the_detail_view(self):
        info, plan = hand_made()
        lines = _cli_steps.show_lines(info, plan, now=1000)
        self.assertEqual(lines, [
            "step s1",
            "  pool          p",
            "  topology      dp2 cp2 tp1 pp2, 100 tokens per rank",
            "  samples       4 (260 tokens, 1 complete groups)",
            "  micro-batches 2 per rank (lower bound 2), imbalance 1.250, padding 5.0%",
            "  age           30s; trainer streams 0 open / 0 started here, last never",
            "  made with     reuse_samples (released samples go back to the free set), "
            "replay rollout, advantage grpo of reward",
            "  stage pp0     layers [0, 1], replays [1]",
            "  stage pp1     layers [2, 3], replays [2, 3]",
            "  held by       2 members",
            "    10.0.0.1:50051  3 samples, 200 tokens",
            "    10.0.0.2:50051  1 samples, 60 tokens",
            "  per rank      micro-batches with tokens 1..2; tokens 5..110 (mean 65, "
            "max/mean 1.692)",
            "    dp0    cp0: 2 mbs 110 tok  cp1: 1 mbs 100 tok",
            "    dp1    cp0: 1 mbs 45 tok  cp1: 1 mbs 5 tok",
            "  plan          one line per micro-batch, one character per dp x cp rank "
            "(tenths of max_tokens_per_rank: 1-9, # full, . none)",
            "  mb 0 |##51|",
            "  mb 1 |1...|",
        ])

    def test_a_large_plan_stays_a_screen(self):
        topo = scheduler_pb2.Topology(dp=200, cp=1, max_tokens_per_rank=10)
        plan = scheduler_pb2.Plan(step_id="big", topology=topo)
        for i in range(40):
            plan.microbatches.add(index=i).groups.add(first_rank=i, cp_size=1, tokens_per_rank=10)
        pic = _cli_steps.picture(plan)
        self.assertEqual(len(pic), _cli_steps.MAX_PICTURE_ROWS + 1)
        self.assertTrue(pic[0].endswith("| +%d ranks" % (200 - _cli_steps.MAX_PICTURE_RANKS)),
                        pic[0])
        self.assertEqual(pic[-1], "  ... 8 more micro-batches")


class AgainstRollpackd(unittest.TestCase):
    def test_step_show_reads_the_step_and_its_plan(self):
        tmp = tempfile.TemporaryDirectory(prefix="rollpack-step-show-")
        self.addCleanup(tmp.cleanup)
        d = Rollpackd()
        self.addCleanup(d.cleanup)
        d.start()
        p = Producer(d.address, "show", timeout=30)
        self.addCleanup(p.close)
        p.register_model(S)
        samples = []
        for i in range(6):
            toks = eng.tokens(30 + i, seed=i)
            truth = eng.routed(30 + i - 1, S, seed=i + 1)
            samples.append(Sample("r-%d" % i, toks,
                                  *ad.from_ndarray_dict(eng.ndarray_dict(truth), toks, S)))
        p.put(samples)
        server = ["--server", d.address]
        made = cli("step", "create", "shown", "--pool", "show", "--num-samples", "6", "--dp", "2",
                   "--pp", "2", "--max-tokens-per-rank", "4096", *server)
        self.assertEqual(made.returncode, 0, made.stderr)
        shown = cli("step", "show", "shown", *server)
        self.assertEqual(shown.returncode, 0, shown.stderr)
        out = shown.stdout
        self.assertTrue(out.startswith("step shown\n  pool          show\n"), out)
        self.assertIn("  samples       6 (", out)
        self.assertIn("  stage pp0     layers [", out)
        self.assertIn("  stage pp1     layers [", out)
        self.assertIn("  per rank      micro-batches with tokens", out)
        self.assertIn("  mb 0 |", out)
        self.assertNotIn("STEP", out)  # not the list row
        as_json = json.loads(cli("step", "show", "shown", "--json", *server).stdout)
        self.assertEqual(as_json["step"]["step_id"], "shown")
        self.assertEqual(len(as_json["step"]["stage_layers"]), 2)
        self.assertIn("microbatches", as_json["plan"])
        # ListSteps' StepInfo carries stage_layers too (it used to be cleared).
        with Controller(d.address, timeout=30) as c:
            listed = c.steps("show")
            self.assertEqual([len(s.stage_layers) for s in listed], [2])


if __name__ == "__main__":
    unittest.main()
