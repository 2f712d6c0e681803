"""TrainerClient rides out a kill -9 and restart of a durable rollpackd
(issue 17), through librollpack_trainer.so on CPU torch:

- killed after 3 micro-batches, restarted 2 s later on the same port with the
  same --data-dir while the iteration keeps asking: it goes on, and every micro-batch
  equals, tensor by tensor, an uninterrupted read of the same rank; the
  restarted daemon served it a stream at start_index > 0
  (rollpack_stream_resumes_total), so the kill did cut the stream;
- a daemon that stays down: after ``resume_timeout`` the iteration raises
  ``rollpack.Unavailable`` whose ``resume_from`` (and message) name the
  first micro-batch not handed out; a new client at that ``start_index``
  completes the rank identically;
- the options' refusals.

Needs torch and librollpack_trainer.so (skips without them, unless
ROLLPACK_TRAINER_REQUIRED=1).
"""

import os
import tempfile
import threading
import time
import unittest

import grpc
import numpy as np

import rollpack
from rollpack import errors
from rollpack._proto import scheduler_pb2, scheduler_pb2_grpc
from tests.rollpackd import Rollpackd, read_port_file, scrape_metric
from tests.test_trainer import _need_trainer, make_samples

NUM_LAYERS, MOE, E, K = 16, list(range(16)), 64, 8
STEP = "st"
RANK = (0, 0, 0, 0)


def _snapshot(mb):
    """What a micro-batch holds, as plain bytes (compared across reads)."""
    arrays = [mb.tokens, mb.cu_seqlens, mb.cu_seqlens_padded, mb.replay_experts, mb.replay_mask,
              mb.replay_indices] + [mb.token_fields[n] for n in sorted(mb.token_fields)]
    return (mb.index, mb.num_microbatches, tuple(mb.sample_ids), tuple(mb.replay_layers),
            tuple((str(a.dtype), tuple(a.shape), a.numpy().tobytes()) for a in arrays))


