"""Static replay buffers (rollpack.static_targets) on CPU torch:

- write_replay_targets and StaticReplayTargets (stage + write) against a real
  rollpackd, every rank of a cp=2 tp=2 pp=2 step: the buffer's rows equal
  the per-micro-batch path's ``replay_indices`` (int64 and int32, with and
  without -1 fill), the rows past the micro-batch hold (row * K + j) mod E,
  and a smaller micro-batch after a larger one leaves no stale id;
- slices of a larger buffer, refusals naming both numbers;
- install_static_buffer with a stand-in of Megatron's RouterReplay (views,
  not copies; MTP routers left live).

Needs torch and librollpack_trainer.so (skips without, unless
ROLLPACK_TRAINER_REQUIRED=1). The CUDA kernel and a captured CUDA graph are
tested in tests/gpu_static_targets.py on the GPU machine.
"""

import os
import types
import unittest

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

import rollpack
from rollpack import errors
from rollpack._proto import scheduler_pb2, scheduler_pb2_grpc
from tests.rollpackd import Rollpackd
from tests.test_trainer import make_samples

REQUIRED = os.environ.get("ROLLPACK_TRAINER_REQUIRED") == "1"


def _static():
    """rollpack.static_targets, or a skip (a failure under CTest's
    ROLLPACK_TRAINER_REQUIRED=1) without torch or the library."""
    try:
        if torch is None:
            raise ImportError("torch is not importable (install python3-torch)")
        from rollpack import _capi, static_targets
        _capi.abi_version()  # loads the library
        static_targets._need_library()
    except ImportError as e:
        if REQUIRED:
            raise AssertionError("static replay buffers unavailable: %s" % e)
        raise unittest.SkipTest("static replay buffers unavailable: %s" % e)
    return static_targets


def expected(mb_ids, mask, max_rows, e, fill):
    """[max_rows, layers, K] int64 written longhand from the received ids."""
    rows, layers, k = mb_ids.shape
    out = np.empty((max_rows, layers, k), np.int64)
    for r in range(max_rows):
        for j in range(k):
            if r < rows:
                out[r, :, j] = -1 if (fill and mask[r] == 0) else mb_ids[r, :, j]
            else:
                out[r, :, j] = (r * k + j) % e
    return out


