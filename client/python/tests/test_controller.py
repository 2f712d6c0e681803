"""The controller's tools (docs/operations.md, "Controller") against a real
rollpackd: rollpack.Controller and `python3 -m rollpack pool|step`, a
controller that lost its steps finding them again, and --step-ttl releasing
an abandoned step (counted in /metrics) but not one a trainer streams."""

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

import grpc

from rollpack import adapters as ad
from rollpack import errors
from rollpack._proto import trainer_pb2, trainer_pb2_grpc
from rollpack.controller import Controller
from rollpack.producer import Producer
from rollpack.sample import Sample
from tests import engines as eng
from tests.rollpackd import Rollpackd, read_port_file, scrape_metric

S = eng.SMALL
HERE = os.path.dirname(os.path.abspath(__file__))
TOPO = {"dp": 2, "max_tokens_per_rank": 1 << 16}
_pools = itertools.count()


def rollouts(prefix, count, n=40):
    out = []
    for i in range(count):
        toks = eng.tokens(n + i, seed=i)
        truth = eng.routed(n + i - 1, S, seed=i + 1)
        out.append(Sample("%s-%d" % (prefix, i), toks,
                          *ad.from_ndarray_dict(eng.ndarray_dict(truth), toks, S)))
    return out


def cli(*args):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    return subprocess.run([sys.executable, "-m", "rollpack"] + list(args), env=env,
                          capture_output=True, text=True, timeout=60)


class _Server(unittest.TestCase):
    ARGS = ()

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="rollpack-controller-")
        cls.addClassCleanup(cls.tmp.cleanup)
        port_file = os.path.join(cls.tmp.name, "metrics-port")
        cls.d = Rollpackd("--metrics-listen", "127.0.0.1:0", "--metrics-port-file", port_file,
                          *cls.ARGS)
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        cls.metrics_port = read_port_file(port_file)
        cls.c = Controller(cls.d.address, timeout=30)
        cls.addClassCleanup(cls.c.close)

    def pool(self, count):
        name = "ctl-%d" % next(_pools)
        p = Producer(self.d.address, name, timeout=30)
        self.addCleanup(p.close)
        p.register_model(S)
        p.put(rollouts(name, count))
        return name

    def metric(self, name):
        return scrape_metric(self.metrics_port, name)