class TrainerRestart(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.trainer = _need_trainer()

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="rollpack-restart-")
        self.addCleanup(self.tmp.cleanup)
        self.data = os.path.join(self.tmp.name, "data")
        os.mkdir(self.data)
        self.daemon = None

    def start(self, port=0):
        """rollpackd on self.data (durable), on `port` (0 = ephemeral)."""
        metrics_file = os.path.join(self.tmp.name, "metrics-port")
        if os.path.exists(metrics_file):
            os.remove(metrics_file)
        args = ["--data-dir", self.data, "--fsync", "always", "--metrics-listen", "127.0.0.1:0",
                "--metrics-port-file", metrics_file]
        if port:
            args += ["--listen", "127.0.0.1:%d" % port]  # the last --listen counts
        d = Rollpackd(*args)
        self.addCleanup(d.cleanup)
        d.start()
        self.daemon = d
        self.port = int(d.address.rsplit(":", 1)[1])
        self.metrics_port = read_port_file(metrics_file)
        if port:
            self.assertEqual(self.port, port)

    def kill(self):
        self.daemon.proc.kill()  # SIGKILL: nothing flushed, nothing closed cleanly
        self.daemon.proc.wait()

    def metric(self, name):
        return scrape_metric(self.metrics_port, name)

    def create_step(self):
        """A step whose bytes (~40 MB in ~1 MiB micro-batches) far exceed what
        gRPC's windows and the client's 8 MiB stream window buffer, so that a
        kill after the first few micro-batches cuts the stream; returns the
        rank's uninterrupted read."""
        spec = rollpack.ModelSpec("restart", num_layers=NUM_LAYERS, moe_layers=MOE,
                                  num_experts=E, topk=K)
        with rollpack.Producer(self.daemon.address, "pool") as p:
            p.register_model(spec)
            p.put(make_samples(np.random.default_rng(11), 192, NUM_LAYERS, MOE, E, K,
                               max_len=3000))
        with grpc.insecure_channel(self.daemon.address) as channel:
            topo = scheduler_pb2.Topology(dp=1, max_tokens_per_rank=8192)
            info = scheduler_pb2_grpc.SchedulerStub(channel).CreateStep(
                scheduler_pb2.CreateStepRequest(step_id=STEP, pool="pool", num_samples=192,
                                                topology=topo), timeout=60)
        self.assertGreaterEqual(info.num_microbatches, 18)
        reference = [_snapshot(mb) for mb in self.client()]
        self.assertGreater(sum(len(a[2]) for mb in reference for a in mb[-1]), 24 << 20)
        return reference

    def client(self, **kw):
        c = self.trainer.TrainerClient(self.daemon.address, STEP, RANK, "cpu", **kw)
        self.addCleanup(c.close)
        return c

    def test_iteration_survives_kill_and_restart_on_the_same_port(self):
        self.start()
        reference = self.create_step()
        port = self.port
        c = self.client(prefetch=1, resume_timeout=30)
        got = [_snapshot(next(c)) for _ in range(3)]
        self.kill()
        killed = time.monotonic()
        # The iteration goes on at once, as a training loop would: it drains
        # what was received and then waits in next() through the outage.
        failure = []

        def restart():
            try:
                time.sleep(2)
                self.start(port)
            except BaseException as e:  # reported by the main thread
                failure.append(e)

        restarter = threading.Thread(target=restart)
        restarter.start()
        try:
            got += [_snapshot(mb) for mb in c]
        finally:
            restarter.join()
        if failure:
            raise failure[0]
        self.assertLess(time.monotonic() - killed, 12, "the restarted daemon was found late")
        self.assertEqual(len(got), len(reference))
        for i, (a, b) in enumerate(zip(got, reference)):
            self.assertEqual(a, b, "micro-batch %d differs after the restart" % i)
        # The client resumed at a later micro-batch on the new daemon: the
        # kill cut its stream (this is not a read that was already buffered).
        self.assertGreaterEqual(self.metric("rollpack_stream_resumes_total"), 1)

    def test_budget_ends_iteration_with_resume_from(self):
        self.start()
        reference = self.create_step()
        port = self.port
        c = self.client(prefetch=1, resume_timeout=2)
        got = [_snapshot(next(c)) for _ in range(2)]
        self.kill()
        killed = time.monotonic()
        with self.assertRaises(errors.Unavailable) as cm:
            for mb in c:  # what arrived before the kill still comes out
                got.append(_snapshot(mb))
        waited = time.monotonic() - killed
        e = cm.exception
        self.assertLess(len(got), len(reference))
        self.assertEqual(e.resume_from, len(got))
        self.assertIsInstance(e.resume_from, int)
        self.assertIn("resume from micro-batch %d" % len(got), str(e))
        self.assertIn("resume_timeout 2s", str(e))
        self.assertGreaterEqual(waited, 2.0, "gave up before resume_timeout")
        self.assertLess(waited, 6.0, "kept trying past resume_timeout")

        # No resuming at all: fails at once, still naming where to resume.
        asked = time.monotonic()
        with self.assertRaises(errors.Unavailable) as cm:
            next(self.client(start_index=4, resume_timeout=0))
        self.assertEqual(cm.exception.resume_from, 4)
        self.assertLess(time.monotonic() - asked, 2.0)

        self.start(port)
        got += [_snapshot(mb) for mb in self.client(start_index=e.resume_from)]
        self.assertEqual(len(got), len(reference))
        for i, (a, b) in enumerate(zip(got, reference)):
            self.assertEqual(a, b, "micro-batch %d differs after resuming" % i)

    def test_other_errors_carry_resume_from_too(self):
        self.start()
        with self.assertRaises(errors.NotFound) as cm:
            next(self.client(start_index=3))
        self.assertEqual(cm.exception.resume_from, 3)
        self.assertIn("resume from micro-batch 3", str(cm.exception))

    def test_option_refusals(self):
        for kw, what in [(dict(resume_timeout=-1), "resume_timeout is -1"),
                         (dict(resume_timeout=1e9), "resume_timeout is 1000000000.0"),
                         (dict(max_resumes=-2), "max_resumes is -2")]:
            with self.assertRaises(ValueError) as cm:
                self.trainer.TrainerClient("127.0.0.1:1", STEP, RANK, "cpu", **kw)
            self.assertIn(what, str(cm.exception))


if __name__ == "__main__":
    unittest.main()
