"""Rollouts in pieces (docs/lifecycle.md, "Rollouts in pieces") against a
real durable rollpackd: a rollout written with Producer.rollout, killed
with SIGKILL between pieces and restarted, reaches the trainer with exactly
the bytes of the same rollout sent whole."""

import itertools
import os
import signal
import tempfile
import time
import unittest

import grpc
import numpy as np

from rollpack import errors
from rollpack._proto import scheduler_pb2, scheduler_pb2_grpc, trainer_pb2, trainer_pb2_grpc
from rollpack.producer import Producer
from rollpack.sample import Sample
from tests import engines as eng
from tests.rollpackd import Rollpackd

S = eng.SMALL
TOPO = scheduler_pb2.Topology(dp=1, max_tokens_per_rank=1 << 16)
_steps = itertools.count()


class Pieces(unittest.TestCase):
    def setUp(self):
        self.data = tempfile.TemporaryDirectory(prefix="rollpack-pieces-")
        self.addCleanup(self.data.cleanup)
        self.d = None
        self.start()

    def start(self):
        self.d = Rollpackd("--data-dir", self.data.name, "--fsync", "always")
        self.addCleanup(self.d.cleanup)
        self.d.start()
        self.channel = grpc.insecure_channel(self.d.address)
        self.addCleanup(self.channel.close)
        self.sched = scheduler_pb2_grpc.SchedulerStub(self.channel)
        self.trainer = trainer_pb2_grpc.TrainerStub(self.channel)

    def kill(self):
        self.d.proc.send_signal(signal.SIGKILL)
        self.d.proc.wait()
        self.d.stop()

    def producer(self, pool):
        p = Producer(self.d.address, pool, timeout=30)
        self.addCleanup(p.close)
        return p

    def fetch(self, pool, sample_id):
        step = "take-%d" % next(_steps)
        self.sched.CreateStep(scheduler_pb2.CreateStepRequest(
            step_id=step, pool=pool, sample_ids=[sample_id], topology=TOPO), timeout=30)
        mbs = list(self.trainer.FetchMicrobatches(trainer_pb2.FetchRequest(step_id=step),
                                                  timeout=30))
        self.assertEqual(len(mbs), 1)
        mb = mbs[0]
        return (mb.tokens.SerializeToString(), mb.replay_experts.SerializeToString(),
                mb.replay_mask.SerializeToString(),
                {k: v.SerializeToString() for k, v in mb.token_fields.items()})

    def test_a_rollout_in_pieces_survives_kill_9_and_equals_it_sent_whole(self):
        n = 60
        toks = eng.tokens(n, seed=3)
        truth = eng.routed(n - 1, S, seed=4)  # an engine routes all but the last token
        logp = np.linspace(-3, 0, n, dtype=np.float32)
        version = np.repeat(np.array([7, 8, 9], np.int32), 20)  # per-token policy version
        fields = lambda a, b: {"logprobs": logp[a:b], "token_version": version[a:b]}  # noqa: E731

        whole_pool = self.producer("whole")
        whole_pool.register_model(S)
        whole_pool.put(Sample("r", toks, truth, 0, token_fields=fields(0, n), policy_version=7,
                              group_id="q", group_size=1, scalars={"reward": 1.0}))

        p = self.producer("pieces")
        p.register_model(S)
        r = p.rollout("r", group_id="q", group_size=1, scalars={"reward": 1.0})
        # Turn 1: 20 tokens, rows for 19 (the last token is not routed yet).
        r.append(toks[:20], truth[:19], token_fields=fields(0, 20), policy_version=7)
        info = p.pool_info()
        self.assertEqual((info.num_open_samples, info.num_free_samples), (1, 0))
        with self.assertRaises(grpc.RpcError) as open_err:
            self.fetch("pieces", "r")
        self.assertEqual(open_err.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn('sample "r" is open', open_err.exception.details())
        # Turn 2 continues the rows where they stopped (row 19), after a weight update.
        r.append(toks[20:40], truth[19:39], token_fields=fields(20, 40), policy_version=8)

        # SIGKILL between pieces: both acknowledged pieces are durable.
        self.kill()
        self.start()
        p = self.producer("pieces")
        r.producer = p
        info = p.pool_info()
        self.assertEqual(info.num_open_samples, 1)
        # A re-send of an acknowledged piece is a duplicate, a gap is refused.
        dup = p.put(Sample("r", toks[20:40], truth[19:39], 19, token_fields=fields(20, 40),
                           policy_version=8, piece=1, partial=True))
        self.assertEqual(dup.duplicates, 1)
        with self.assertRaises(errors.FailedPrecondition) as gap:
            p.put(Sample("r", toks[40:], truth[39:], 39, token_fields=fields(40, n),
                         policy_version=9, piece=3))
        self.assertIn("the next is piece 2, got piece 3", str(gap.exception))

        r.seal(toks[40:], truth[39:], token_fields=fields(40, n), policy_version=9)
        info = p.pool_info()
        self.assertEqual((info.num_open_samples, info.num_free_samples,
                          info.num_complete_groups), (0, 1, 1))
        with self.assertRaises(errors.PayloadError):
            r.append(toks[:1])
        with self.assertRaises(errors.FailedPrecondition) as sealed:
            p.put(Sample("r", toks[:1], None, 0, piece=3, partial=True))
        self.assertIn('sample "r" is sealed (3 pieces)', str(sealed.exception))

        got, want = self.fetch("pieces", "r"), self.fetch("whole", "r")
        self.assertGreater(len(want[0]), 4 * n)
        self.assertGreater(len(want[1]), (n - 1) * S.topk)
        self.assertEqual(sorted(want[3]), ["logprobs", "token_version"])
        self.assertEqual(got, want)


class NeverFits(unittest.TestCase):
    def test_a_sample_or_piece_larger_than_max_memory_is_refused_at_once(self):
        d = Rollpackd("--max-memory", "40000")
        self.addCleanup(d.cleanup)
        d.start()
        p = Producer(d.address, "small", timeout=30, retry_for=None)  # would wait for ever
        self.addCleanup(p.close)
        p.register_model(S)
        n = 3000
        toks = eng.tokens(n, seed=1)
        truth = eng.routed(n - 1, S, seed=2)
        start = time.monotonic()
        with self.assertRaises(errors.FailedPrecondition) as whole:
            p.put(Sample("big", toks, truth, 0))
        self.assertIn('sample "big" takes', str(whole.exception))
        self.assertIn("more than --max-memory 40000: it can never be stored",
                      str(whole.exception))
        # The same rollout in pieces: refused at the piece that makes it too large.
        r = p.rollout("big-pieces")
        r.append(toks[:1000], truth[:999])
        with self.assertRaises(errors.FailedPrecondition):
            r.append(toks[1000:], truth[999:])
        self.assertLess(time.monotonic() - start, 10)
        self.assertEqual(p.pool_info().num_open_samples, 1)


if __name__ == "__main__":
    unittest.main()
