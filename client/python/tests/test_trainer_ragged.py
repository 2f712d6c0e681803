"""Ragged token fields on the trainer side (layout.md section 13;
docs/trainer.md, "Ragged token fields"): TrainerClient hands each one over as
RaggedTensors(values int32, offsets int64) on its device.

Micro-batches written here are streamed by an in-process Trainer server
(fake_trainer.py), whole (delivery "proxy") and in pieces from two members
(delivery "direct": the header piece names the second member; one piece's
rows all have empty lists), and compared with numpy's reading of the same
bytes: uint16 ids above 32767 arrive intact (widened to int32), offsets as
sent. Forged offsets are refused with DATA_LOSS naming the field, whole or
in a piece. Then through a real rollpackd (Producer -> CreateStep -> fetch):
each row's list is its token's, on every rank equal to the wire's bytes.

Needs torch and librollpack_trainer.so, as test_trainer. The CUDA variant
runs on a GPU only (device tool: client/python/device/run_device.sh) and
skips otherwise.
"""

import unittest

import grpc
import numpy as np

from rollpack import errors
from rollpack import ndarray as nd
from rollpack._proto import ndarray_pb2, trainer_pb2
from tests.fake_trainer import ServeTrainer
from tests.test_trainer import _need_trainer, torch

ROWS = 40


def lists(rng, rows, high, empty_from=None):
    """Per row a list of 0..6 distinct ids in [0, high) (a quarter empty;
    every row from `empty_from` on empty, as padding rows are)."""
    out = []
    for r in range(rows):
        n = 0 if (empty_from is not None and r >= empty_from) or rng.random() < 0.25 \
            else int(rng.integers(1, 7))
        out.append(np.sort(rng.choice(high, size=n, replace=False)))
    return out


def ragged(pb, rows_lists, dtype):
    offsets = np.zeros(len(rows_lists) + 1, np.int64)
    offsets[1:] = np.cumsum([len(x) for x in rows_lists])
    values = np.concatenate(rows_lists).astype(dtype) if rows_lists else np.zeros(0, dtype)
    nd.fill(pb.values, values)
    nd.fill(pb.offsets, offsets)
    return values, offsets


def microbatch(rng, index, count, empty_from=None):
    """A micro-batch of ROWS token rows, two sequences, with a uint16
    "sampling_mask" (ids over the whole 16 bits) and an int32 "kept"."""
    m = trainer_pb2.Microbatch(step_id="st", index=index, num_microbatches=count,
                               local_cp_size=1, max_seqlen=ROWS, sample_ids=["a", "b"])
    nd.fill(m.cu_seqlens, np.array([0, 17, 33], np.int32))
    nd.fill(m.cu_seqlens_padded, np.array([0, 20, ROWS], np.int32))
    nd.fill(m.tokens, rng.integers(0, 1000, ROWS).astype(np.int32))
    nd.fill(m.token_fields["logprobs"], rng.standard_normal(ROWS).astype(np.float32))
    ragged(m.ragged_token_fields["sampling_mask"],
           lists(rng, ROWS, 65536, empty_from), np.uint16)
    ragged(m.ragged_token_fields["kept"], lists(rng, ROWS, 200000), np.int32)
    return m


def piece_rows(m, first, n, header, members=(), member=""):
    """m's rows [first, first + n) as one piece (trainer.proto, PieceRows)."""
    if header:
        p = trainer_pb2.Microbatch()
        p.CopyFrom(m)
        p.piece.header = True
        p.piece.members.extend(members)
    else:
        p = trainer_pb2.Microbatch(step_id=m.step_id, index=m.index,
                                   num_microbatches=m.num_microbatches)
        p.piece.member = member
        p.tokens.CopyFrom(m.tokens)
        for name, a in m.token_fields.items():
            p.token_fields[name].CopyFrom(a)
    p.piece.token_rows.extend([first, n])
    for a in [p.tokens] + list(p.token_fields.values()):
        whole = nd.from_proto(a)
        a.data = whole[first:first + n].tobytes()
    for name, r in m.ragged_token_fields.items():
        values, offsets = nd.from_proto(r.values), nd.from_proto(r.offsets)
        rows = [values[offsets[i]:offsets[i + 1]] for i in range(first, first + n)]
        ragged(p.ragged_token_fields[name], rows, values.dtype)
    return p