class StaticTargetsCpu(unittest.TestCase):
    NUM_LAYERS, MOE, E, K = 6, [1, 2, 4, 5], 64, 6
    TOPO = dict(dp=1, cp=2, tp=2, pp=2)

    @classmethod
    def setUpClass(cls):
        cls.st = _static()
        cls.d = Rollpackd()
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        spec = rollpack.ModelSpec("tiny", num_layers=cls.NUM_LAYERS, moe_layers=cls.MOE,
                                  num_experts=cls.E, topk=cls.K)
        cls.spec = spec
        with rollpack.Producer(cls.d.address, "pool") as p:
            p.register_model(spec)
            p.put(make_samples(np.random.default_rng(11), 20, cls.NUM_LAYERS, cls.MOE, cls.E,
                               cls.K))
        import grpc
        ch = grpc.insecure_channel(cls.d.address)
        cls.addClassCleanup(ch.close)
        info = scheduler_pb2_grpc.SchedulerStub(ch).CreateStep(scheduler_pb2.CreateStepRequest(
            step_id="st", pool="pool", num_samples=20,
            topology=scheduler_pb2.Topology(max_tokens_per_rank=512, **cls.TOPO)), timeout=30)
        assert info.num_microbatches >= 2, info.num_microbatches

    def ranks(self):
        for cp in range(2):
            for tp in range(2):
                for pp in range(2):
                    yield (0, cp, tp, pp)

    def fetch(self, rank, **opts):
        from rollpack.trainer import TrainerClient
        return list(TrainerClient(self.d.address, "st", rank, "cpu", **opts))

    def test_every_rank_equals_the_per_microbatch_path(self):
        n = 0
        for rank in self.ranks():
            for dtype, fill in ((torch.int64, False), (torch.int32, True)):
                mbs = self.fetch(rank, index_dtype=dtype, masked_fill_minus_one=fill)
                max_rows = max(mb.replay_experts.shape[0] for mb in mbs) + 7
                layers = mbs[0].replay_experts.shape[1]
                eager = torch.full((max_rows, layers, self.K), 999, dtype=dtype)
                staged_buf = torch.full_like(eager, 999)
                staged = self.st.StaticReplayTargets(staged_buf, spec=self.spec,
                                                     masked_fill_minus_one=fill)
                # Largest first, so every later one overwrites its rows.
                for mb in sorted(mbs, key=lambda m: -m.replay_experts.shape[0]):
                    rows = self.st.write_replay_targets(mb, eager, num_experts=self.E,
                                                        masked_fill_minus_one=fill)
                    self.assertEqual(rows, mb.replay_experts.shape[0])
                    what = "rank %s mb %d %s fill=%s" % (rank, mb.index, dtype, fill)
                    # Bit-exact against the per-micro-batch path.
                    self.assertTrue(torch.equal(eager[:rows].permute(1, 0, 2),
                                                mb.replay_indices), what)
                    want = expected(mb.replay_experts.numpy(), mb.replay_mask.numpy(), max_rows,
                                    self.E, fill)
                    np.testing.assert_array_equal(eager.numpy(), want.astype(eager.numpy().dtype),
                                                  err_msg=what)
                    self.assertEqual(staged(mb), rows)
                    self.assertEqual(staged.staged_rows, rows)
                    self.assertTrue(torch.equal(staged_buf, eager), what)
                    n += 1
        self.assertGreater(n, 16)

    def test_without_replay_ids_the_static_targets_are_the_same(self):
        # replay_ids=False: no per-micro-batch ids, the same static targets
        # from the received replay_experts.
        n = 0
        for rank in self.ranks():
            with_ids = self.fetch(rank)
            without = self.fetch(rank, replay_ids=False)
            self.assertEqual(len(with_ids), len(without))
            max_rows = max(mb.replay_experts.shape[0] for mb in with_ids)
            layers = with_ids[0].replay_experts.shape[1]
            for a, b in zip(with_ids, without):
                self.assertIsNone(b.replay_indices)
                self.assertIsNotNone(a.replay_indices)
                self.assertTrue(torch.equal(a.replay_experts, b.replay_experts))
                self.assertTrue(torch.equal(a.replay_mask, b.replay_mask))
                want = torch.full((max_rows, layers, self.K), 999, dtype=torch.int64)
                got = torch.full_like(want, 999)
                self.st.write_replay_targets(a, want, num_experts=self.E)
                self.st.write_replay_targets(b, got, num_experts=self.E)
                self.assertTrue(torch.equal(got, want), "rank %s mb %d" % (rank, b.index))
                n += 1
        self.assertGreater(n, 8)

    def test_slice_of_a_larger_buffer_and_layer_major(self):
        mb = self.fetch((0, 1, 1, 0))[0]
        rows, layers, k = mb.replay_experts.shape
        big = torch.full((rows + 5, layers + 2, k + 3), -9, dtype=torch.int64)
        view = big[:, 1:layers + 1, 2:k + 2]
        self.st.write_replay_targets(mb, view, num_experts=self.E)
        want = expected(mb.replay_experts.numpy(), mb.replay_mask.numpy(), rows + 5, self.E,
                        False)
        np.testing.assert_array_equal(view.numpy(), want)
        untouched = big.clone()
        untouched[:, 1:layers + 1, 2:k + 2] = -9
        self.assertTrue(bool((untouched == -9).all()))
        # [layers, max_rows, K] (Unpack's own layout) seen as [max_rows, layers, K].
        lm = torch.empty((layers, rows + 2, k), dtype=torch.int64)
        self.st.write_replay_targets(mb, lm.permute(1, 0, 2), num_experts=self.E)
        self.assertTrue(torch.equal(lm[:, :rows], mb.replay_indices))

    def test_refusals(self):
        mb = self.fetch((0, 0, 0, 0))[0]
        rows, layers, k = mb.replay_experts.shape
        small = torch.empty((rows - 1, layers, k), dtype=torch.int64)
        with self.assertRaises(ValueError) as c:
            self.st.write_replay_targets(mb, small, num_experts=self.E)
        self.assertEqual(str(c.exception), "micro-batch %d has %d router rows but the static "
                         "buffer holds max_rows = %d" % (mb.index, rows, rows - 1))
        with self.assertRaisesRegex(ValueError, "%d replay layers but the static buffer has %d"
                                    % (layers, layers + 1)):
            self.st.write_replay_targets(mb, torch.empty((rows, layers + 1, k),
                                                         dtype=torch.int64), num_experts=self.E)
        with self.assertRaisesRegex(ValueError, "K = %d but the static buffer has K = %d"
                                    % (k, k + 1)):
            self.st.write_replay_targets(mb, torch.empty((rows, layers, k + 1),
                                                         dtype=torch.int64), num_experts=self.E)
        buf = torch.empty((rows, layers, k), dtype=torch.int64)
        with self.assertRaisesRegex(ValueError, "num_experts"):
            self.st.write_replay_targets(mb, buf)
        with self.assertRaisesRegex(TypeError, "int64 or int32"):
            self.st.write_replay_targets(mb, buf.float(), num_experts=self.E)
        with self.assertRaisesRegex(ValueError, "contiguous"):
            self.st.write_replay_targets(mb, torch.empty((rows, k, layers), dtype=torch.int64)
                                         .permute(0, 2, 1), num_experts=self.E)
        # E < K: the kernel's own check reaches Python with the value named.
        with self.assertRaisesRegex(errors.RollpackError, "num_experts.*got 2"):
            self.st.write_replay_targets(mb, buf, num_experts=2)
        staged = self.st.StaticReplayTargets(small, num_experts=self.E)
        with self.assertRaisesRegex(ValueError, "router rows but the static buffer"):
            staged.stage(mb)
        self.assertEqual(int(staged.rows[0]), 0)  # nothing staged
        wide = self.st.StaticReplayTargets(buf, num_experts=self.E, in_dtype=torch.int16)
        with self.assertRaisesRegex(ValueError, "holds torch.uint8 ids but the staging is "
                                    "torch.int16"):
            wide.stage(mb)

    def test_before_any_stage_the_buffer_is_all_filler(self):
        buf = torch.full((9, 2, 3), 5, dtype=torch.int64)
        self.st.StaticReplayTargets(buf, num_experts=7).write()
        want = np.array([[[(r * 3 + j) % 7 for j in range(3)]] * 2 for r in range(9)])
        np.testing.assert_array_equal(buf.numpy(), want)


