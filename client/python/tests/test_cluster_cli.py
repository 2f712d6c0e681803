"""`rollpack cluster status` and `rollpack member drain|undrain` (docs/cluster.md,
"Operating a cluster") driven as an operator would: a single rollpackd, then
a real etcd and two members, one drained with --wait while a step empties
it."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from rollpack import errors
from rollpack.controller import Controller
from rollpack.producer import Producer
from tests import engines as eng
from tests.rollpackd import ETCD, Rollpackd, start_etcd
from tests.test_controller import TOPO, rollouts

HERE = os.path.dirname(os.path.abspath(__file__))


def cli(*args, wait=True):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    command = [sys.executable, "-m", "rollpack"] + list(args)
    if not wait:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


class SingleServer(unittest.TestCase):
    def test_status_lists_itself_and_drain_is_refused(self):
        with Rollpackd() as d:
            r = cli("cluster", "status", "--server", d.address, "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            status = json.loads(r.stdout)
            self.assertFalse(status["cluster_mode"])
            self.assertEqual([(m["member"], m["self"], m["live"], m["draining"])
                              for m in status["members"]], [(d.address, True, True, False)])
            r = cli("cluster", "status", "--server", d.address)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("single server %s" % d.address, r.stdout)
            r = cli("member", "drain", d.address, "--server", d.address)
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn("not in cluster mode", r.stderr)
            r = cli("member", "drain", "--server", d.address)
            self.assertEqual(r.returncode, 2, r.stderr)


@unittest.skipUnless(os.access(ETCD, os.X_OK), "%s (Debian's etcd-server) is not installed" % ETCD)
class TwoMembers(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.mkdtemp(prefix="rollpack-drain-")
        self.addCleanup(shutil.rmtree, tmp, True)
        url = start_etcd(self, tmp)
        self.members = []
        for _ in range(2):
            d = Rollpackd("--cluster-etcd", url, "--cluster-name", "drain-cli",
                          "--cluster-lease-seconds", "2")
            self.addCleanup(d.cleanup)
            d.start()
            self.members.append(d)

    def test_drain_wait_follows_a_step_emptying_the_member(self):
        a, b = (d.address for d in self.members)
        p = Producer(b, "pool", timeout=30)
        self.addCleanup(p.close)
        p.register_model(eng.SMALL)
        p.put(rollouts("b", 4))
        pa = Producer(a, "pool", timeout=30)
        self.addCleanup(pa.close)
        pa.put(rollouts("a", 2))

        r = cli("cluster", "status", "--server", a)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0].split()[:4], ["MEMBER", "LIVE", "REACHABLE", "DRAINING"])
        rows = {line.split()[0]: line.split()[1:] for line in lines[1:3]}
        self.assertEqual(rows[a][:7], ["*", "yes", "yes", "no", "1", "2", "2"])
        self.assertEqual(rows[b][:6], ["yes", "yes", "no", "1", "4", "4"])
        self.assertTrue(lines[3].startswith("etcd http://127.0.0.1:"), lines[3])

        waiting = cli("member", "drain", b, "--server", a, "--wait", "--poll-interval", "0.1",
                      "--wait-timeout", "60", wait=False)
        self.addCleanup(waiting.kill)
        self.assertEqual(waiting.stdout.readline().split()[:3], ["member", b, "drained:"])
        self.assertEqual(waiting.stdout.readline().strip(),
                         "member %s draining: 4 free samples, 0 live steps left" % b)
        # b refuses new samples, naming itself; a steps takes b's first.
        with self.assertRaises(errors.RollpackError) as refused:
            Producer(b, "pool", timeout=5, retry_for=0).put(rollouts("late", 1))
        self.assertIn("member %s is drained for maintenance" % b, str(refused.exception))
        with Controller(a, timeout=30) as c:
            c.create_step("s1", "pool", num_samples=4, topology=TOPO)
            self.assertEqual(sorted(sid[0] for mb in c.plan("s1").microbatches
                                    for g in mb.groups for sid in g.sample_ids), ["b"] * 4)
            # --wait reports the step holding b's samples, then b empty.
            self.assertEqual(waiting.stdout.readline().strip(),
                             "member %s draining: 0 free samples, 1 live steps left" % b)
            c.release("s1")
        out, err = waiting.communicate(timeout=30)
        self.assertEqual(waiting.returncode, 0, err)
        self.assertEqual(out.strip(), "member %s drained: 0 free samples, 0 live steps: safe to "
                         "stop" % b)

        r = cli("cluster", "status", "--server", b, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        drained = [m for m in json.loads(r.stdout)["members"] if m["draining"]]
        self.assertEqual([(m["member"], m["self"], m["num_free_samples"]) for m in drained],
                         [(b, True, "0")])
        r = cli("member", "undrain", b, "--server", a)
        self.assertEqual((r.returncode, r.stdout.strip()),
                         (0, "member %s undrained: it accepts new samples" % b), r.stderr)
        Producer(b, "pool", timeout=30).put(rollouts("back", 1))


if __name__ == "__main__":
    unittest.main()
