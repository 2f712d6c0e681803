"""The sample lifecycle (docs/lifecycle.md) against a real rollpackd: the
GRPO, async-with-staleness and PPO multi-epoch loops of the docs, end to
end, and `python3 -m rollpack pool`."""

import itertools
import json
import os
import subprocess
import sys
import unittest

import grpc

from rollpack import adapters as ad
from rollpack import errors
from rollpack._proto import rollouts_pb2, scheduler_pb2
from rollpack.producer import Producer
from rollpack.sample import Sample
from tests import engines as eng
from tests.server_case import ServerTest

S = eng.SMALL
HERE = os.path.dirname(os.path.abspath(__file__))
_pools = itertools.count()
TOPO = scheduler_pb2.Topology(dp=2, max_tokens_per_rank=1 << 16)


def rollout(sample_id, n, *, group_id="", group_size=0, version=0, seed=0):
    toks = eng.tokens(n, seed=seed)
    truth = eng.routed(n - 1, S, seed=seed + 1)
    return Sample(sample_id, toks, *ad.from_ndarray_dict(eng.ndarray_dict(truth), toks, S),
                  group_id=group_id, group_size=group_size, policy_version=version)


class Lifecycle(ServerTest):

    def pool(self, **options):
        name = "life-%d" % next(_pools)
        p = Producer(self.d.address, name, timeout=30)
        self.addCleanup(p.close)
        p.register_model(S, options=options or None)
        return p

    def create(self, pool, step_id, **kw):
        return self.sched.CreateStep(scheduler_pb2.CreateStepRequest(
            step_id=step_id, pool=pool, topology=TOPO, **kw), timeout=30)

    def release(self, step_id):
        return self.sched.ReleaseStep(scheduler_pb2.ReleaseStepRequest(step_id=step_id),
                                      timeout=30)

    def test_grpo_steps_take_whole_groups_in_completion_order(self):
        p = self.pool()
        # 3 prompts x 4 samples, arriving interleaved; prompt "q1" completes first.
        order = [("q0", 0), ("q1", 0), ("q1", 1), ("q2", 0), ("q1", 2), ("q1", 3),
                 ("q0", 1), ("q0", 2), ("q2", 1), ("q0", 3)]
        p.put([rollout("%s-%d" % (q, i), 20 + i, group_id=q, group_size=4, seed=i)
               for q, i in order])
        info = p.pool_info()
        self.assertEqual((info.num_complete_groups, info.num_incomplete_groups), (2, 1))
        step = self.create(p.pool, "grpo-1", num_groups=2)
        self.assertEqual((step.num_samples, step.num_groups), (8, 2))
        plan = self.sched.GetPlan(scheduler_pb2.GetPlanRequest(step_id="grpo-1"), timeout=30)
        ids = sorted(i for mb in plan.microbatches for g in mb.groups for i in g.sample_ids)
        self.assertEqual(ids, sorted(["q1-%d" % i for i in range(4)] +
                                     ["q0-%d" % i for i in range(4)]))
        # Only the incomplete q2 is left: no whole group to take, and naming
        # part of it is refused with how many are missing.
        with self.assertRaises(grpc.RpcError) as e:
            self.create(p.pool, "grpo-2", num_groups=1)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        with self.assertRaises(grpc.RpcError) as e:
            self.create(p.pool, "grpo-2", sample_ids=["q2-0"], whole_groups=True)
        self.assertIn('group "q2" is not covered whole: 3 of its 4 samples are missing',
                      e.exception.details())
        # A sample more than its group holds is refused by name.
        with self.assertRaises(errors.InvalidArgument) as e:
            p.put([rollout("q1-extra", 9, group_id="q1", group_size=4)])
        self.assertIn('group "q1" already has 4 samples', str(e.exception))
        self.release("grpo-1")

    def test_async_loop_with_a_staleness_bound_drops_and_counts(self):
        p = self.pool(max_staleness=1, drop_stale=True)
        p.put([rollout("v%d-%d" % (v, i), 16, version=v, seed=i) for v in (1, 2, 3)
               for i in range(2)])
        info = self.sched.SetPolicyVersion(scheduler_pb2.SetPolicyVersionRequest(
            pool=p.pool, policy_version=3), timeout=30)
        self.assertEqual((info.policy_version, info.num_stale_dropped, info.num_samples),
                         (3, 2, 4))
        # Newest version first; CreateStep may carry the version too.
        step = self.create(p.pool, "async-1", num_samples=2, policy_version=3,
                           selection=scheduler_pb2.NEWEST_VERSION)
        plan = self.sched.GetPlan(scheduler_pb2.GetPlanRequest(step_id="async-1"), timeout=30)
        ids = sorted(i for mb in plan.microbatches for g in mb.groups for i in g.sample_ids)
        self.assertEqual(ids, ["v3-0", "v3-1"])
        self.assertEqual(step.num_tokens, 32)
        self.release("async-1")
        # A token budget: refused when the free samples do not reach it,
        # else samples in order while the total stays within it.
        with self.assertRaises(grpc.RpcError) as e:
            self.create(p.pool, "async-2", num_tokens=33)
        self.assertIn("has 32 tokens in 2 free samples, num_tokens 33 requested",
                      e.exception.details())
        step = self.create(p.pool, "async-2", num_tokens=32)
        self.assertEqual((step.num_samples, step.num_tokens), (2, 32))
        self.release("async-2")

    def test_ppo_epochs_reuse_the_batch_until_max_uses(self):
        p = self.pool(max_uses=2)
        p.put([rollout("b%d" % i, 24, seed=i) for i in range(4)])
        for epoch in range(2):
            step = self.create(p.pool, "ppo-%d" % epoch, num_samples=4, reuse_samples=True)
            self.assertTrue(step.reuse_samples)
            r = self.release("ppo-%d" % epoch)
            self.assertEqual((r.returned_samples, r.released_samples),
                             (4, 0) if epoch == 0 else (0, 4))
        self.assertEqual(p.pool_info().num_samples, 0)

    def test_options_are_fixed_and_the_cli_shows_groups_and_versions(self):
        p = self.pool(default_group_size=2, max_staleness=4)
        with self.assertRaises(errors.FailedPrecondition):
            p.register_model(S, options={"default_group_size": 3})
        p.put([rollout("a", 8, group_id="g"), rollout("b", 8, group_id="g", version=7)])
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
        out = subprocess.run([sys.executable, "-m", "rollpack", "pool", "--server",
                              self.d.address, "--pool", p.pool], capture_output=True, text=True,
                             env=env, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("groups        1 complete, 0 incomplete", out.stdout)
        self.assertIn("max_staleness 4", out.stdout)
        out = subprocess.run([sys.executable, "-m", "rollpack", "pool", "--server",
                              self.d.address, "--pool", p.pool, "--json"], capture_output=True,
                             text=True, env=env, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        info = json.loads(out.stdout)
        self.assertEqual(info["options"]["default_group_size"], 2)
        self.assertEqual(info["num_complete_groups"], "1")


if __name__ == "__main__":
    unittest.main()
