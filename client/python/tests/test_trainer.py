"""Trainer side (rollpack.trainer / rollpack.replay) on CPU torch:

- TrainerClient against a real rollpackd, every rank of a cp=2 tp=2 pp=2
  layout, compared with the wire bytes read through the plain gRPC stub and
  numpy (an independent decode), ids against numpy's transpose; delivery
  "direct" (FetchPieces), "auto" and "proxy" tensor-identical;
- apply_replay forward/backward and routing_agreement against float64 torch
  references written here;
- install_replay_targets with a stand-in of Megatron's RouterReplay.

Needs torch and librollpack_trainer.so; without them
the tests skip, unless ROLLPACK_TRAINER_REQUIRED=1 (CTest) makes that a
failure. GPU variants run in tests/gpu_trainer.py through the device tool.
"""

import os
import unittest

import grpc
import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

import rollpack
from rollpack import errors
from rollpack._proto import scheduler_pb2, scheduler_pb2_grpc, trainer_pb2, trainer_pb2_grpc
from rollpack import ndarray as nd
from tests.rollpackd import Rollpackd

REQUIRED = os.environ.get("ROLLPACK_TRAINER_REQUIRED") == "1"


def _need_trainer(sequence_info=False):
    """rollpack.trainer, or a skip (a failure under CTest) without torch or the
    binding; with `sequence_info`, a binding that has the per-sequence metadata."""
    if torch is None:
        if REQUIRED:
            raise AssertionError("torch is not importable (install python3-torch)")
        raise unittest.SkipTest("no torch")
    try:
        from rollpack import _capi, trainer
        _capi.abi_version()  # loads the library
        if sequence_info and not _capi.has_sequence_info():
            raise ImportError("%s predates the per-sequence metadata" % _capi.library_path())
    except ImportError as e:
        if REQUIRED:
            raise AssertionError("trainer binding missing: %s" % e)
        raise unittest.SkipTest("trainer binding not built: %s" % e)
    return trainer


def make_samples(rng, n, num_layers, moe_layers, e, k, max_len=300):
    out = []
    for i in range(n):
        length = int(rng.integers(5, max_len))
        toks = rng.integers(1, 50000, size=length).astype(np.int32)
        rows = length - 1  # engines give n - 1 rows
        ex = np.argsort(rng.random((rows, num_layers, e)), axis=2)[:, :, :k].astype(np.int32)
        lp = rng.standard_normal(length).astype(np.float32)
        out.append(rollpack.Sample("s%d" % i, toks, ex, token_fields={"logprobs": lp}))
    return out


def wire(a):
    if not a.shape and not a.data:
        return np.zeros((0,), np.uint8)
    return np.frombuffer(a.data, nd.numpy_dtype(a.dtype)).reshape(tuple(a.shape))


