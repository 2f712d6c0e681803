"""Advantages and per-sequence metadata (lifecycle.md section 6, docs/layout.md
section 12) against a real rollpackd: GRPO groups put with reward scalars, a
step with an estimator, every rank fetched, each micro-batch's `advantages`
compared with a plain numpy reference of the estimator, and `group_ids`,
`policy_versions` and `scalars` with what was put; the same bytes after a
restart from the durable log; refusals that take nothing.

Micro-batches are read as the generated protobuf stubs parse them, so this
checks the server's wire bytes, not a client's view of them."""

import itertools
import unittest

import grpc
import numpy as np

from rollpack import adapters as ad
from rollpack._proto import (ndarray_pb2, scheduler_pb2, scheduler_pb2_grpc, trainer_pb2,
                             trainer_pb2_grpc)
from rollpack.producer import Producer
from rollpack.sample import Sample
from tests import engines as eng
from tests.rollpackd import Rollpackd
from tests.server_case import ServerTest

S = eng.SMALL
_pools = itertools.count()
# Every coordinate kind: 2 DP x 2 CP x 2 TP x 2 PP ranks.
TOPO = scheduler_pb2.Topology(dp=2, cp=2, tp=2, pp=2, max_tokens_per_rank=1 << 14)
GRPO = scheduler_pb2.ADVANTAGE_GRPO
GRPO_MEAN = scheduler_pb2.ADVANTAGE_GRPO_MEAN
RLOO = scheduler_pb2.ADVANTAGE_RLOO


def reference(rewards, estimator, eps=1e-6):
    """The estimator as a trainer would write it in numpy (float64, then float32)."""
    r = np.asarray(rewards, dtype=np.float64)
    if estimator == GRPO:
        a = (r - r.mean()) / (r.std() + eps)  # np.std: population (ddof=0)
    elif estimator == GRPO_MEAN:
        a = r - r.mean()
    elif estimator == RLOO:
        a = r - (r.sum() - r) / (len(r) - 1)
    else:
        raise AssertionError(estimator)
    return a.astype(np.float32)


def rollout(sample_id, n, group_id, group_size, version, scalars, seed):
    toks = eng.tokens(n, seed=seed)
    truth = eng.routed(n - 1, S, seed=seed + 1)
    return Sample(sample_id, toks, *ad.from_ndarray_dict(eng.ndarray_dict(truth), toks, S),
                  group_id=group_id, group_size=group_size, policy_version=version,
                  scalars=scalars)


def groups_of(sizes, seed):
    """{group id: [(sample id, reward, version, scalars)]}: rewards with ties, one
    group all equal (std 0), verifier-like 0/1 rewards in another."""
    rng = np.random.default_rng(seed)
    out = {}
    for g, size in enumerate(sizes):
        gid = "q%d" % g
        if g == 0:
            rewards = [0.75] * size
        elif g == 1:
            rewards = [float(x) for x in rng.integers(0, 2, size)]
        else:
            rewards = [float(x) for x in np.round(rng.normal(0, 3, size), 2)]
        members = []
        for i, reward in enumerate(rewards):
            scalars = {"reward": reward, "length_penalty": -0.01 * i}
            if i % 2 == 0:
                scalars["only_some"] = 1.0  # not on every sample: left out
            members.append(("%s-%d" % (gid, i), reward, g * 10 + i % 3, scalars))
        out[gid] = members
    return out


