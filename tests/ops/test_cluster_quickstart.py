"""docs/cluster.md's copy-paste commands, run as a reader would run them.

The one-host quick start block is run verbatim by bash in a network namespace
of its own (`unshare --net`: the fixed ports 2379, 50051-50053 and 9091-9093
cannot collide with anything else on the machine), with `build/bin` pointing
at the binaries under test and its scratch directory moved into a temporary
one. Every command in it must succeed; the test then checks what the reader
is told to expect: the samples stay on the members they were put to, and
member 3, which holds none, answers for the cluster. The Kubernetes block
cannot run here; the test checks that its token substitution leaves no
placeholder in the manifest it applies.
"""

import os
import re
import shutil
import subprocess
import unittest

import harness

DOC = os.path.join(harness.REPO, "docs", "cluster.md")
MARKER = "<!-- tests/ops/test_cluster_quickstart.py runs the next block"
K8S_MARKER = "<!-- tests/ops/test_cluster_quickstart.py checks that the sed below"
SCRATCH = "/tmp/rollpack-quickstart"


def read(path):
    with open(path) as f:
        return f.read()


def fenced_block_after(text, marker):
    at = text.index(marker)
    match = re.compile(r"```sh\n(.*?)```", re.S).search(text, at)
    if match is None:
        raise AssertionError("no ```sh block after %r in docs/cluster.md" % marker)
    return match.group(1)


def can_unshare():
    return subprocess.run(["unshare", "--net", "--pid", "--fork", "true"], capture_output=True).returncode == 0


class ClusterQuickstartTest(unittest.TestCase):
    def test_one_host_block_runs(self):
        if not can_unshare():
            self.skipTest("unshare --net is not permitted here (needs root or user namespaces)")
        rollpackd = harness.require_env_binary("ROLLPACKD")
        cli = harness.require_env_binary("ROLLPACK_CLI")
        harness.require_tool("etcd")
        block = fenced_block_after(read(DOC), MARKER)
        self.assertIn(SCRATCH, block, "the quick start's scratch directory moved: update the test")
        with harness.tempdir() as work:
            bin_dir = os.path.join(work, "build", "bin")
            os.makedirs(bin_dir)
            for exe in (rollpackd, cli):
                os.symlink(exe, os.path.join(bin_dir, os.path.basename(exe)))
            scratch = os.path.join(work, "scratch")
            script = os.path.join(work, "quickstart.sh")
            with open(script, "w") as f:
                f.write("set -euo pipefail\n" + block.replace(SCRATCH, scratch))
            # The reader's shell keeps the servers running; this one stops
            # them on its way out, and the PID namespace ends whatever is left
            # when it does. `source` (not `bash FILE`): the block's `&` jobs
            # are this shell's, as in the reader's; not under `||`, which
            # would switch off the block's `set -e`.
            runner = ("ip link set lo up; cd %s; trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT; "
                      "source %s" % (work, script))
            env = dict(os.environ)
            env.pop("ROLLPACK_SERVER", None)
            run = subprocess.run(["unshare", "--net", "--pid", "--fork", "bash", "-c", runner],
                                 env=env,
                                 capture_output=True, text=True, timeout=300)
            logs = ""
            for name in ("etcd.log", "member-1.log", "member-2.log", "member-3.log"):
                path = os.path.join(scratch, name)
                if os.path.exists(path):
                    logs += "\n--- %s (tail)\n%s" % (name, read(path)[-3000:])
            self.assertEqual(run.returncode, 0,
                             "the quick start failed:\n%s\n%s%s" % (run.stdout, run.stderr, logs))
        out = run.stdout
        # Half of the 16 rollouts on member 1, half on member 2, none on 3.
        self.assertEqual(out.count('"accepted": 8'), 2, out)
        self.assertIn("samples       16 (16 free", out)
        self.assertIn("member 127.0.0.1:50051: 8 samples", out)
        self.assertIn("member 127.0.0.1:50052: 8 samples", out)
        self.assertIn("member 127.0.0.1:50053: 0 samples", out)
        self.assertRegex(out, r"step s1: 16 samples \(\d+ tokens, 4 groups\)")
        self.assertIn("step s1 released: 16 samples deleted", out)
        # `rollpack cluster status`: three live members (LIVE, REACHABLE,
        # DRAINING, POOLS, SAMPLES, FREE), etcd reachable.
        for port, samples in ((50051, 8), (50052, 8), (50053, 0)):
            self.assertRegex(out, r"127\.0\.0\.1:%d( \*)?\s+yes\s+yes\s+no\s+%d\s+%d\s+%d\s"
                             % (port, 1 if samples else 0, samples, samples))
        self.assertRegex(out, r"etcd http://127\.0\.0\.1:2379: reachable")

    def test_kubernetes_block_replaces_every_token(self):
        block = fenced_block_after(read(DOC), K8S_MARKER)
        seds = re.findall(r'-e "s/(REPLACE-[\w-]+)/\$(\w+)/g?"', block)
        self.assertEqual(len(seds), 3, block)
        manifest = read(os.path.join(harness.REPO, "deploy", "kubernetes", "vllm-rollpackd.yaml"))
        for placeholder, _ in seds:
            self.assertIn(placeholder, manifest, "the manifest's placeholder changed")
            manifest = manifest.replace(placeholder, "x" * 48)
        self.assertNotIn("REPLACE-", manifest,
                         "a token placeholder of vllm-rollpackd.yaml is not in the docs' sed")
        for f in ("certificates.yaml", "etcd.yaml", "vllm-rollpackd.yaml", "monitoring.yaml"):
            self.assertIn("deploy/kubernetes/" + f, block)
            self.assertTrue(os.path.exists(os.path.join(harness.REPO, "deploy", "kubernetes", f)))


if __name__ == "__main__":
    unittest.main()