class TrainerClientCpu(unittest.TestCase):
    NUM_LAYERS, MOE, E, K = 6, [1, 2, 4, 5], 64, 6
    TOPO = dict(dp=1, cp=2, tp=2, pp=2)

    @classmethod
    def setUpClass(cls):
        cls.trainer = _need_trainer()
        cls.d = Rollpackd()
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        cls.channel = grpc.insecure_channel(cls.d.address,
                                            [("grpc.max_receive_message_length", -1)])
        cls.addClassCleanup(cls.channel.close)
        spec = rollpack.ModelSpec("tiny", num_layers=cls.NUM_LAYERS, moe_layers=cls.MOE,
                                  num_experts=cls.E, topk=cls.K)
        with rollpack.Producer(cls.d.address, "pool") as p:
            p.register_model(spec)
            p.put(make_samples(np.random.default_rng(7), 24, cls.NUM_LAYERS, cls.MOE, cls.E, cls.K))
        cls.sched = scheduler_pb2_grpc.SchedulerStub(cls.channel)
        cls.stub = trainer_pb2_grpc.TrainerStub(cls.channel)
        topo = scheduler_pb2.Topology(max_tokens_per_rank=512, **cls.TOPO)
        info = cls.sched.CreateStep(scheduler_pb2.CreateStepRequest(
            step_id="st", pool="pool", num_samples=24, topology=topo), timeout=30)
        cls.num_mb = info.num_microbatches
        assert cls.num_mb >= 2, cls.num_mb

    def ranks(self):
        t = self.TOPO
        for cp in range(t["cp"]):
            for tp in range(t["tp"]):
                for pp in range(t["pp"]):
                    yield (0, cp, tp, pp)

    def reference(self, rank, all_fields=False):
        return list(self.stub.FetchMicrobatches(trainer_pb2.FetchRequest(
            step_id="st", rank=trainer_pb2.RankCoords(dp=rank[0], cp=rank[1], tp=rank[2],
                                                      pp=rank[3]),
            all_fields=all_fields), timeout=60))

    def assertTensorEqual(self, t, a, what):
        self.assertEqual(tuple(t.shape), a.shape, what)
        if a.dtype == np.uint16:
            a = a.astype(np.int16)
        np.testing.assert_array_equal(t.numpy(), a, err_msg=what)

    def test_every_rank_matches_the_wire(self):
        for rank in self.ranks():
            refs = self.reference(rank)
            got = list(self.trainer.TrainerClient(self.d.address, "st", rank, "cpu", prefetch=3))
            self.assertEqual(len(got), len(refs), rank)
            self.assertEqual(len(got), self.num_mb)
            for mb, ref in zip(got, refs):
                what = "rank %s mb %d" % (rank, ref.index)
                self.assertEqual(mb.index, ref.index)
                self.assertEqual(mb.num_microbatches, ref.num_microbatches)
                self.assertEqual(mb.sample_ids, list(ref.sample_ids))
                self.assertEqual(mb.replay_layers, list(ref.replay_layers))
                self.assertEqual(mb.max_seqlen, ref.max_seqlen)
                self.assertEqual(mb.local_cp_size, ref.local_cp_size)
                self.assertEqual(mb.local_cp_rank, ref.local_cp_rank)
                for name in ("tokens", "cu_seqlens", "cu_seqlens_padded", "replay_mask",
                             "replay_experts"):
                    self.assertTensorEqual(getattr(mb, name), wire(getattr(ref, name)),
                                           what + " " + name)
                self.assertEqual(sorted(mb.token_fields), sorted(ref.token_fields))
                for n, t in mb.token_fields.items():
                    self.assertTensorEqual(t, wire(ref.token_fields[n]), what + " " + n)
                ex = wire(ref.replay_experts)
                self.assertEqual(mb.replay_indices.dtype, torch.int64)
                np.testing.assert_array_equal(
                    mb.replay_indices.numpy(), ex.transpose(1, 0, 2).astype(np.int64),
                    err_msg=what)
                self.assertEqual(len(mb.replay_targets()), len(ref.replay_layers))
                # Stage layers: pp 0 owns layers 0..2 -> MoE 1, 2; pp 1 -> 4, 5.
                self.assertEqual(mb.replay_layers, [1, 2] if rank[3] == 0 else [4, 5])
                # Router rows: sequence parallel halves the CP-local stream.
                # Router rows: T_r = padded total / cp, split over tp = 2 ranks.
                t_r = int(wire(ref.cu_seqlens_padded)[-1]) // self.TOPO["cp"]
                self.assertEqual(mb.replay_indices.shape[1] * self.TOPO["tp"], t_r)
                self.assertEqual(mb.tokens.numel(), t_r if rank[3] == 0 else 0)

    def test_options(self):
        rank = (0, 0, 1, 0)  # cp 0 holds the sequences' last tokens and padding
        refs = self.reference(rank, all_fields=True)
        got = list(self.trainer.TrainerClient(
            self.d.address, "st", {"dp": 0, "cp": 0, "tp": 1, "pp": 0}, "cpu",
            all_fields=True, start_index=1, index_dtype=torch.int32,
            masked_fill_minus_one=True))
        self.assertEqual([m.index for m in got], [r.index for r in refs[1:]])
        saw_masked = False
        for mb, ref in zip(got, refs[1:]):
            self.assertIn("logprobs", mb.token_fields)  # all_fields on pp 0
            self.assertEqual(mb.replay_indices.dtype, torch.int32)
            ex = wire(ref.replay_experts).transpose(1, 0, 2).astype(np.int32).copy()
            mask = wire(ref.replay_mask)
            ex[:, mask == 0, :] = -1
            saw_masked |= bool((mask == 0).any())
            np.testing.assert_array_equal(mb.replay_indices.numpy(), ex)
        self.assertTrue(saw_masked, "no padding rows: the -1 fill was not exercised")

    @staticmethod
    def snapshot(mb):
        """Everything a Microbatch holds, as comparable values."""
        def arr(t):
            return (str(t.dtype), tuple(t.shape), t.contiguous().numpy().tobytes())
        return ((mb.index, mb.num_microbatches, mb.local_cp_size, mb.local_cp_rank,
                 mb.max_seqlen, mb.workload, list(mb.sample_ids), list(mb.replay_layers)),
                [arr(getattr(mb, n)) for n in ("tokens", "cu_seqlens", "cu_seqlens_padded",
                                               "replay_experts", "replay_mask",
                                               "replay_indices")],
                sorted((n, arr(t)) for n, t in mb.token_fields.items()))

    def test_delivery_direct_auto_and_proxy_are_identical(self):
        # One rollpackd: the header piece of each direct pull is the whole
        # micro-batch; the stream must equal the proxied one tensor by tensor.
        for all_fields in (False, True):
            for rank in self.ranks():
                got = {}
                for delivery in ("direct", "auto", "proxy"):
                    got[delivery] = [self.snapshot(mb) for mb in self.trainer.TrainerClient(
                        self.d.address, "st", rank, "cpu", all_fields=all_fields,
                        delivery=delivery)]
                what = "rank %s all_fields %s" % (rank, all_fields)
                self.assertEqual(len(got["proxy"]), self.num_mb, what)
                self.assertTrue(got["direct"] == got["proxy"], what)
                self.assertTrue(got["auto"] == got["proxy"], what)
        with self.assertRaises(ValueError) as cm:
            self.trainer.TrainerClient(self.d.address, "st", (0, 0, 0, 0), delivery="pull")
        self.assertIn("'auto', 'direct', 'proxy'", str(cm.exception))
        with self.assertRaises(errors.NotFound) as cm:
            next(iter(self.trainer.TrainerClient(self.d.address, "nope", (0, 0, 0, 0),
                                                 delivery="direct", start_index=2)))
        self.assertEqual(cm.exception.resume_from, 2)

    def test_errors(self):
        with self.assertRaises(errors.NotFound):
            next(iter(self.trainer.TrainerClient(self.d.address, "nope", (0, 0, 0, 0))))
        with self.assertRaises(errors.InvalidArgument):
            next(iter(self.trainer.TrainerClient(self.d.address, "st", (0, 0, 5, 0))))
        with self.assertRaises(ValueError):
            self.trainer.TrainerClient(self.d.address, "st", (0, 0, 0))
        if not torch.cuda.is_available():
            # Built without CUDA, or no device: FAILED_PRECONDITION either way.
            with self.assertRaises(errors.FailedPrecondition):
                self.trainer.TrainerClient(self.d.address, "st", (0, 0, 0, 0), device=0)

    def test_early_close_and_lifetime(self):
        c = self.trainer.TrainerClient(self.d.address, "st", (0, 0, 0, 0), prefetch=1)
        mb = next(c)
        toks = mb.tokens.clone()
        c.close()
        del c
        # The tensors outlive the client.
        self.assertTrue(torch.equal(mb.tokens, toks))

    def test_close_tp_communicators_then_fetch_again(self):
        # Exported by both bindings; with none kept (CPU) it changes nothing,
        # and streams opened afterwards work.
        import rollpack
        rollpack.close_tp_communicators()
        rollpack.close_tp_communicators()
        c = self.trainer.TrainerClient(self.d.address, "st", (0, 0, 0, 0), prefetch=1)
        self.assertGreater(len(list(c)), 0)