class Advantages(ServerTest):

    def pool(self, address, groups):
        name = "adv-%d" % next(_pools)
        p = Producer(address, name, timeout=30)
        self.addCleanup(p.close)
        p.register_model(S)
        samples = []
        for gid, members in groups.items():
            for k, (sid, _, version, scalars) in enumerate(members):
                samples.append(rollout(sid, 17 + 13 * k + len(samples) % 5, gid, len(members),
                                       version, scalars, seed=len(samples)))
        # Interleaved, so a step's order is not the groups' order.
        p.put(samples[::2] + samples[1::2])
        return p

    def fetch_all(self, trainer, step_id):
        """{(d, c, t, p): [Microbatch]} over every rank of TOPO."""
        out = {}
        for d, c, t, p in itertools.product(range(2), repeat=4):
            rank = trainer_pb2.RankCoords(dp=d, cp=c, tp=t, pp=p)
            out[(d, c, t, p)] = list(trainer.FetchMicrobatches(
                trainer_pb2.FetchRequest(step_id=step_id, rank=rank), timeout=60))
        return out

    def check_step(self, microbatches, groups, estimator, eps=1e-6):
        by_id = {sid: (gid, reward, version, scalars)
                 for gid, members in groups.items()
                 for sid, reward, version, scalars in members}
        want = {}
        for gid, members in groups.items():
            adv = reference([m[1] for m in members], estimator, eps)
            for (sid, _, _, _), a in zip(members, adv):
                want[sid] = a
        seen = set()
        for rank, mbs in microbatches.items():
            self.assertGreater(len(mbs), 0)
            for mb in mbs:
                ids = list(mb.sample_ids)
                n = len(ids)
                seen.update(ids)
                self.assertEqual(list(mb.group_ids), [by_id[i][0] for i in ids])
                self.assertEqual(list(mb.policy_versions), [by_id[i][2] for i in ids])
                self.assertEqual(sorted(mb.scalars), ["length_penalty", "reward"])
                for name, array in mb.scalars.items():
                    self.assertEqual(array.dtype, ndarray_pb2.FLOAT64)
                    self.assertEqual(list(array.shape), [n])
                    got = np.frombuffer(array.data, dtype="<f8")
                    np.testing.assert_array_equal(got, [by_id[i][3][name] for i in ids])
                self.assertTrue(mb.HasField("advantages"))
                self.assertEqual(mb.advantages.dtype, ndarray_pb2.FLOAT32)
                self.assertEqual(list(mb.advantages.shape), [n])
                got = np.frombuffer(mb.advantages.data, dtype="<f4")
                np.testing.assert_allclose(got, [want[i] for i in ids], rtol=2e-6, atol=1e-6,
                                           err_msg="rank %s micro-batch %d" % (rank, mb.index))
                # std 0: 0 / (0 + eps) = 0 exactly.
                for i, a in zip(ids, got):
                    if by_id[i][0] == "q0" and estimator != RLOO:
                        self.assertEqual(a, 0.0)
        self.assertEqual(seen, set(by_id))

    def create(self, step_id, pool, **kw):
        return self.sched.CreateStep(scheduler_pb2.CreateStepRequest(
            step_id=step_id, pool=pool, topology=TOPO, **kw), timeout=30)

    def test_every_estimator_matches_numpy_on_every_rank(self):
        sizes = [4, 8, 3, 16, 2, 5, 7, 6]
        for k, (estimator, eps) in enumerate([(GRPO, 0.0), (GRPO, 0.5), (GRPO_MEAN, 0.0),
                                              (RLOO, 0.0)]):
            with self.subTest(estimator=estimator, eps=eps):
                groups = groups_of(sizes, seed=k)
                p = self.pool(self.d.address, groups)
                step = "adv-%d" % k
                self.create(step, p.pool, num_groups=len(sizes), advantage=estimator,
                            advantage_eps=eps)
                self.check_step(self.fetch_all(self.trainer, step), groups, estimator,
                                eps or 1e-6)
                self.sched.ReleaseStep(scheduler_pb2.ReleaseStepRequest(step_id=step),
                                       timeout=30)

    def test_another_scalar_and_no_estimator(self):
        groups = groups_of([3, 3], seed=9)
        p = self.pool(self.d.address, groups)
        self.create("adv-len", p.pool, num_groups=2, advantage=GRPO_MEAN,
                    advantage_scalar="length_penalty", reuse_samples=True)
        for mbs in self.fetch_all(self.trainer, "adv-len").values():
            for mb in mbs:
                want = {sid: None for sid in mb.sample_ids}
                for gid, members in groups.items():
                    adv = reference([m[3]["length_penalty"] for m in members], GRPO_MEAN)
                    for (sid, _, _, _), a in zip(members, adv):
                        if sid in want:
                            want[sid] = a
                np.testing.assert_allclose(np.frombuffer(mb.advantages.data, "<f4"),
                                           [want[i] for i in mb.sample_ids], atol=1e-7)
        self.sched.ReleaseStep(scheduler_pb2.ReleaseStepRequest(step_id="adv-len"), timeout=30)
        # Without an estimator: ids, versions and scalars, no advantages.
        self.create("adv-none", p.pool, num_samples=6)
        for mbs in self.fetch_all(self.trainer, "adv-none").values():
            for mb in mbs:
                self.assertFalse(mb.HasField("advantages"))
                self.assertEqual(len(mb.group_ids), len(mb.sample_ids))
                self.assertEqual(sorted(mb.scalars), ["length_penalty", "reward"])

    def test_refusals_take_nothing(self):
        groups = groups_of([3, 1], seed=3)
        p = self.pool(self.d.address, groups)
        free = p.pool_info().num_free_samples
        cases = [
            (dict(num_samples=2, advantage=GRPO), grpc.StatusCode.FAILED_PRECONDITION,
             "has 2 of its 3 samples in the step"),
            (dict(num_groups=2, advantage=RLOO), grpc.StatusCode.FAILED_PRECONDITION,
             'group "q1" has 1 sample; ADVANTAGE_RLOO needs groups of at least 2'),
            (dict(num_groups=2, advantage=GRPO, advantage_scalar="missing"),
             grpc.StatusCode.FAILED_PRECONDITION, 'has no scalar "missing"'),
            (dict(num_groups=2, advantage=GRPO, advantage_eps=-1.0),
             grpc.StatusCode.INVALID_ARGUMENT, "advantage_eps is -1"),
            (dict(num_groups=2, advantage=GRPO, advantage_eps=float("nan")),
             grpc.StatusCode.INVALID_ARGUMENT, "advantage_eps is nan"),
            (dict(num_groups=2, advantage=7), grpc.StatusCode.INVALID_ARGUMENT,
             "advantage 7 is not an AdvantageEstimator"),
        ]
        for k, (kw, code, text) in enumerate(cases):
            with self.subTest(kw=kw):
                with self.assertRaises(grpc.RpcError) as err:
                    self.create("refused-%d" % k, p.pool, **kw)
                self.assertEqual(err.exception.code(), code, err.exception.details())
                self.assertIn(text, err.exception.details())
                self.assertEqual(p.pool_info().num_free_samples, free)
        # Every sample still free: the whole pool makes a step.
        self.create("after-refusals", p.pool, num_groups=2, advantage=GRPO)


