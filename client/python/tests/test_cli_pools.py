"""`rollpack pool samples` and `rollpack pool delete` (docs/operations.md,
"Deleting a pool" and "A pool's samples") and the Controller methods under
them, against a real rollpackd: a table and JSON in sample id order with
filters and a limit, a deletion that asks on a terminal, refuses without
--yes elsewhere, refuses live steps unless --force, frees the pool's memory
and metric series, and leaves the name free for another model."""

import itertools
import json
import os
import subprocess
import sys
import tempfile
import unittest
import urllib.request

from rollpack import adapters as ad
from rollpack import errors
from rollpack.controller import Controller
from rollpack.producer import Producer
from rollpack.sample import Sample
from rollpack.spec import ModelSpec
from tests import engines as eng
from tests.rollpackd import Rollpackd, read_port_file

S = eng.SMALL
HERE = os.path.dirname(os.path.abspath(__file__))
TOPO = {"dp": 1, "max_tokens_per_rank": 1 << 16}
_pools = itertools.count()


def cli(*args, stdin=None):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    return subprocess.run([sys.executable, "-m", "rollpack"] + list(args), env=env, input=stdin,
                          capture_output=True, text=True, timeout=60)


def cli_on_terminal(answer, *args):
    """The CLI with a pseudo-terminal as stdin, answering `answer`."""
    master, slave = os.openpty()
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    proc = subprocess.Popen([sys.executable, "-m", "rollpack"] + list(args), env=env,
                            stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    os.close(slave)
    os.write(master, (answer + "\n").encode())
    out, err = proc.communicate(timeout=60)
    os.close(master)
    return proc.returncode, out, err


class PoolCommands(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="rollpack-cli-pools-")
        cls.addClassCleanup(cls.tmp.cleanup)
        port_file = os.path.join(cls.tmp.name, "metrics-port")
        cls.d = Rollpackd("--metrics-listen", "127.0.0.1:0", "--metrics-port-file", port_file)
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        cls.metrics_port = read_port_file(port_file)
        cls.c = Controller(cls.d.address, timeout=30)
        cls.addClassCleanup(cls.c.close)
        cls.server = ["--server", cls.d.address]

    @classmethod
    def tearDownClass(cls):
        rc = cls.d.stop()
        if rc != 0:
            raise AssertionError("rollpackd exited with %s on SIGTERM:\n%s" % (rc, cls.d.output()))

    def pool(self, count, spec=S):
        """A pool of `count` samples "<pool>-<k>", in groups of 2, stored in
        reverse id order, with reward k."""
        name = "cp-%d" % next(_pools)
        with Producer(self.d.address, name, timeout=30) as p:
            p.register_model(spec)
            samples = []
            for k in reversed(range(count)):
                toks = eng.tokens(20 + k, seed=k)
                truth = eng.routed(19 + k, S, seed=k + 1)
                samples.append(Sample("%s-%02d" % (name, k), toks,
                                      *ad.from_ndarray_dict(eng.ndarray_dict(truth), toks, S),
                                      group_id="g%d" % (k // 2), group_size=2,
                                      policy_version=k, scalars={"reward": float(k)}))
            p.put(samples)
        return name

    def metrics_text(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port,
                                    timeout=10) as r:
            return r.read().decode()

    def test_samples_table_json_filters_and_pages(self):
        pool = self.pool(7)
        ids = ["%s-%02d" % (pool, k) for k in range(7)]
        # The iterator crosses pages (3 per call) in id order.
        listed = list(self.c.samples(pool, page_size=3))
        self.assertEqual([s.sample_id for s in listed], ids)
        self.assertEqual([s.num_tokens for s in listed], [20 + k for k in range(7)])
        self.assertEqual(listed[3].group_id, "g1")
        self.assertEqual(listed[3].scalars["reward"], 3.0)
        self.c.create_step("cp-step", pool, sample_ids=[ids[0], ids[1]], topology=TOPO)
        self.addCleanup(self.c.release, "cp-step")

        table = cli("pool", "samples", pool, *self.server)
        self.assertEqual(table.returncode, 0, table.stderr)
        lines = table.stdout.splitlines()
        self.assertEqual(lines[0].split(), ["SAMPLE", "TOKENS", "GROUP", "VERSION", "STATE",
                                            "SCALARS", "OWNER"])
        self.assertEqual([l.split()[0] for l in lines[1:]], ids)
        self.assertIn("held (cp-step)", lines[1])
        self.assertIn("g0/2", lines[1])
        self.assertIn("reward=6", lines[7])

        held = cli("pool", "samples", pool, "--state", "held", "--json", *self.server)
        self.assertEqual(held.returncode, 0, held.stderr)
        rows = json.loads(held.stdout)
        self.assertEqual([r["sample_id"] for r in rows], ids[:2])
        self.assertEqual({r["step_id"] for r in rows}, {"cp-step"})
        group = cli("pool", "samples", pool, "--group", "g2", "--json", *self.server)
        self.assertEqual([r["sample_id"] for r in json.loads(group.stdout)], ids[4:6])
        limited = cli("pool", "samples", pool, "--state", "free", "--limit", "2", "--json",
                      *self.server)
        self.assertEqual([r["sample_id"] for r in json.loads(limited.stdout)], ids[2:4])
        missing = cli("pool", "samples", "no-such-pool", *self.server)
        self.assertEqual(missing.returncode, 1)
        self.assertIn("NOT_FOUND", missing.stderr)
        with self.assertRaises(ValueError):
            next(self.c.samples(pool, state="gone"))

    def test_delete_asks_refuses_live_steps_and_frees_the_name(self):
        pool = self.pool(4)
        self.assertIn('rollpack_pool_bytes{pool="%s"}' % pool, self.metrics_text())
        before = self.c.pool(pool).server_stored_bytes
        self.c.create_step("cp-live", pool, num_samples=1, topology=TOPO)

        # No terminal and no --yes: nothing is deleted.
        piped = cli("pool", "delete", pool, *self.server, stdin="y\n")
        self.assertEqual(piped.returncode, 2)
        self.assertIn("pass --yes", piped.stderr)
        # A live step: refused, naming it.
        refused = cli("pool", "delete", pool, "--yes", *self.server)
        self.assertEqual(refused.returncode, 1)
        self.assertIn("FAILED_PRECONDITION", refused.stderr)
        self.assertIn('step "cp-live"', refused.stderr)
        # On a terminal it asks; "n" keeps the pool.
        rc, out, _ = cli_on_terminal("n", "pool", "delete", pool, "--force", *self.server)
        self.assertEqual(rc, 1)
        self.assertIn("delete pool %s: 4 samples" % pool, out)
        self.assertIn("releasing steps cp-live", out)
        self.assertEqual(self.c.pool(pool).num_samples, 4)

        rc, out, err = cli_on_terminal("y", "pool", "delete", pool, "--force", *self.server)
        self.assertEqual(rc, 0, err)
        # The released step's sample went with its release; the pool's 3 others now.
        self.assertIn("pool %s deleted: 3 samples" % pool, out)
        self.assertIn("steps released first: cp-live", out)
        with self.assertRaises(errors.NotFound):
            self.c.pool(pool)
        with self.assertRaises(errors.NotFound):
            self.c.step("cp-live")
        text = self.metrics_text()
        self.assertNotIn('pool="%s"' % pool, text)
        with self.assertRaises(errors.NotFound):
            self.c.delete_pool(pool)

        # The name takes another model; the memory went.
        other = ModelSpec("other-moe", num_layers=S.num_layers, moe_layers=list(S.moe_layers),
                          num_experts=S.num_experts, topk=S.topk)
        with Producer(self.d.address, pool, timeout=30) as p:
            self.assertTrue(p.register_model(other))
            info = p.pool_info()
        self.assertEqual((info.model.name, info.num_samples), ("other-moe", 0))
        self.assertLess(info.server_stored_bytes, before)
        r = self.c.delete_pool(pool, dry_run=True)
        self.assertEqual((r.deleted_samples, r.dry_run), (0, True))
        done = cli("pool", "delete", pool, "--yes", "--json", *self.server)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(json.loads(done.stdout)["pool"], pool)


if __name__ == "__main__":
    unittest.main()