def ref_apply(logits, ids, score, renorm, scale):
    x = logits.double()
    s = torch.softmax(x, dim=-1) if score == "softmax" else torch.sigmoid(x)
    p = s.gather(1, ids.long())
    if renorm:
        p = p / (p.sum(-1, keepdim=True) + (0.0 if score == "softmax" else 1e-20))
    return scale * p


class ReplayCpu(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.trainer = _need_trainer()

    def ids(self, g, rows, e, k, dtype=torch.int64):
        return torch.argsort(torch.rand(rows, e, generator=g), dim=1)[:, :k].to(dtype)

    def test_apply_forward_backward_vs_float64(self):
        g = torch.Generator().manual_seed(3)
        for e, k in ((64, 6), (128, 8), (7, 1)):
            for score in ("softmax", "sigmoid"):
                for renorm in (True, False):
                    for idt in (torch.int64, torch.int32, torch.uint8, torch.int16):
                        rows = 37
                        x = torch.randn(rows, e, generator=g) * 3
                        ids = self.ids(g, rows, e, k, idt)
                        xl = x.clone().requires_grad_(True)
                        probs, rmap, dense = rollpack.apply_replay(
                            xl, ids, score=score, renormalize=renorm, scale=1.5, dense=True)
                        xr = x.double().requires_grad_(True)
                        ref = ref_apply(xr, ids, score, renorm, 1.5)
                        torch.testing.assert_close(probs.double(), ref.detach(), rtol=1e-6,
                                                   atol=1e-7)
                        want_map = torch.zeros(rows, e, dtype=torch.bool)
                        want_map.scatter_(1, ids.long(), True)
                        self.assertTrue(torch.equal(rmap, want_map))
                        self.assertEqual(float((dense != 0).sum()), float(rows * k))
                        w = torch.randn(rows, k, generator=g)
                        (probs * w).sum().backward()
                        (ref * w.double()).sum().backward()
                        torch.testing.assert_close(xl.grad.double(), xr.grad, rtol=1e-5,
                                                   atol=1e-6)

    def test_apply_bf16(self):
        g = torch.Generator().manual_seed(4)
        x = (torch.randn(50, 64, generator=g) * 2).to(torch.bfloat16)
        ids = self.ids(g, 50, 64, 6)
        probs, _ = rollpack.apply_replay(x, ids)
        ref = ref_apply(x.float(), ids, "softmax", True, 1.0)
        torch.testing.assert_close(probs.double(), ref, rtol=1e-6, atol=1e-7)

    def test_apply_errors(self):
        with self.assertRaises(ValueError):
            rollpack.apply_replay(torch.randn(4, 8), torch.zeros(5, 2, dtype=torch.long))
        with self.assertRaises(errors.InvalidArgument):  # K > E
            rollpack.apply_replay(torch.randn(4, 2), torch.zeros(4, 3, dtype=torch.long))
        with self.assertRaises(errors.InvalidArgument):  # id out of range
            rollpack.apply_replay(torch.randn(4, 8), torch.full((4, 2), 9, dtype=torch.long))

    def ref_agreement(self, live_sets, replay, mask):
        layers, rows, k = replay.shape
        out = []
        for l in range(layers):
            counted = differ = overlap = 0
            for r in range(rows):
                if mask is not None and not mask[r]:
                    continue
                a, b = set(live_sets[l][r]), set(replay[l, r].tolist())
                counted += 1
                differ += a != b
                overlap += len(a & b)
            out.append((counted, differ, overlap))
        return out

    def test_agreement_vs_reference(self):
        g = torch.Generator().manual_seed(5)
        layers, rows, e, k = 3, 200, 64, 6
        logits = torch.randn(layers, rows, e, generator=g)
        live = logits.double().topk(k, dim=-1).indices
        replay = live.clone()
        flip = torch.rand(layers, rows, generator=g) < 0.2
        sel = replay[flip]
        sel[:, 0] = (sel[:, 0] + 1 + torch.randint(0, e - 1, (int(flip.sum()),), generator=g)) % e
        replay[flip] = sel
        # keep ids distinct where the flip collided
        for l, r in flip.nonzero().tolist():
            while len(set(replay[l, r].tolist())) < k:
                replay[l, r, 0] = (replay[l, r, 0] + 1) % e
        mask = torch.rand(rows, generator=g) < 0.9
        want = self.ref_agreement(live.tolist(), replay, mask)
        for dtype in (torch.int64, torch.uint8):
            a = rollpack.routing_agreement(logits, replay.to(dtype), mask=mask)
            got = list(zip(a.rows_counted.tolist(), a.rows_differ.tolist(), a.overlap_sum.tolist()))
            self.assertEqual(got, want)
            b = rollpack.routing_agreement(live, replay.to(dtype), mask=mask)
            got = list(zip(b.rows_counted.tolist(), b.rows_differ.tolist(), b.overlap_sum.tolist()))
            self.assertEqual(got, want)
        n = sum(w[0] for w in want)
        self.assertAlmostEqual(a.fraction_differ, sum(w[1] for w in want) / n)
        self.assertAlmostEqual(a.mean_overlap, sum(w[2] for w in want) / (n * k))
        self.assertGreater(a.fraction_differ, 0.1)
        # Strided replay: the received [rows, layers, K] buffer, permuted.
        raw = replay.permute(1, 0, 2).contiguous().to(torch.uint8)
        c = rollpack.routing_agreement(logits, raw.permute(1, 0, 2), mask=mask)
        self.assertEqual(c.rows_differ.tolist(), [w[1] for w in want])
        # Identical routing.
        self.assertEqual(rollpack.routing_agreement(logits, live).fraction_differ, 0.0)
        self.assertEqual(rollpack.routing_agreement(logits, live).mean_overlap, 1.0)


class StandInRouterReplay:
    """Same interface as megatron.core.transformer.moe.router_replay.RouterReplay."""
    global_router_replay_instances = []

    def __init__(self):
        self.target_topk_idx = None
        self.replay_backward_list = []
        self.router_replay_action = None
        StandInRouterReplay.global_router_replay_instances.append(self)

    def set_target_indices(self, topk_indices):
        self.target_topk_idx = topk_indices
        self.replay_backward_list.append(topk_indices)

    def set_router_replay_action(self, action):
        self.router_replay_action = action


class InstallTargets(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.trainer = _need_trainer()

    def setUp(self):
        StandInRouterReplay.global_router_replay_instances = []

    def test_layer_order_and_dtype(self):
        routers = [StandInRouterReplay() for _ in range(3)]
        ids = torch.randint(0, 64, (3, 10, 6), dtype=torch.int32)
        n = rollpack.install_replay_targets(ids, StandInRouterReplay, action="replay_forward")
        self.assertEqual(n, 3)
        for l, r in enumerate(routers):
            self.assertEqual(r.target_topk_idx.dtype, torch.int64)
            self.assertTrue(torch.equal(r.target_topk_idx, ids[l].long()))
            self.assertEqual(r.router_replay_action, "replay_forward")
            self.assertEqual(len(r.replay_backward_list), 1)

    def test_from_list_and_microbatch_like(self):
        routers = [StandInRouterReplay() for _ in range(2)]
        layers = [torch.full((4, 2), l, dtype=torch.long) for l in range(2)]
        rollpack.install_replay_targets(layers, routers)
        self.assertEqual([int(r.target_topk_idx[0, 0]) for r in routers], [0, 1])

        class Mb:
            replay_indices = torch.stack([torch.full((4, 2), 7 + l) for l in range(2)])
        rollpack.install_replay_targets(Mb(), routers)
        self.assertEqual([int(r.target_topk_idx[0, 0]) for r in routers], [7, 8])
        self.assertIs(routers[0].target_topk_idx._base is not None, True)  # a view, no copy

    def test_count_mismatch(self):
        StandInRouterReplay()
        with self.assertRaises(ValueError):
            rollpack.install_replay_targets(torch.zeros(2, 4, 2, dtype=torch.long),
                                            StandInRouterReplay)


if __name__ == "__main__":
    unittest.main()
