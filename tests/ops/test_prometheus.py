"""rollpackd scraped by a real Prometheus (Debian's `prometheus`): a running
rollpackd, a Prometheus on a loopback port scraping it every second with
deploy/prometheus/rollpack-rules.yml loaded, the `rollpack demo` workload
(register, put, plan, fetch every rank, release), then assertions through
Prometheus's HTTP query API; then a trainer's routing agreement reports
(Telemetry.ReportRoutingAgreement) as Prometheus sees them. `promtool check
metrics` validates the exposition, `promtool check rules` the shipped
rules and `promtool test rules` their unit tests; a two-member cluster on a
real etcd as Prometheus sees it."""

import json
import os
import re
import subprocess
import time
import unittest

import harness

RULES = os.path.join(harness.REPO, "deploy", "prometheus", "rollpack-rules.yml")
RULES_TEST = os.path.join(harness.REPO, "deploy", "prometheus", "rollpack-rules.test.yml")
DASHBOARD = os.path.join(harness.REPO, "deploy", "grafana", "rollpack-dashboard.json")
NUM_SAMPLES = 64
NUM_RULES = 16
# Declared by every rollpackd, with series only in cluster mode.
CLUSTER_SERIES_ONLY = {"rollpack_pool_held_steps"}
# Series that appear with their first event (a loss), not at start.
FIRST_EVENT_SERIES = {"rollpack_cluster_lost_samples_total"}
# Families of cluster mode, durable mode, and the process and build ones.
MODE_FAMILIES = ("rollpack_cluster_", "rollpack_durable_log_", "process_", "rollpack_build_info")


def dashboard_families(expr):
    return set(re.findall(r"\b((?:rollpack|exposer|process)_[a-z0-9_]+?)(?:_bucket|_sum|_count)?"
                          r"\b(?=[{\[ )]|$)", expr))


def check_dashboard(test, prom, needs_data):
    """Runs every panel query of the dashboard on `prom` (a PromQL error
    raises); those without a rate window whose families pass `needs_data`
    must have data. Returns how many had to."""
    with open(DASHBOARD) as f:
        dash = json.load(f)
    checked = 0
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$instance", ".*")
            result = prom.query(expr)  # raises on a PromQL error
            if "rate(" not in expr and needs_data(dashboard_families(expr)):
                test.assertTrue(result, "%s: %s has no data" % (panel["title"], expr))
                checked += 1
    return checked