class AdvantagesAfterRestart(unittest.TestCase):
    def test_a_step_replayed_from_the_log_sends_the_same_bytes(self):
        import tempfile
        data = tempfile.TemporaryDirectory(prefix="rollpack-adv-")
        self.addCleanup(data.cleanup)
        groups = groups_of([4, 2, 5], seed=5)
        before = None
        for attempt in range(2):
            d = Rollpackd("--data-dir", data.name)
            self.addCleanup(d.cleanup)
            d.start()
            channel = grpc.insecure_channel(d.address)
            try:
                trainer = trainer_pb2_grpc.TrainerStub(channel)
                if attempt == 0:
                    p = Producer(d.address, "durable", timeout=30)
                    p.register_model(S)
                    samples = []
                    for gid, members in groups.items():
                        for k, (sid, _, version, scalars) in enumerate(members):
                            samples.append(rollout(sid, 20 + 7 * k, gid, len(members), version,
                                                   scalars, seed=len(samples)))
                    p.put(samples)
                    p.close()
                    scheduler_pb2_grpc.SchedulerStub(channel).CreateStep(
                        scheduler_pb2.CreateStepRequest(
                            step_id="durable", pool="durable", topology=TOPO, num_groups=3,
                            advantage=RLOO), timeout=30)
                mbs = {}
                for d_, c, t, pp in itertools.product(range(2), repeat=4):
                    rank = trainer_pb2.RankCoords(dp=d_, cp=c, tp=t, pp=pp)
                    mbs[(d_, c, t, pp)] = [m.SerializeToString(deterministic=True) for m in
                                           trainer.FetchMicrobatches(trainer_pb2.FetchRequest(
                                               step_id="durable", rank=rank), timeout=60)]
            finally:
                channel.close()
                self.assertEqual(d.stop(), 0, d.output())
            if before is None:
                before = mbs
                parsed = [trainer_pb2.Microbatch.FromString(b) for v in mbs.values() for b in v]
                self.assertTrue(all(m.HasField("advantages") for m in parsed))
            else:
                self.assertEqual(mbs, before)


if __name__ == "__main__":
    unittest.main()
