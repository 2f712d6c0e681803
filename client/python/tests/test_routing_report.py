"""Routing agreement reported to a real rollpackd and read back from its
/metrics (Telemetry.ReportRoutingAgreement, rollpack_routing_*):

- two pipeline stages' ranks compute ``routing_agreement`` on their
  micro-batches (live logits that follow the replay on most rows) and report
  it through ``TrainerClient.report_routing_agreement``; the server's
  per-layer counters (labelled with global MoE layer ids) equal the sums of
  the reported counts, the last-step gauges equal the exact fractions, the
  acknowledgement carries the step's totals;
- the module-level ``rollpack.report_routing_agreement``;
- refusals: a layer of another stage, a wrong K, an unknown step, a layer
  count that does not match the agreement.
"""

import os
import tempfile
import unittest
import urllib.request

import numpy as np

import rollpack
from rollpack import errors
from rollpack._proto import scheduler_pb2, scheduler_pb2_grpc
from tests.rollpackd import Rollpackd, read_port_file
from tests.test_trainer import _need_trainer, make_samples

import grpc

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

NUM_LAYERS, MOE, E, K = 6, [1, 2, 4, 5], 32, 4
TOPO = dict(dp=1, cp=1, tp=1, pp=2)


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def live_logits(mb, drift_every):
    """Live router logits [layers, rows, E] whose top-K is the replayed set,
    except on every `drift_every`-th row (random logits there)."""
    gen = torch.Generator().manual_seed(mb.index)
    ids = mb.replay_indices.long()
    layers, rows, _ = ids.shape
    logits = torch.rand((layers, rows, E), generator=gen)
    boost = torch.zeros_like(logits).scatter_(2, ids, 10.0)
    keep = (torch.arange(rows) % drift_every != 0).view(1, rows, 1)
    return logits + boost * keep