class PrometheusTest(unittest.TestCase):
    def test_workload_as_seen_by_prometheus(self):
        cli = harness.require_env_binary("ROLLPACK_CLI")
        with harness.tempdir() as d, harness.Rollpackd(d) as rp, \
                harness.Prometheus(d, ["127.0.0.1:%d" % rp.metrics_port], [RULES]) as prom:
            prom.wait_for('up{job="rollpackd"}', 1.0)
            demo = subprocess.run([cli, "demo", "--server", rp.address,
                                   "--samples", str(NUM_SAMPLES)],
                                  capture_output=True, text=True, timeout=300)
            self.assertEqual(demo.returncode, 0, demo.stdout + demo.stderr)
            # The demo's per-rank table: "(dp,cp,tp,pp)   mbs ...".
            rows = re.findall(r"^\((\d+),(\d+),(\d+),(\d+)\)\s+(\d+)\s", demo.stdout, re.M)
            self.assertGreater(len(rows), 1, demo.stdout)
            ranks = len(rows)
            microbatches = sum(int(r[4]) for r in rows)

            # Nothing runs after the demo: a direct scrape is the truth that
            # Prometheus must converge to.
            direct = harness.parse_exposition(rp.scrape())
            pools = [k for k in direct if k.startswith("rollpack_steps_created_total{")]
            self.assertEqual(len(pools), 1, pools)
            pool = re.search(r'pool="([^"]+)"', pools[0]).group(1)
            self.assertTrue(pool.startswith("demo-"), pool)
            prom.wait_for("rollpack_steps_released_total", 1.0)
            prom.wait_for("sum(rollpack_ingested_samples_total)", float(NUM_SAMPLES))
            prom.wait_for('rollpack_steps_created_total{pool="%s"}' % pool, 1.0)
            prom.wait_for("rollpack_released_samples_total", float(NUM_SAMPLES))
            prom.wait_for("rollpack_streamed_microbatches_total", float(microbatches))
            # One trainer stream per rank: FetchPieces (the client's default,
            # delivery auto) or FetchMicrobatches.
            prom.wait_for('sum(rollpack_grpc_server_handled_total{'
                          'grpc_method=~"FetchPieces|FetchMicrobatches",grpc_code="OK"})',
                          float(ranks))
            prom.wait_for('rollpack_grpc_server_handled_total{grpc_service="rollpack.v1.Rollouts",'
                          'grpc_method="RegisterModel",grpc_code="OK"}', 1.0)
            for expr, key in [
                ('rollpack_ingested_bytes_total{pool="%s"}',
                 'rollpack_ingested_bytes_total{pool="%s"}'),
                ("rollpack_released_bytes_total", "rollpack_released_bytes_total"),
                ("rollpack_streamed_bytes_total", "rollpack_streamed_bytes_total"),
                ('rollpack_last_plan_padding_overhead_ratio{pool="%s"}',
                 'rollpack_last_plan_padding_overhead_ratio{pool="%s"}'),
                ('rollpack_last_plan_rank_imbalance_ratio{pool="%s"}',
                 'rollpack_last_plan_rank_imbalance_ratio{pool="%s"}'),
            ]:
                expr, key = expr.replace("%s", pool), key.replace("%s", pool)
                self.assertIn(key, direct)
                prom.wait_for(expr, direct[key])
            self.assertEqual(direct['rollpack_ingested_bytes_total{pool="%s"}' % pool],
                             direct["rollpack_released_bytes_total"])
            self.assertGreater(direct["rollpack_streamed_bytes_total"], 0)
            prom.wait_for("rollpack_store_bytes", 0.0)
            prom.wait_for("rollpack_active_streams", 0.0)
            prom.wait_for("rollpack_live_steps", 0.0)
            prom.wait_for("rollpack_store_max_bytes", 2e9)
            prom.wait_for('rollpack_plan_duration_seconds_count{pool="%s"}' % pool, 1.0)

            # Histograms work as histograms in PromQL.
            p50 = prom.query_one(
                'histogram_quantile(0.5, sum by (le) (rollpack_grpc_server_handling_seconds_bucket'
                '{grpc_method="PutSamples"}))')
            self.assertTrue(0 < p50 < 60, p50)

            # The shipped rules load and evaluate without errors.
            deadline = time.monotonic() + 30
            while True:
                groups = prom.api("rules")["groups"]
                rules = [r for g in groups for r in g["rules"]]
                evaluated = all(r.get("lastEvaluation", "").startswith("20") for r in rules)
                if evaluated or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            self.assertEqual(len(rules), NUM_RULES, groups)
            for r in rules:
                self.assertEqual(r["health"], "ok", r)
            prom.wait_for("rollpack:store_utilization:ratio", 0.0)
            # Nothing is wrong, so nothing fires.
            self.assertEqual(prom.api("alerts")["alerts"], [])

            self.report_routing_agreement(rp, prom)

            # Every Grafana panel query is valid PromQL here, and the ones
            # over gauges and counters (no rate window) have data, but for
            # the durable-log and cluster families (test_cluster_...).
            declared = set(re.findall(r"^# TYPE (\S+) ", rp.scrape(), re.M))
            checked = check_dashboard(self, prom, lambda families: families <= declared
                                      and not families & CLUSTER_SERIES_ONLY)
            self.assertGreater(checked, 40)

    def report_routing_agreement(self, rp, prom):
        """A step of its own, reported on twice by its one rank (with a scrape
        in between, so increase() over the counters has data), then the
        rollpack_routing_* series in Prometheus; the step is released."""
        import grpc
        import numpy as np
        import rollpack
        from rollpack.v1 import (scheduler_pb2, scheduler_pb2_grpc, telemetry_pb2,
                                 telemetry_pb2_grpc, trainer_pb2)
        spec = rollpack.ModelSpec("routing", num_layers=4, moe_layers=[1, 3], num_experts=16,
                                  topk=2)
        rng = np.random.default_rng(5)
        samples = []
        for i in range(4):
            toks = rng.integers(1, 1000, size=50).astype(np.int32)
            ex = np.argsort(rng.random((49, 4, 16)), axis=2)[:, :, :2].astype(np.int32)
            samples.append(rollpack.Sample("r%d" % i, toks, ex))
        with rollpack.Producer(rp.address, "routing") as p:
            p.register_model(spec)
            p.put(samples)
        with grpc.insecure_channel(rp.address) as ch:
            sched = scheduler_pb2_grpc.SchedulerStub(ch)
            info = sched.CreateStep(scheduler_pb2.CreateStepRequest(
                step_id="routing-step", pool="routing", num_samples=4,
                topology=scheduler_pb2.Topology(max_tokens_per_rank=256)), timeout=30)
            self.assertEqual(list(info.stage_layers[0].replay_layers), [1, 3])
            stub = telemetry_pb2_grpc.TelemetryStub(ch)

            def report(rows):
                ack = stub.ReportRoutingAgreement(telemetry_pb2.RoutingAgreementReport(
                    step_id="routing-step", rank=trainer_pb2.RankCoords(), topk=2,
                    layers=[telemetry_pb2.LayerAgreement(layer=1, rows_compared=rows,
                                                         rows_disagreeing=rows // 10,
                                                         overlapping_experts=2 * rows - rows // 10),
                            telemetry_pb2.LayerAgreement(layer=3, rows_compared=rows,
                                                         rows_disagreeing=0,
                                                         overlapping_experts=2 * rows)]),
                    timeout=30)
                return ack

            report(100)
            prom.wait_for("sum(rollpack_routing_rows_compared_total)", 200.0)
            ack = report(100)
            self.assertEqual((ack.step_rows_compared, ack.step_rows_disagreeing,
                              ack.step_reports), (400, 20, 2))
            prom.wait_for("sum(rollpack_routing_rows_compared_total)", 400.0)
            prom.wait_for('rollpack_routing_rows_disagreeing_total{layer="1"}', 20.0)
            prom.wait_for('rollpack_routing_rows_disagreeing_total{layer="3"}', 0.0)
            prom.wait_for("rollpack_routing_last_step_disagreement_ratio", 20.0 / 400)
            prom.wait_for("rollpack_routing_last_step_mean_overlap_ratio", 780.0 / 800)
            sched.ReleaseStep(scheduler_pb2.ReleaseStepRequest(step_id="routing-step"),
                              timeout=30)

    def test_cluster_as_seen_by_prometheus(self):
        """Two durable members on a real etcd, scraped by Prometheus with the
        rules loaded: the cluster, durable-log, process and build families
        the dashboard plots have data, and no alert fires on a healthy
        cluster."""
        with harness.tempdir() as d:
            dirs = [os.path.join(d, name) for name in ("a", "b")]
            for x in dirs:
                os.mkdir(x)
            with harness.Etcd(d) as etcd, \
                    harness.Rollpackd(dirs[0], "--data-dir", os.path.join(dirs[0], "data"),
                                      "--cluster-etcd", etcd.url,
                                      "--cluster-lease-seconds", "2") as a, \
                    harness.Rollpackd(dirs[1], "--data-dir", os.path.join(dirs[1], "data"),
                                      "--cluster-etcd", etcd.url,
                                      "--cluster-lease-seconds", "2") as b, \
                    harness.Prometheus(d, ["127.0.0.1:%d" % m.metrics_port for m in (a, b)],
                                       [RULES]) as prom:
                prom.wait_for('count(up{job="rollpackd"} == 1)', 2.0)
                prom.wait_for("min(rollpack_cluster_members)", 2.0)
                prom.wait_for("count(rollpack_cluster_etcd_up == 1)", 2.0)
                for member in (a, b):
                    prom.wait_for('min(rollpack_cluster_member_up{member="%s"})' % member.address,
                                  1.0)
                prom.wait_for("max(rollpack_cluster_etcd_unreachable_seconds)", 0.0)
                prom.wait_for("max(rollpack_cluster_member_draining)", 0.0)
                prom.wait_for("count(rollpack_durable_log_cut_bytes == 0)", 2.0)
                prom.wait_for("count(count by (version, commit) (rollpack_build_info))", 1.0)
                # Two scrapes of every series, so increase() has data.
                time.sleep(2.5)
                declared = set()
                for member in (a, b):
                    declared |= set(re.findall(r"^# TYPE (\S+) ", member.scrape(), re.M))
                # The panels of what a single in-memory server lacks (the
                # pools and streams are test_workload_...'s).
                checked = check_dashboard(self, prom, lambda families: families <= declared
                                          and not families & FIRST_EVENT_SERIES and any(
                                              f.startswith(MODE_FAMILIES) for f in families))
                self.assertGreaterEqual(checked, 15)
                rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
                self.assertEqual(len(rules), NUM_RULES)
                self.assertEqual([r["name"] for r in rules if r["health"] == "err"], [])
                self.assertEqual(prom.api("alerts")["alerts"], [])

    def test_promtool_checks_exposition(self):
        promtool = harness.require_tool("promtool")
        with harness.tempdir() as d, harness.Rollpackd(d) as rp:
            # Some traffic so every kind of family has samples.
            cli = harness.require_env_binary("ROLLPACK_CLI")
            demo = subprocess.run([cli, "demo", "--server", rp.address, "--samples", "16"],
                                  capture_output=True, text=True, timeout=300)
            self.assertEqual(demo.returncode, 0, demo.stdout + demo.stderr)
            text = rp.scrape()
        for family in ["rollpack_grpc_server_handling_seconds", "rollpack_plan_duration_seconds"]:
            self.assertIn("# TYPE %s histogram" % family, text)
            self.assertIn('%s_bucket{' % family, text)
            self.assertRegex(text, r'%s_bucket\{[^}]*le="\+Inf"\}' % family)
        check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                               text=True, timeout=60)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        self.assertEqual(check.stdout.strip() + check.stderr.strip(), "")
        # The check is not vacuous: promtool refuses a broken exposition and
        # lints a counter without _total.
        broken = subprocess.run([promtool, "check", "metrics"],
                                input='# TYPE x counter\nx{a="b} 1\n',
                                capture_output=True, text=True, timeout=60)
        self.assertNotEqual(broken.returncode, 0)
        lint = subprocess.run([promtool, "check", "metrics"],
                              input="# HELP rp_x x\n# TYPE rp_x counter\nrp_x 1\n",
                              capture_output=True, text=True, timeout=60)
        self.assertNotEqual(lint.returncode, 0, lint.stdout + lint.stderr)

    def test_promtool_checks_rules(self):
        promtool = harness.require_tool("promtool")
        check = subprocess.run([promtool, "check", "rules", RULES], capture_output=True,
                               text=True, timeout=60)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)
        self.assertIn("SUCCESS: %d rules found" % NUM_RULES, check.stdout)
        # Each cluster and process alert firing and not (the test file says
        # how); promtool fails on any alert fired or missed against it.
        test = subprocess.run([promtool, "test", "rules", RULES_TEST], capture_output=True,
                              text=True, timeout=60)
        self.assertEqual(test.returncode, 0, test.stdout + test.stderr)
        self.assertIn("SUCCESS", test.stdout)
        with open(RULES_TEST) as f:
            tested = set(re.findall(r"alertname: (\w+)", f.read()))
        self.assertEqual(tested, {"RollpackEtcdUnreachable", "RollpackClusterMemberLost",
                                  "RollpackMemberDrained", "RollpackSamplesLost",
                                  "RollpackFileDescriptorsNearLimit"})


if __name__ == "__main__":
    unittest.main()
