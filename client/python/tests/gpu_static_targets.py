"""GPU tests of static replay buffers (rollpack.static_targets), for the
device tool (skip without CUDA):

- write_replay_targets on micro-batches TrainerClient staged on the GPU, for
  every rank of a cp=2 tp=2 pp=2 step, uint8 (E = 64) and uint16 (E = 300)
  ids, int64 and int32 buffers, with and without -1 fill: bit-exact against
  the per-micro-batch path (``replay_indices``) and against the CPU
  reference path on the same buffer; no allocation (torch's allocator
  counters unchanged);
- StaticReplayTargets.write captured once in a torch.cuda.CUDAGraph together
  with a router-like gather reading the buffer's per-layer views, replayed
  for micro-batches of different sizes staged outside the graph: the buffer
  and the gathered probabilities equal the per-micro-batch path's after
  every replay, and rows past each micro-batch hold the filler.

    ROLLPACKD=build/bin/rollpackd python3 -m unittest -v tests.gpu_static_targets   (in client/python)
"""

import unittest

import torch

from tests.gpu_trainer import TOPO, setup_steps
from tests.rollpackd import Rollpackd

CUDA = torch.cuda.is_available()
E = {"u8": 64, "u16": 300}


def filler(max_rows, rows, layers, k, e):
    r = torch.arange(rows, max_rows, dtype=torch.int64)[:, None]
    j = torch.arange(k, dtype=torch.int64)[None, :]
    return ((r * k + j) % e)[:, None, :].expand(max_rows - rows, layers, k)


def alloc_counts():
    s = torch.cuda.memory_stats()
    return s.get("allocation.all.allocated", 0), s.get("allocated_bytes.all.allocated", 0)


