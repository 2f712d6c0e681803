"""The CPU-checkable parts of the Megatron-core reference integration
(client/python/examples/megatron, issue 40): its argument handling, and the
conversion of rollpack's THD micro-batches (from a real rollpackd, every rank
of a tp=2 sequence-parallel pp=2 step) into the local spec's model inputs and
replay targets, against an independent reference of the layout
(tests/layout_rows.py) and the samples put. The GPU run itself
(train_step.py under torchrun) skips without CUDA or megatron.core: exit 77.
"""

import os
import subprocess
import sys
import unittest

import grpc
import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

import rollpack
from rollpack._proto import scheduler_pb2, scheduler_pb2_grpc
from tests.layout_rows import router_positions
from tests.rollpackd import Rollpackd
from tests.test_trainer import _need_trainer

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "examples",
                       "megatron")
sys.path.insert(0, EXAMPLE)

N, MOE, E, K = 4, [1, 2, 3], 8, 2
TOPO = dict(dp=1, cp=1, tp=2, pp=2)
NUM_SAMPLES = 10


class ArgsTest(unittest.TestCase):
    def setUp(self):
        import train_step
        self.parse = train_step.parse_args

    def refused(self, argv, world, *words):
        with self.assertRaises(SystemExit) as cm, open(os.devnull, "w") as null:
            old, sys.stderr = sys.stderr, null
            try:
                self.parse(argv, world)
            finally:
                sys.stderr = old
        self.assertEqual(cm.exception.code, 2, argv)

    def test_topologies_of_two_gpus(self):
        a = self.parse(["--tp", "2", "--sequence-parallel", "--ep", "2"], 2)
        self.assertEqual((a.dp, a.tp, a.pp, a.ep, a.sequence_parallel), (1, 2, 1, 2, True))
        self.assertEqual(a.moe_layers, [1, 2, 3])  # layer 0 dense
        self.assertEqual(self.parse(["--pp", "2"], 2).dp, 1)
        self.assertEqual(self.parse([], 2).dp, 2)
        self.assertEqual(self.parse(["--tp", "2", "--pp", "2"], 8).dp, 2)

    def test_refusals(self):
        self.refused(["--cp", "2"], 2)                      # needs Transformer Engine
        self.refused(["--tp", "2"], 3)                      # world not a multiple of tp*pp
        self.refused(["--sequence-parallel"], 2)            # SP without TP
        self.refused(["--pp", "2", "--layers", "3"], 2)     # layers over stages
        self.refused(["--layers", "1"], 1)                  # no MoE layer after the dense one
        self.refused(["--ep", "2", "--experts", "9"], 2)    # experts over EP ranks
        self.refused(["--topk", "9"], 1)
        self.refused(["--ep", "3"], 2)
        self.refused(["--min-len", "300", "--max-len", "200"], 1)

    def test_gpu_run_skips_without_cuda_or_megatron(self):
        env = dict(os.environ, WORLD_SIZE="1")
        env.pop("PYTHONPATH", None)
        r = subprocess.run([sys.executable, os.path.join(EXAMPLE, "train_step.py"), "--pp", "1"],
                           env=env, capture_output=True, text=True, timeout=120)
        can_run = torch is not None and torch.cuda.is_available()
        if can_run and r.returncode != 77:
            self.skipTest("a GPU and megatron.core are here: the run is the device's to check")
        self.assertEqual(r.returncode, 77, r.stdout + r.stderr)
        self.assertIn("SKIP", r.stdout)