class RaggedCpu(unittest.TestCase):
    DEVICE = "cpu"

    @classmethod
    def setUpClass(cls):
        cls.trainer = _need_trainer()
        rng = np.random.default_rng(11)
        cls.whole = [microbatch(rng, i, 3, empty_from=25 if i == 1 else None) for i in range(3)]
        # No ragged field at all in a fourth step's micro-batch.
        cls.plain = trainer_pb2.Microbatch()
        cls.plain.CopyFrom(cls.whole[0])
        cls.plain.ClearField("ragged_token_fields")

    def serve(self, microbatches=(), pieces=None):
        s = ServeTrainer(microbatches, pieces)
        self.addCleanup(s.stop)
        return s

    def fetch(self, address, **kw):
        with self.trainer.TrainerClient(address, "st", (0, 0, 0, 0), self.DEVICE, **kw) as c:
            return list(c)

    def assertRaggedEqual(self, mb, m):
        self.assertEqual(sorted(mb.ragged_token_fields), sorted(m.ragged_token_fields))
        for name, r in m.ragged_token_fields.items():
            got = mb.ragged_token_fields[name]
            values, offsets = got  # unpacks as a pair
            what = "micro-batch %d %s" % (m.index, name)
            self.assertEqual(values.dtype, torch.int32, what)
            self.assertEqual(offsets.dtype, torch.int64, what)
            self.assertEqual(values.device.type, torch.device(self.DEVICE).type, what)
            self.assertEqual(offsets.device.type, torch.device(self.DEVICE).type, what)
            np.testing.assert_array_equal(values.cpu().numpy(),
                                          nd.from_proto(r.values).astype(np.int32), what)
            np.testing.assert_array_equal(offsets.cpu().numpy(), nd.from_proto(r.offsets), what)
            self.assertEqual(got.rows, mb.tokens.numel())
            np.testing.assert_array_equal(got.lengths().cpu().numpy(),
                                          np.diff(nd.from_proto(r.offsets)))

    def test_whole_microbatches(self):
        s = self.serve(self.whole)
        got = self.fetch(s.address, delivery="proxy", prefetch=2)
        self.assertEqual([mb.index for mb in got], [0, 1, 2])
        for mb, m in zip(got, self.whole):
            self.assertRaggedEqual(mb, m)
        mask = got[0].ragged_token_fields["sampling_mask"].values
        self.assertGreater(int(mask.max()), 32767)  # widened, not read as int16
        # Lists of the padding rows (rows 25.. of micro-batch 1) are empty.
        offsets = got[1].ragged_token_fields["sampling_mask"].offsets
        self.assertTrue(bool((offsets[25:] == offsets[25]).all()))
        # A micro-batch without ragged fields has none.
        plain = self.fetch(self.serve([self.plain]).address, delivery="proxy")
        self.assertEqual(plain[0].ragged_token_fields, {})

    def test_pieces_from_two_members(self):
        member = self.serve()
        headers, pieces = [], []
        for m in self.whole:
            # Rows [0, 25) from the member dialled, [25, 40) from the other
            # (micro-batch 1: all of its sampling_mask lists there empty).
            headers.append(piece_rows(m, 0, 25, True, members=[member.address]))
            pieces.append(piece_rows(m, 25, ROWS - 25, False, member=member.address))
        member.servicer.pieces = pieces
        dialled = self.serve(self.whole, headers)
        got = self.fetch(dialled.address, delivery="direct")
        self.assertEqual(len(got), 3)
        for mb, m in zip(got, self.whole):
            self.assertRaggedEqual(mb, m)
        self.assertEqual(len(nd.from_proto(pieces[1].ragged_token_fields["sampling_mask"].values)),
                         0)
        self.assertEqual([c[0] for c in dialled.servicer.calls], ["FetchPieces"])
        self.assertEqual([c[0] for c in member.servicer.calls], ["FetchPieces"])
        # "auto" against a server without FetchPieces: the same, proxied.
        auto = self.fetch(self.serve(self.whole).address, delivery="auto")
        for mb, m in zip(auto, self.whole):
            self.assertRaggedEqual(mb, m)

    @staticmethod
    def forge(m):
        """m with offsets[3] past offsets[4]: row 3 ends before it starts."""
        f = trainer_pb2.Microbatch()
        f.CopyFrom(m)
        offsets = nd.from_proto(f.ragged_token_fields["sampling_mask"].offsets).copy()
        offsets[3] = offsets[4] + 1
        nd.fill(f.ragged_token_fields["sampling_mask"].offsets, offsets)
        return f

    def test_forged_offsets_are_refused(self):
        with self.assertRaises(errors.RollpackError) as cm:
            self.fetch(self.serve([self.forge(self.whole[0])]).address, delivery="proxy",
                       max_resumes=0)
        self.assertEqual(cm.exception.code, grpc.StatusCode.DATA_LOSS)
        self.assertIn('ragged_token_fields["sampling_mask"]: offsets[4] is', str(cm.exception))
        self.assertEqual(cm.exception.resume_from, 0)

    def test_forged_piece_is_refused(self):
        member = self.serve()
        member.servicer.pieces = [
            self.forge(piece_rows(self.whole[0], 0, ROWS, False, member=member.address))]
        header = piece_rows(self.whole[0], 0, 0, True, members=[member.address])
        dialled = self.serve([], [header])
        with self.assertRaises(errors.RollpackError) as cm:
            self.fetch(dialled.address, delivery="direct", max_resumes=0)
        self.assertEqual(cm.exception.code, grpc.StatusCode.DATA_LOSS)
        for part in ("member " + member.address, "(direct pull)",
                     'ragged_token_fields["sampling_mask"]: offsets[4] is'):
            self.assertIn(part, str(cm.exception))