@unittest.skipUnless(CUDA, "no CUDA device")
class GpuStaticTargets(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from rollpack import _capi
        _capi.abi_version()
        cls.d = Rollpackd()
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        setup_steps(cls.d.address)

    def fetch(self, step, rank, device, **opts):
        from rollpack.trainer import TrainerClient
        return list(TrainerClient(self.d.address, step, rank, device, **opts))

    def test_eager_write_equals_per_microbatch_path(self):
        from rollpack.static_targets import write_replay_targets
        n = 0
        for step in ("u8", "u16"):
            for opts in ({}, {"index_dtype": torch.int32, "masked_fill_minus_one": True}):
                dtype = opts.get("index_dtype", torch.int64)
                fill = opts.get("masked_fill_minus_one", False)
                for cp in range(TOPO["cp"]):
                    for tp in range(TOPO["tp"]):
                        for pp in range(TOPO["pp"]):
                            rank = (0, cp, tp, pp)
                            gpu = self.fetch(step, rank, "cuda:0", **opts)
                            cpu = self.fetch(step, rank, "cpu", delivery="proxy", **opts)
                            layers = gpu[0].replay_experts.shape[1]
                            k = gpu[0].replay_experts.shape[2]
                            max_rows = max(m.replay_experts.shape[0] for m in gpu) + 33
                            buf = torch.full((max_rows, layers, k), -7, dtype=dtype,
                                             device="cuda")
                            hbuf = torch.full((max_rows, layers, k), -7, dtype=dtype)
                            for a, b in zip(gpu, cpu):
                                torch.cuda.synchronize()
                                before = alloc_counts()
                                rows = write_replay_targets(a, buf, num_experts=E[step],
                                                            masked_fill_minus_one=fill)
                                after = alloc_counts()
                                write_replay_targets(b, hbuf, num_experts=E[step],
                                                     masked_fill_minus_one=fill)
                                torch.cuda.synchronize()
                                what = "%s %s mb %d %s" % (step, rank, a.index, opts)
                                self.assertEqual(before, after, what + ": allocated")
                                got = buf.cpu()
                                self.assertTrue(torch.equal(got[:rows].permute(1, 0, 2),
                                                            a.replay_indices.cpu()), what)
                                self.assertTrue(torch.equal(got, hbuf), what + ": vs CPU")
                                self.assertTrue(torch.equal(
                                    got[rows:], filler(max_rows, rows, layers, k,
                                                       E[step]).to(dtype)), what + ": filler")
                                n += 1
        self.assertGreater(n, 16)

    def test_without_replay_ids_on_the_gpu(self):
        # replay_ids=False: staged without ids or the unpack kernel; the static
        # targets are the same.
        from rollpack.static_targets import write_replay_targets
        n = 0
        for step in ("u8", "u16"):
            rank = (0, 1, 0, 1)
            with_ids = self.fetch(step, rank, "cuda:0")
            without = self.fetch(step, rank, "cuda:0", replay_ids=False)
            self.assertEqual(len(with_ids), len(without))
            for a, b in zip(with_ids, without):
                self.assertIsNone(b.replay_indices)
                layers, k = a.replay_experts.shape[1], a.replay_experts.shape[2]
                want = torch.full((a.replay_experts.shape[0], layers, k), -7, dtype=torch.int64,
                                  device="cuda")
                got = torch.full_like(want, -7)
                write_replay_targets(a, want, num_experts=E[step])
                write_replay_targets(b, got, num_experts=E[step])
                torch.cuda.synchronize()
                self.assertTrue(torch.equal(got, want), "%s mb %d" % (step, b.index))
                n += 1
        self.assertGreater(n, 2)

    def test_captured_graph_replayed_for_several_microbatches(self):
        from rollpack.static_targets import StaticReplayTargets, install_static_buffer
        for step in ("u8", "u16"):
            e = E[step]
            # Every micro-batch of two ranks of the last pipeline stage (same
            # layers, SP rows), so that sizes differ between replays.
            mbs = (self.fetch(step, (0, 0, 1, 1), "cuda:0") +
                   self.fetch(step, (0, 1, 0, 1), "cuda:0"))
            sizes = sorted({m.replay_experts.shape[0] for m in mbs})
            self.assertGreater(len(sizes), 1, "micro-batches of one size only")
            layers, k = mbs[0].replay_experts.shape[1:]
            max_rows = max(sizes) + 64
            buf = torch.empty((max_rows, layers, k), dtype=torch.int64, device="cuda")
            static = StaticReplayTargets(buf, num_experts=e)
            self.assertEqual(static.experts.dtype, torch.uint8 if e <= 256 else torch.int16)
            inst = [_router() for _ in range(layers)]
            install_static_buffer(static, inst)
            scores = torch.randn(max_rows, e, device="cuda")
            probs = torch.empty((layers, max_rows, k), device="cuda")
            # Warm up on a side stream (torch's rule for capture), then capture
            # the write and a router-like gather from each layer's target view.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                static.write()
                for l, r in enumerate(inst):
                    torch.gather(scores, 1, r.target_topk_idx, out=probs[l])
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static.write()
                for l, r in enumerate(inst):
                    torch.gather(scores, 1, r.target_topk_idx, out=probs[l])
            replays = 0
            for mb in mbs:
                rows = static.stage(mb)
                g.replay()
                torch.cuda.synchronize()
                what = "%s mb %d rows %d" % (step, mb.index, rows)
                want = torch.cat([mb.replay_indices.permute(1, 0, 2).cpu(),
                                  filler(max_rows, rows, layers, k, e)])
                self.assertTrue(torch.equal(buf.cpu(), want), what)
                # What the captured router read: the per-micro-batch targets.
                per_mb = torch.stack([torch.gather(scores[:rows], 1, t)
                                      for t in mb.replay_indices])
                self.assertTrue(torch.equal(probs[:, :rows], per_mb), what + ": gather")
                replays += 1
            self.assertEqual(replays, len(mbs))


def _router():
    """A stand-in with Megatron's RouterReplay interface (tests.test_static_targets)."""
    from tests.test_static_targets import StandInRouterReplay
    return StandInRouterReplay()


if __name__ == "__main__":
    unittest.main()