class ControllerTools(_Server):
    def test_create_show_plan_list_release(self):
        pool = self.pool(6)
        info = self.c.create_step("ctl-a", pool, num_samples=4, topology=TOPO)
        self.assertEqual((info.step_id, info.num_samples), ("ctl-a", 4))
        shown = self.c.step("ctl-a")
        self.assertEqual((shown.pool, shown.num_samples, shown.topology.dp), (pool, 4, 2))
        self.assertLessEqual(abs(shown.created_unix_nanos / 1e9 - time.time()), 60)
        self.assertEqual((shown.streams_started, shown.streams_open), (0, 0))
        plan = self.c.plan("ctl-a")
        ids = sorted(i for mb in plan.microbatches for g in mb.groups for i in g.sample_ids)
        self.assertEqual(len(ids), 4)
        self.assertIn("ctl-a", [s.step_id for s in self.c.steps(pool)])
        self.assertEqual([p.pool for p in self.c.pools() if p.pool == pool], [pool])
        r = self.c.release("ctl-a")
        self.assertEqual(r.released_samples, 4)
        self.assertNotIn("ctl-a", [s.step_id for s in self.c.steps()])
        with self.assertRaises(errors.NotFound) as gone:
            self.c.step("ctl-a")
        self.assertIn('step "ctl-a" does not exist or was released', str(gone.exception))
        with self.assertRaises(errors.FailedPrecondition):
            self.c.create_step("ctl-b", pool, num_samples=3, topology=TOPO)

    def test_the_cli_does_the_same_with_json_and_tables(self):
        pool = self.pool(4)
        server = ["--server", self.d.address]
        out = cli("step", "create", "ctl-cli", "--pool", pool, "--num-samples", "2",
                  "--dp", "2", "--max-tokens-per-rank", "65536", *server)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("step ctl-cli: 2 samples", out.stdout)
        listed = cli("step", "list", "--pool", pool, "--json", *server)
        self.assertEqual(listed.returncode, 0, listed.stderr)
        steps = json.loads(listed.stdout)
        self.assertEqual([s["step_id"] for s in steps], ["ctl-cli"])
        self.assertEqual(int(steps[0]["num_samples"]), 2)
        table = cli("step", "list", *server)
        self.assertIn("ctl-cli", table.stdout)
        self.assertTrue(table.stdout.startswith("STEP"), table.stdout)
        plan = cli("step", "plan", "ctl-cli", *server)
        self.assertIn("micro-batch 0:", plan.stdout)
        pools = cli("pool", "list", "--json", *server)
        self.assertIn(pool, [p["pool"] for p in json.loads(pools.stdout)])
        shown = cli("pool", "--pool", pool, *server)  # the form before `pool show`
        self.assertIn("pool %s: model" % pool, shown.stdout)
        released = cli("step", "release", "ctl-cli", *server)
        self.assertIn("step ctl-cli released: 2 samples deleted", released.stdout)
        missing = cli("step", "show", "ctl-cli", *server)
        self.assertEqual(missing.returncode, 1)
        self.assertIn("NOT_FOUND", missing.stderr)
        usage = cli("step", "show", *server)
        self.assertEqual(usage.returncode, 2)
        # The id may also follow the options.
        late = cli("step", "show", *server, "ctl-cli")
        self.assertEqual(late.returncode, 1)
        self.assertIn('step "ctl-cli" does not exist', late.stderr)
        unknown_pool = cli("step", "list", "--pool", "no-such-pool", *server)
        self.assertEqual(unknown_pool.returncode, 1)
        self.assertIn("NOT_FOUND", unknown_pool.stderr)
        # The C++ `rollpack` binary forwards to the same commands.
        rollpack = os.path.join(os.path.dirname(self.d.exe), "rollpack")
        if os.access(rollpack, os.X_OK):
            forwarded = subprocess.run([rollpack, "pool", "list", *server], capture_output=True,
                                       text=True, timeout=60)
            self.assertEqual(forwarded.returncode, 0, forwarded.stderr)
            self.assertIn(pool, forwarded.stdout)

class StepTtl(_Server):
    ARGS = ("--step-ttl", "3s")

    def test_step_ttl_releases_an_abandoned_step_but_not_a_streamed_one(self):
        pool = self.pool(4)
        before = self.metric("rollpack_steps_expired_total")
        self.c.create_step("ctl-abandoned", pool, num_samples=2, topology=TOPO)
        self.c.create_step("ctl-busy", pool, num_samples=2, topology=TOPO)
        channel = grpc.insecure_channel(self.d.address)
        self.addCleanup(channel.close)
        stub = trainer_pb2_grpc.TrainerStub(channel)
        # A trainer keeps touching ctl-busy: each fetch is activity.
        deadline = time.monotonic() + 6
        fetches = 0
        while time.monotonic() < deadline:
            list(stub.FetchMicrobatches(trainer_pb2.FetchRequest(step_id="ctl-busy"), timeout=30))
            fetches += 1
            time.sleep(0.5)
        live = {s.step_id: s for s in self.c.steps(pool)}
        self.assertNotIn("ctl-abandoned", live)
        self.assertIn("ctl-busy", live)
        self.assertEqual(live["ctl-busy"].streams_started, fetches)
        self.assertEqual(live["ctl-busy"].streams_open, 0)
        self.assertEqual(self.metric("rollpack_steps_expired_total"), before + 1)
        # Its samples were released like any step's.
        self.assertEqual(self.c.pool(pool).num_samples, 2)
        self.c.release("ctl-busy")


if __name__ == "__main__":
    unittest.main()