class RaggedThroughRollpackd(unittest.TestCase):
    """Samples with a sampling_mask put through a real rollpackd (vocab_size
    50000: stored and sent as uint16) and fetched: with cp = 1 each row's
    list is the sample's list of the token on that row (padding rows empty),
    checked independently of the server; with cp = 2 and pp = 2 the client's
    tensors equal FetchMicrobatches' bytes on every rank, direct and proxied,
    and only the last stage gets the field unless all_fields."""

    V = 50000

    @classmethod
    def setUpClass(cls):
        cls.trainer = _need_trainer()
        import rollpack
        from tests.rollpackd import Rollpackd
        cls.d = Rollpackd()
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        rng = np.random.default_rng(5)
        cls.lists = {}
        samples = []
        for i in range(16):
            n = int(rng.integers(20, 120))
            prompt = int(rng.integers(3, 10))
            rows = [np.zeros(0, np.int64) if t < prompt else np.sort(
                rng.choice(cls.V, size=int(rng.integers(0, 9)), replace=False))
                for t in range(n)]
            values, offsets = np.zeros(0, np.int32), np.zeros(n + 1, np.int64)
            if n:
                values = np.concatenate(rows).astype(np.int32)
                offsets[1:] = np.cumsum([len(r) for r in rows])
            sid = "s%d" % i
            cls.lists[sid] = rows
            samples.append(rollpack.Sample(
                sid, rng.integers(1, cls.V, n).astype(np.int32),
                token_fields={"logprobs": rng.standard_normal(n).astype(np.float32)},
                ragged_token_fields={"sampling_mask": (values, offsets)}))
        spec = rollpack.ModelSpec("tiny", num_layers=2, vocab_size=cls.V)
        with rollpack.Producer(cls.d.address, "pool") as p:
            p.register_model(spec)
            p.put(samples)
        cls.channel = grpc.insecure_channel(cls.d.address,
                                            [("grpc.max_receive_message_length", -1)])
        cls.addClassCleanup(cls.channel.close)
        from rollpack._proto import scheduler_pb2, scheduler_pb2_grpc, trainer_pb2_grpc
        cls.stub = trainer_pb2_grpc.TrainerStub(cls.channel)
        sched = scheduler_pb2_grpc.SchedulerStub(cls.channel)
        for step, topo in (("flat", dict(dp=1, cp=1, tp=1, pp=1)),
                           ("cp2", dict(dp=1, cp=2, tp=1, pp=2))):
            sched.CreateStep(scheduler_pb2.CreateStepRequest(
                step_id=step, pool="pool", num_samples=8,
                topology=scheduler_pb2.Topology(max_tokens_per_rank=512, **topo)), timeout=30)

    def fetch(self, step, rank, **kw):
        return list(self.trainer.TrainerClient(self.d.address, step, rank, "cpu", **kw))

    def test_rows_carry_their_tokens_lists(self):
        got = self.fetch("flat", (0, 0, 0, 0))
        self.assertGreater(len(got), 0)
        for mb in got:
            values, offsets = mb.ragged_token_fields["sampling_mask"]
            self.assertEqual(values.dtype, torch.int32)
            self.assertEqual(offsets.numel(), mb.tokens.numel() + 1)
            seq = mb.cu_seqlens.tolist()
            padded = mb.cu_seqlens_padded.tolist()
            for j, sid in enumerate(mb.sample_ids):
                for row in range(padded[j], padded[j + 1]):
                    t = row - padded[j]
                    want = self.lists[sid][t] if t < seq[j + 1] - seq[j] else []
                    np.testing.assert_array_equal(
                        values[offsets[row]:offsets[row + 1]].numpy(), want,
                        "micro-batch %d %s token %d" % (mb.index, sid, t))

    def test_every_rank_matches_the_wire(self):
        for cp in range(2):
            for pp in range(2):
                for all_fields in (False, True):
                    rank = (0, cp, 0, pp)
                    refs = list(self.stub.FetchMicrobatches(trainer_pb2.FetchRequest(
                        step_id="cp2", rank=trainer_pb2.RankCoords(cp=cp, pp=pp),
                        all_fields=all_fields), timeout=60))
                    for delivery in ("proxy", "direct"):
                        got = self.fetch("cp2", rank, all_fields=all_fields, delivery=delivery)
                        self.assertEqual(len(got), len(refs))
                        for mb, ref in zip(got, refs):
                            what = "rank %s all_fields %s %s mb %d" % (rank, all_fields,
                                                                       delivery, ref.index)
                            has = pp == 1 or all_fields
                            self.assertEqual(sorted(mb.ragged_token_fields),
                                             ["sampling_mask"] if has else [], what)
                            if not has:
                                continue
                            r = ref.ragged_token_fields["sampling_mask"]
                            self.assertEqual(r.values.dtype, ndarray_pb2.UINT16, what)
                            values, offsets = mb.ragged_token_fields["sampling_mask"]
                            np.testing.assert_array_equal(
                                values.numpy(), nd.from_proto(r.values).astype(np.int32), what)
                            np.testing.assert_array_equal(offsets.numpy(),
                                                          nd.from_proto(r.offsets), what)


class RaggedCuda(RaggedCpu):
    """The same on a GPU: staged through pinned memory, widened on the host."""
    DEVICE = "cuda:0"

    @classmethod
    def setUpClass(cls):
        trainer = _need_trainer()
        if not torch.cuda.is_available() or not trainer.has_cuda():
            raise unittest.SkipTest("no CUDA device, or a library built without CUDA")
        super().setUpClass()


if __name__ == "__main__":
    unittest.main()
