"""GPU tests of the trainer side, for the device tool (skip without CUDA):

- TrainerClient on cuda (pinned staging, async copy, CUDA unpack) equals
  TrainerClient on cpu (CPU reference) for every rank of a cp=2 tp=2 pp=2
  step, uint8 and uint16 ids, int64 and int32, with and without -1 fill,
  the per-sequence metadata included (the steps are GRPO steps: groups of
  4, a reward each, advantages on the device; lifecycle.md section 6), and a
  ragged "sampling_mask" (layout.md section 13; int32 on the wire for the
  pool without a vocab_size, uint16 for the one with, int32 on the device);
- apply_replay (forward, backward) and routing_agreement on CUDA equal the
  CPU reference path;
- TP-leader mode (needs 2 GPUs): two processes, one per GPU, each TP group
  of the step fetched through the leader and distributed over NCCL, compared
  tensor by tensor with per-rank fetching on the same GPU.

    ROLLPACKD=build/bin/rollpackd python3 -m unittest -v tests.gpu_trainer   (in client/python)
"""

import os
import sys
import unittest
import uuid

import numpy as np
import torch
import torch.multiprocessing as mp

os.environ["NCCL_NVLS_ENABLE"] = "0"  # never NVLink multicast on the shared machine

import rollpack  # noqa: E402
from rollpack._proto import scheduler_pb2, scheduler_pb2_grpc  # noqa: E402
from tests.rollpackd import Rollpackd  # noqa: E402
from tests.test_trainer import make_samples  # noqa: E402

CUDA = torch.cuda.is_available()
TOPO = dict(dp=1, cp=2, tp=2, pp=2)
NAMES = ("tokens", "cu_seqlens", "cu_seqlens_padded", "replay_experts", "replay_mask",
         "replay_indices")
META = ("index", "num_microbatches", "local_cp_size", "local_cp_rank", "max_seqlen",
        "sample_ids", "replay_layers")


def sampling_mask(rng, n):
    """(values, offsets): 0..12 kept ids in [0, 50000) per token."""
    counts = rng.integers(0, 13, n)
    offsets = np.zeros(n + 1, np.int64)
    offsets[1:] = np.cumsum(counts)
    return rng.integers(0, 50000, int(offsets[-1])).astype(np.int32), offsets


def setup_steps(address):
    import grpc
    ch = grpc.insecure_channel(address)
    sched = scheduler_pb2_grpc.SchedulerStub(ch)
    for pool, e, k, vocab in (("u8", 64, 6, 0), ("u16", 300, 8, 50000)):
        spec = rollpack.ModelSpec("m", num_layers=6, moe_layers=[1, 2, 4, 5], num_experts=e, topk=k,
                                  vocab_size=vocab)
        rng = np.random.default_rng(len(pool) + e)
        samples = make_samples(rng, 24, 6, [1, 2, 4, 5], e, k, max_len=900)
        # Groups of 4 with a reward each: the step sends group ids, versions,
        # the reward and GRPO advantages (staged as cu_seqlens are).
        samples = [rollpack.Sample(s.sample_id, s.tokens, s.routed_experts, s.row_offset,
                                   token_fields=s.token_fields, group_id="g%d" % (i // 4),
                                   group_size=4, policy_version=i % 3,
                                   scalars={"reward": float(rng.integers(0, 3))},
                                   ragged_token_fields={"sampling_mask": sampling_mask(
                                       rng, len(s.tokens))})
                   for i, s in enumerate(samples)]
        with rollpack.Producer(address, pool) as p:
            p.register_model(spec)
            p.put(samples)
        sched.CreateStep(scheduler_pb2.CreateStepRequest(
            step_id=pool, pool=pool, num_samples=24, advantage=scheduler_pb2.ADVANTAGE_GRPO,
            topology=scheduler_pb2.Topology(max_tokens_per_rank=1024, **TOPO)), timeout=60)
    ch.close()


def assert_same(test_eq, a, b, what):
    for k in META:
        test_eq(getattr(a, k) == getattr(b, k), "%s: %s differs" % (what, k))
    for n in NAMES:
        x, y = getattr(a, n), getattr(b, n)
        test_eq(x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.cpu(), y.cpu()),
                "%s: %s differs" % (what, n))
    test_eq(sorted(a.token_fields) == sorted(b.token_fields), what + ": fields")
    test_eq(sorted(a.ragged_token_fields) == sorted(b.ragged_token_fields) ==
            (["sampling_mask"] if a.token_fields else []), what + ": ragged fields")
    for n, (values, offsets) in a.ragged_token_fields.items():
        other = b.ragged_token_fields[n]
        test_eq(values.device == offsets.device == a.cu_seqlens.device and
                values.dtype == torch.int32 and offsets.dtype == torch.int64 and
                torch.equal(values.cpu(), other.values.cpu()) and
                torch.equal(offsets.cpu(), other.offsets.cpu()), what + ": ragged " + n)
    for n in a.token_fields:
        test_eq(torch.equal(a.token_fields[n].cpu(), b.token_fields[n].cpu()), what + ": " + n)
    test_eq(a.group_ids == b.group_ids and len(a.group_ids) == len(a.sample_ids),
            what + ": group_ids")
    test_eq(torch.equal(a.policy_versions, b.policy_versions), what + ": policy_versions")
    test_eq(sorted(a.scalars) == sorted(b.scalars) == ["reward"], what + ": scalars")
    for n in a.scalars:
        test_eq(a.scalars[n].device == a.cu_seqlens.device and
                torch.equal(a.scalars[n].cpu(), b.scalars[n].cpu()), what + ": scalar " + n)
    test_eq(a.advantages is not None and a.advantages.device == a.cu_seqlens.device and
            a.advantages.dtype == torch.float32 and
            torch.equal(a.advantages.cpu(), b.advantages.cpu()), what + ": advantages")