class RoutingReport(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.trainer = _need_trainer()
        cls.tmp = tempfile.TemporaryDirectory(prefix="rollpack-report-")
        cls.addClassCleanup(cls.tmp.cleanup)
        port_file = os.path.join(cls.tmp.name, "metrics-port")
        cls.d = Rollpackd("--metrics-listen", "127.0.0.1:0", "--metrics-port-file", port_file)
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        cls.metrics_port = read_port_file(port_file)
        spec = rollpack.ModelSpec("tiny", num_layers=NUM_LAYERS, moe_layers=MOE, num_experts=E,
                                  topk=K)
        with rollpack.Producer(cls.d.address, "pool") as p:
            p.register_model(spec)
            p.put(make_samples(np.random.default_rng(11), 24, NUM_LAYERS, MOE, E, K))
        with grpc.insecure_channel(cls.d.address) as ch:
            stub = scheduler_pb2_grpc.SchedulerStub(ch)
            for step, n in (("a", 16), ("b", 8)):
                info = stub.CreateStep(scheduler_pb2.CreateStepRequest(
                    step_id=step, pool="pool", num_samples=n,
                    topology=scheduler_pb2.Topology(max_tokens_per_rank=512, **TOPO)),
                    timeout=30)
                if step == "a":
                    cls.stage_layers = [list(s.replay_layers) for s in info.stage_layers]
        assert cls.stage_layers == [[1, 2], [4, 5]], cls.stage_layers

    def test_reports_add_up_in_the_metrics(self):
        before = scrape(self.metrics_port)
        expect = {}  # global layer -> [rows, differ, overlap]
        totals = np.zeros(3, np.int64)
        reports = 0
        last = None

        def report(c, mb):
            nonlocal reports, totals, last
            agr = self.trainer.routing_agreement(live_logits(mb, 3), mb.replay_indices,
                                                 mask=mb.replay_mask)
            ack = c.report_routing_agreement(agr)  # layers: the last micro-batch's
            reports += 1
            for i, layer in enumerate(mb.replay_layers):
                counts = [int(agr.rows_counted[i]), int(agr.rows_differ[i]),
                          int(agr.overlap_sum[i])]
                e = expect.setdefault(layer, [0, 0, 0])
                for j in range(3):
                    e[j] += counts[j]
                totals += counts
            self.assertEqual((ack.rows_compared, ack.rows_disagreeing, ack.overlapping_experts,
                              ack.reports), tuple(int(x) for x in totals) + (reports,))
            self.assertEqual(ack.topk, K)
            last = ack

        c0 = self.trainer.TrainerClient(self.d.address, "a", (0, 0, 0, 0), "cpu")
        self.addCleanup(c0.close)
        for mb in c0:  # while the stream is open
            report(c0, mb)
        c1 = self.trainer.TrainerClient(self.d.address, "a", (0, 0, 0, 1), "cpu")
        self.addCleanup(c1.close)
        for mb in list(c1):  # after the stream ended
            report(c1, mb)
        self.assertGreater(totals[1], 0, "no disagreement was exercised")
        self.assertLess(totals[1], totals[0])
        self.assertEqual(sorted(expect), [1, 2, 4, 5])
        m = scrape(self.metrics_port)
        for layer, want in expect.items():
            for name, value in zip(("rows_compared", "rows_disagreeing", "overlapping_experts"),
                                   want):
                key = 'rollpack_routing_%s_total{layer="%d"}' % (name, layer)
                self.assertEqual(m[key] - before.get(key, 0), value, key)
        self.assertNotIn('rollpack_routing_rows_compared_total{layer="0"}', m)  # dense layer
        self.assertAlmostEqual(m["rollpack_routing_last_step_disagreement_ratio"],
                               last.fraction_differ, places=12)
        self.assertAlmostEqual(m["rollpack_routing_last_step_mean_overlap_ratio"],
                               last.mean_overlap, places=12)
        # No step ids or ranks in the labels: only `layer`.
        for name in m:
            if name.startswith("rollpack_routing_"):
                self.assertRegex(name, r'^rollpack_routing_\w+(\{layer="\d+"\})?$')

    def test_module_function_and_refusals(self):
        c = self.trainer.TrainerClient(self.d.address, "b", (0, 0, 0, 1), "cpu")
        self.addCleanup(c.close)
        mb = next(c)
        agr = self.trainer.routing_agreement(mb.replay_indices, mb.replay_indices,
                                             mask=mb.replay_mask)
        ack = rollpack.report_routing_agreement(self.d.address, "b", (0, 0, 0, 1), agr,
                                                mb.replay_layers)
        self.assertEqual(ack.rows_disagreeing, 0)
        self.assertEqual(ack.rows_compared, int(agr.rows_counted.sum()))
        self.assertEqual(ack.mean_overlap, 1.0)
        # Stage 1's counts labelled with stage 0's layers.
        with self.assertRaises(errors.InvalidArgument) as cm:
            c.report_routing_agreement(agr, [1, 2])
        self.assertIn("layers[0].layer is 1, not a replay layer of pipeline stage pp=1",
                      str(cm.exception))
        self.assertIn("report routing agreement of b rank (0, 0, 0, 1)", str(cm.exception))
        with self.assertRaises(errors.NotFound) as cm:
            rollpack.report_routing_agreement(self.d.address, "nope", (0, 0, 0, 1), agr, mb)
        self.assertIn('step "nope"', str(cm.exception))
        wrong_k = self.trainer.routing_agreement(mb.replay_indices[..., :2],
                                                 mb.replay_indices[..., :2])
        with self.assertRaises(errors.InvalidArgument) as cm:
            c.report_routing_agreement(wrong_k)
        self.assertIn("topk is 2, but step \"b\"'s model has topk 4", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            c.report_routing_agreement(agr, [4])
        self.assertIn("agreement has 2 layers but 1 layer ids were given", str(cm.exception))
        fresh = self.trainer.TrainerClient(self.d.address, "b", (0, 0, 0, 1), "cpu")
        self.addCleanup(fresh.close)
        with self.assertRaises(ValueError):
            fresh.report_routing_agreement(agr)  # no micro-batch yet: layers unknown


if __name__ == "__main__":
    unittest.main()