class ConversionTest(unittest.TestCase):
    """Every rank's micro-batches of a tp=2 (SP) pp=2 step, converted."""

    @classmethod
    def setUpClass(cls):
        cls.trainer = _need_trainer()
        import local_spec_inputs
        cls.lsi = local_spec_inputs
        cls.d = Rollpackd()
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        rng = np.random.default_rng(40)
        cls.samples = {}
        for i in range(NUM_SAMPLES):
            n = int(rng.integers(3, 60))
            tokens = rng.integers(1, 500, size=n).astype(np.int32)
            ex = np.argsort(rng.random((n, len(MOE), E)), axis=2)[:, :, :K].astype(np.int16)
            lp = -rng.random(n).astype(np.float32)
            lp[0] = 0.0
            mask = np.ones(n, np.float32)
            mask[0] = 0.0
            s = rollpack.Sample("s%d" % i, tokens, ex, 0,
                                token_fields={"logprobs": lp, "loss_mask": mask})
            cls.samples[s.sample_id] = s
        spec = rollpack.ModelSpec("mex", num_layers=N, moe_layers=MOE, num_experts=E, topk=K)
        with rollpack.Producer(cls.d.address, "mex") as p:
            p.register_model(spec)
            p.put(list(cls.samples.values()))
        with grpc.insecure_channel(cls.d.address) as ch:
            scheduler_pb2_grpc.SchedulerStub(ch).CreateStep(scheduler_pb2.CreateStepRequest(
                step_id="mex", pool="mex", num_samples=NUM_SAMPLES,
                topology=scheduler_pb2.Topology(sequence_parallel=True, max_tokens_per_rank=128,
                                                **TOPO)), timeout=60)

    def ranks(self):
        for tp in range(TOPO["tp"]):
            for pp in range(TOPO["pp"]):
                yield (0, 0, tp, pp)

    def fetch(self, rank):
        last = rank[3] == TOPO["pp"] - 1
        return list(self.trainer.TrainerClient(self.d.address, "mex", rank, "cpu",
                                               all_fields=last))

    def test_every_rank(self):
        lsi = self.lsi
        checked_rows = 0
        for rank in self.ranks():
            _, _, t, p = rank
            first, last = p == 0, p == TOPO["pp"] - 1
            stage_moe = [l for l in MOE if p * 2 <= l < (p + 1) * 2]
            mbs = self.fetch(rank)
            self.assertTrue(mbs)
            for mb in mbs:
                x = lsi.model_inputs(mb, tp_size=2, sequence_parallel=True, first_stage=first,
                                     last_stage=last)
                cu = lsi.seq_bounds(mb.cu_seqlens_padded)
                real = lsi.seq_bounds(mb.cu_seqlens)
                total = cu[-1]
                self.assertEqual(x["num_tokens"], total)
                # packed position -> (sample, position in it), from cu_seqlens_padded
                where = [(sid, q) for j, sid in enumerate(mb.sample_ids)
                         for q in range(cu[j + 1] - cu[j])]
                lengths = [real[j + 1] - real[j] for j in range(len(mb.sample_ids))]
                self.assertEqual(lengths, [len(self.samples[s].tokens) for s in mb.sample_ids])
                # attention: causal inside a sequence's padded block, nothing across
                seq = [j for j in range(len(mb.sample_ids)) for _ in range(cu[j + 1] - cu[j])]
                want = torch.tensor([[not (seq[a] == seq[b] and b <= a) for b in range(total)]
                                     for a in range(total)]).view(1, 1, total, total)
                self.assertTrue(torch.equal(x["attention_mask"], want))
                if first:
                    self.assertEqual(tuple(x["input_ids"].shape), (1, total))
                    self.assertEqual(x["position_ids"].view(-1).tolist(), [q for _, q in where])
                    for i, (sid, q) in enumerate(where):
                        s = self.samples[sid]
                        if q < len(s.tokens):
                            self.assertEqual(int(x["input_ids"][0, i]), int(s.tokens[q]))
                else:
                    self.assertIsNone(x["input_ids"])
                if last:
                    for i, (sid, q) in enumerate(where):
                        s = self.samples[sid]
                        label = int(s.tokens[q + 1]) if q + 1 < len(s.tokens) else 0
                        self.assertEqual(int(x["labels"][0, i]), label, (sid, q))
                        if q < len(s.tokens):
                            self.assertAlmostEqual(float(x["old_logprobs"][i]),
                                                   float(s.token_fields["logprobs"][q]), places=6)
                            self.assertEqual(float(x["loss_mask"][i]), 0.0 if q == 0 else 1.0)
                        else:
                            self.assertEqual(float(x["loss_mask"][i]), 0.0)
                    # the model's next-token log-probabilities, shifted back onto their tokens
                    nxt = torch.tensor([float(self.samples[sid].token_fields["logprobs"][q + 1])
                                        if q + 1 < len(self.samples[sid].tokens) else 7.0
                                        for sid, q in where])
                    got = lsi.token_logprobs(nxt, mb.cu_seqlens_padded)
                    m = x["loss_mask"] > 0
                    self.assertTrue(torch.equal(got[m], x["old_logprobs"][m]))
                    self.assertTrue(torch.all(got[torch.tensor([q == 0 for _, q in where])] == 0))
                # replay targets: router row r follows packed token T/tp * t + r, which the
                # independent reference of layout.md sections 2 and 5 must name too
                rows = lsi.router_row_positions(total, 2, t, True).tolist()
                ref = router_positions(mb.sample_ids, lambda s: len(self.samples[s].tokens), 1,
                                       0, 2, t)
                self.assertEqual([where[i] for i in rows], ref)
                targets = x["replay_targets"]
                self.assertEqual(len(targets), len(stage_moe))
                self.assertEqual(mb.replay_layers, stage_moe)
                for r, (sid, q) in enumerate(ref):
                    s = self.samples[sid]
                    if q >= len(s.tokens):
                        self.assertEqual(int(mb.replay_mask[r]), 0)
                        continue
                    self.assertEqual(int(mb.replay_mask[r]), 1)
                    for l, layer in enumerate(stage_moe):
                        self.assertEqual(targets[l].dtype, torch.int64)
                        self.assertEqual(sorted(targets[l][r].tolist()),
                                         sorted(s.routed_experts[q][MOE.index(layer)].tolist()))
                    checked_rows += 1
        self.assertGreater(checked_rows, 0)

    def test_refusals(self):
        lsi = self.lsi
        later = next(iter(self.trainer.TrainerClient(self.d.address, "mex", (0, 0, 0, 1), "cpu")))
        with self.assertRaisesRegex(ValueError, "all_fields"):  # no tokens off stage 0
            lsi.model_inputs(later, tp_size=2, sequence_parallel=True, first_stage=False,
                             last_stage=True)
        mb = self.fetch((0, 0, 0, 0))[0]
        with self.assertRaisesRegex(ValueError, r"replay_indices .* want \[1 layers, "):
            lsi.model_inputs(mb, tp_size=1, sequence_parallel=False, first_stage=True,
                             last_stage=False)  # rows of SP against a rank without it
        mb.local_cp_size = 2
        with self.assertRaisesRegex(ValueError, "Transformer Engine"):
            lsi.model_inputs(mb, tp_size=2, sequence_parallel=True, first_stage=True,
                             last_stage=False)
        with self.assertRaisesRegex(ValueError, "do not split over tp=2"):
            lsi.router_row_positions(7, 2, 0, True)


if __name__ == "__main__":
    unittest.main()