@unittest.skipUnless(CUDA, "no CUDA device")
class GpuTrainer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Rollpackd()
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        setup_steps(cls.d.address)

    def test_cuda_equals_cpu_every_rank(self):
        from rollpack.trainer import TrainerClient
        n = 0
        for step in ("u8", "u16"):
            for opts in ({}, {"index_dtype": torch.int32, "masked_fill_minus_one": True}):
                for cp in range(2):
                    for tp in range(2):
                        for pp in range(2):
                            rank = (0, cp, tp, pp)
                            # Direct pulls (auto) staged on the GPU vs the
                            # proxied stream on the host.
                            gpu = list(TrainerClient(self.d.address, step, rank, "cuda:0", **opts))
                            cpu = list(TrainerClient(self.d.address, step, rank, "cpu",
                                                     delivery="proxy", **opts))
                            self.assertEqual(len(gpu), len(cpu))
                            for a, b in zip(gpu, cpu):
                                self.assertEqual(a.replay_indices.device.type, "cuda")
                                assert_same(self.assertTrue, a, b, "%s %s %s" % (step, rank, opts))
                                n += 1
        self.assertGreater(n, 16)

    def test_kernels_cuda_equal_cpu(self):
        g = torch.Generator().manual_seed(0)
        for e, k, dt in ((64, 6, torch.float32), (256, 8, torch.bfloat16)):
            x = (torch.randn(3000, e, generator=g) * 2).to(dt)
            ids = torch.argsort(torch.rand(3000, e, generator=g), 1)[:, :k]
            for score in ("softmax", "sigmoid"):
                xc = x.clone().requires_grad_(True)
                xg = x.cuda().requires_grad_(True)
                pc, mc = rollpack.apply_replay(xc, ids, score=score)
                pg, mg = rollpack.apply_replay(xg, ids.cuda(), score=score)
                self.assertTrue(torch.equal(mc, mg.cpu()))
                torch.testing.assert_close(pg.cpu(), pc, rtol=1e-5, atol=1e-6)
                w = torch.randn(3000, k, generator=g)
                (pc * w).sum().backward()
                (pg * w.cuda()).sum().backward()
                tol = 1e-5 if dt == torch.float32 else 2e-2
                torch.testing.assert_close(xg.grad.cpu().float(), xc.grad.float(), rtol=tol, atol=tol)
            logits = torch.randn(4, 3000, e, generator=g)
            rep = logits.topk(k, -1).indices
            rep[:, ::5, 0] = (rep[:, ::5, 0] + 1) % e
            mask = torch.rand(3000, generator=g) < 0.9
            a = rollpack.routing_agreement(logits, rep, mask=mask)
            b = rollpack.routing_agreement(logits.cuda(), rep.cuda(), mask=mask.cuda())
            self.assertEqual(a.rows_differ.tolist(), b.rows_differ.tolist())
            self.assertEqual(a.overlap_sum.tolist(), b.overlap_sum.tolist())
            self.assertGreater(a.fraction_differ, 0.1)


def _tp_worker(tp, address, tag, queue):
    try:
        torch.cuda.set_device(tp)
        from rollpack.trainer import TrainerClient
        checked = 0
        for step in ("u8", "u16"):
            for cp in range(2):
                for pp in range(2):
                    rank = (0, cp, tp, pp)
                    dev = "cuda:%d" % tp
                    led = list(TrainerClient(address, step, rank, dev, tp_leader=True, tp_size=2,
                                             rendezvous_tag=tag, rendezvous_timeout_s=60))
                    own = list(TrainerClient(address, step, rank, dev))
                    if len(led) != len(own):
                        raise AssertionError("%s %s: %d vs %d micro-batches" % (step, rank, len(led), len(own)))

                    def eq(ok, what):
                        if not ok:
                            raise AssertionError(what)
                    for a, b in zip(led, own):
                        eq(a.replay_indices.device == torch.device(dev), "device")
                        assert_same(eq, a, b, "tp-leader %s %s mb %d" % (step, rank, b.index))
                        checked += 1
        queue.put((tp, "ok", checked))
    except BaseException as e:  # report, never hang the parent
        import traceback
        queue.put((tp, "fail", "%s\n%s" % (e, traceback.format_exc())))


@unittest.skipUnless(CUDA and torch.cuda.device_count() >= 2, "TP-leader test needs 2 GPUs")
class GpuTpLeader(unittest.TestCase):
    def test_tp_leader_equals_per_rank_fetch(self):
        with Rollpackd() as d:
            setup_steps(d.address)
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            tag = uuid.uuid4().hex
            procs = [ctx.Process(target=_tp_worker, args=(t, d.address, tag, q)) for t in range(2)]
            for p in procs:
                p.start()
            results = []
            for _ in procs:
                results.append(q.get(timeout=240))
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
            for tp, status, detail in sorted(results):
                self.assertEqual(status, "ok", "tp %d: %s" % (tp, detail))
                self.assertGreater(detail, 8)
            print("TP-leader: %s micro-batches per rank identical" % [r[2] for r in sorted(results)],
                  file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
