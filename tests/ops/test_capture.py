"""The capture port as an operator and a rollout worker meet it: the stand-in vLLM server
(testing/standin_engine.py), a rollpackd with --capture-* in front of it, a real Prometheus
scraping rollpackd, and docs/examples/capture_quickstart.py (standard library only) as the
rollout worker. Checks the example's own report, then the capture metrics through
Prometheus's query API."""

import json
import os
import subprocess
import sys
import unittest

import harness

STANDIN = os.path.join(harness.REPO, "testing", "standin_engine.py")
EXAMPLE = os.path.join(harness.REPO, "docs", "examples", "capture_quickstart.py")


class CaptureTest(unittest.TestCase):
    def test_quickstart_example_through_a_real_rollpackd(self):
        with harness.tempdir() as d:
            engine = subprocess.Popen([sys.executable, STANDIN, "--engine", "vllm", "--port", "0"],
                                      stdout=subprocess.PIPE, text=True)
            try:
                line = engine.stdout.readline().split()
                self.assertEqual(line[0], "PORT", line)
                model = os.path.join(d, "model.json")
                with open(model, "w") as f:
                    json.dump({"name": "standin-moe", "numLayers": 4, "numExperts": 8,
                               "topk": 2}, f)
                capture_port_file = os.path.join(d, "capture.port")
                with harness.Rollpackd(d, "--capture-listen", "127.0.0.1:0",
                                       "--capture-port-file", capture_port_file,
                                       "--capture-upstream", "http://127.0.0.1:%s" % line[1],
                                       "--capture-engine", "vllm",
                                       "--capture-pool", "rollouts",
                                       "--capture-model", model) as rp, \
                        harness.Prometheus(d, ["127.0.0.1:%d" % rp.metrics_port]) as prom:
                    with open(capture_port_file) as f:
                        capture_port = int(f.read())
                    run = subprocess.run(
                        [sys.executable, EXAMPLE, "http://127.0.0.1:%d" % capture_port],
                        capture_output=True, text=True, timeout=120)
                    self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
                    lines = run.stdout.splitlines()
                    self.assertEqual(len(lines), 6, run.stdout)
                    for report in lines[:5]:
                        self.assertIn(" stored ", report, run.stdout)
                    self.assertEqual(lines[0].split()[-1].count("#"), 4, lines[0])
                    self.assertTrue(lines[1].endswith("episode-42"), lines[1])
                    self.assertIn("sealed episode-43", lines[5])

                    # 4 group samples + 2 sessions (pieces of one sample each count
                    # once per stored piece: 3 + 1).
                    prom.wait_for('rollpack_capture_requests_total{endpoint="vllm '
                                  '/v1/chat/completions",result="stored"}', 1.0)
                    prom.wait_for('rollpack_capture_requests_total{endpoint="vllm '
                                  '/v1/completions",result="stored"}', 4.0)
                    prom.wait_for("rollpack_capture_samples_total", 8.0)
                    prom.wait_for('rollpack_capture_overhead_seconds_count{mode="body"}', 5.0)
                    prom.wait_for('rollpack_capture_overhead_seconds_count{mode="stream"}', 0.0)
                    prom.wait_for("rollpack_capture_stripped_bytes_total > bool 0", 1.0)
                    direct = harness.parse_exposition(rp.scrape())
                    self.assertEqual(
                        direct['rollpack_capture_requests_total{endpoint="other",'
                               'result="upstream_error"}'], 0.0)
            finally:
                engine.kill()
                engine.wait()


if __name__ == "__main__":
    unittest.main()