class StandInRouterReplay:
    """Megatron's RouterReplay interface (router_replay.py), static buffers
    included."""

    def __init__(self):
        self.target_topk_idx = None
        self.replay_backward_list = []
        self.static_buffer = None
        self.router_replay_action = None

    def set_target_indices(self, t):
        self.target_topk_idx = t
        self.replay_backward_list.append(t)

    def set_static_buffer(self, b):
        self.static_buffer = b

    def clear_static_buffer(self):
        self.static_buffer = None

    def set_router_replay_action(self, a):
        self.router_replay_action = a

    def clear_router_replay_action(self):
        self.router_replay_action = None

    def clear_indices(self):
        self.target_topk_idx = None
        self.replay_backward_list = []


class InstallStaticBuffer(unittest.TestCase):
    def setUp(self):
        self.st = _static()

    def test_views_not_copies(self):
        buf = torch.zeros((10, 3, 2), dtype=torch.int64)
        inst = [StandInRouterReplay() for _ in range(3)]
        self.assertEqual(self.st.install_static_buffer(buf, inst, action="replay_forward"), 3)
        for l, r in enumerate(inst):
            self.assertEqual(r.static_buffer.data_ptr(), buf[:, l, :].data_ptr())
            self.assertEqual(tuple(r.target_topk_idx.shape), (10, 2))
            self.assertEqual(r.router_replay_action, "replay_forward")
        # A later write is what the routers read.
        mb = types.SimpleNamespace(index=0, replay_experts=torch.randint(0, 8, (4, 3, 2),
                                                                         dtype=torch.uint8),
                                   replay_mask=torch.ones(4, dtype=torch.uint8))
        self.st.write_replay_targets(mb, buf, num_experts=8)
        for l, r in enumerate(inst):
            self.assertTrue(torch.equal(r.target_topk_idx[:4], mb.replay_experts[:, l].long()))
        self.st.install_static_buffer(buf, inst, rows=4)
        self.assertEqual(tuple(inst[0].target_topk_idx.shape), (4, 2))
        self.assertEqual(len(inst[0].replay_backward_list), 2)

    def test_mtp_routers_left_live_and_mismatch_refused(self):
        buf = torch.zeros((6, 2, 2), dtype=torch.int64)
        inst = [StandInRouterReplay() for _ in range(3)]
        inst[2].set_static_buffer(torch.zeros(6, 2, dtype=torch.int64))
        inst[2].set_target_indices(torch.zeros(6, 2, dtype=torch.int64))
        inst[2].set_router_replay_action("replay_forward")
        self.assertEqual(self.st.install_static_buffer(buf, inst, num_mtp_layers=1), 2)
        self.assertIsNone(inst[2].static_buffer)
        self.assertIsNone(inst[2].target_topk_idx)
        self.assertIsNone(inst[2].router_replay_action)
        with self.assertRaisesRegex(ValueError, "2 replay layers but 3 RouterReplay instances"):
            self.st.install_static_buffer(buf, inst)
        with self.assertRaisesRegex(ValueError, "rows=7 is outside"):
            self.st.install_static_buffer(buf, inst[:2], rows=7)


if __name__ == "__main__":
    unittest.main()
