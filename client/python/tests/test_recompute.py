"""R2, recompute routing (docs/layout.md section 11), against a real rollpackd
with a durable log:

- every rank of a dp=2 cp=2 tp=2(SP) pp=2 step uploads routing made up per
  (sample, token, layer) for the rows it received; a step in another
  topology (dp=1 cp=1 tp=1 pp=3, dynamic CP) created with replay_source
  "recompute" after a restart delivers exactly that routing on every real
  row, mask 1, whatever the upload held on padding rows;
- uploading exactly what was delivered gives back the rollout routing (each
  entry's K ids as a set: rollpackd keeps them ascending);
- partial, conflicting, out-of-range, malformed uploads and commits are
  refused naming what is wrong, and change nothing.

Where each row of a rank comes from is tests/layout_rows.py's, written from
layout.md sections 2, 4 and 5 (independently of the server's code).
"""

import tempfile
import unittest

import grpc
import numpy as np

import rollpack
from rollpack import errors
from rollpack import ndarray as nd
from rollpack._proto import trainer_pb2, trainer_pb2_grpc
from rollpack.recompute import RoutingUploader, narrow_ids
from tests.layout_rows import router_positions
from tests.rollpackd import Rollpackd

N, MOE, E, K = 6, [1, 2, 4, 5], 64, 4
STEP_A = dict(dp=2, cp=2, tp=2, pp=2, max_tokens_per_rank=512)
STEP_B = dict(dp=1, cp=1, tp=1, pp=3, max_tokens_per_rank=4096, scheduler=1)  # DYNAMIC_CP


def wire(a):
    if not a.shape and not a.data:
        return np.zeros((0,), np.uint8)
    return np.frombuffer(a.data, nd.numpy_dtype(a.dtype)).reshape(tuple(a.shape))


def made_up(index, q, layer):
    """K distinct ids for (sample index, token q, layer): not the rollout's."""
    base = (q * 7 + layer * 13 + index * 5 + 3) % E
    return [(base + 3 * j) % E for j in range(K)]


class Recompute(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.data_dir = tempfile.TemporaryDirectory(prefix="rollpack-r2-")
        cls.addClassCleanup(cls.data_dir.cleanup)
        cls.start_daemon()
        rng = np.random.default_rng(5)
        cls.samples = {}
        for pool in ("made_up", "as_delivered"):
            with rollpack.Producer(cls.d.address, pool) as p:
                p.register_model(rollpack.ModelSpec(pool, num_layers=N, moe_layers=MOE,
                                                    num_experts=E, topk=K))
                batch = []
                for i in range(12):
                    n = int(rng.integers(5, 200))
                    toks = rng.integers(1, 1000, size=n).astype(np.int32)
                    ex = np.argsort(rng.random((n - 1, N, E)), axis=2)[:, :, :K].astype(np.int16)
                    s = rollpack.Sample("%s-%d" % (pool, i), toks, ex)
                    cls.samples[s.sample_id] = (i, s)
                    batch.append(s)
                p.put(batch)
                # A sample no step uploads routing for.
                p.put(rollpack.Sample(pool + "-bare", np.arange(1, 9, dtype=np.int32),
                                      np.zeros((7, N, K), np.int16) + np.arange(K, dtype=np.int16)))

    @classmethod
    def start_daemon(cls):
        cls.d = Rollpackd("--data-dir", cls.data_dir.name)
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        cls.channel = grpc.insecure_channel(cls.d.address,
                                            [("grpc.max_receive_message_length", -1)])
        cls.addClassCleanup(cls.channel.close)
        cls.stub = trainer_pb2_grpc.TrainerStub(cls.channel)
        cls.controller = rollpack.Controller(cls.d.address)
        cls.addClassCleanup(cls.controller.close)

    @classmethod
    def restart_daemon(cls):
        cls.controller.close()
        cls.channel.close()
        cls.d.stop()
        cls.start_daemon()

    # -- an independent inverse of layout.md sections 2, 4, 5 -----------------
    def row_positions(self, mb, rank, topo):
        """(sample id, position q) of every router row of `rank` (dp, cp, tp, pp)."""
        return router_positions(mb.sample_ids, lambda sid: len(self.samples[sid][1].tokens),
                                mb.local_cp_size, mb.local_cp_rank, topo["tp"], rank[2])

    def ranks(self, topo):
        for dp in range(topo["dp"]):
            for cp in range(topo["cp"]):
                for tp in range(topo["tp"]):
                    for pp in range(topo["pp"]):
                        yield (dp, cp, tp, pp)

    def fetch(self, step_id, rank):
        return list(self.stub.FetchMicrobatches(trainer_pb2.FetchRequest(
            step_id=step_id, rank=trainer_pb2.RankCoords(dp=rank[0], cp=rank[1], tp=rank[2],
                                                      pp=rank[3])), timeout=60))

    def made_up_upload(self, mb, rank, topo):
        rows = self.row_positions(mb, rank, topo)
        ids = np.zeros((len(rows), len(mb.replay_layers), K), np.int64)  # padding: all 0
        for row, (sid, q) in enumerate(rows):
            index, s = self.samples[sid]
            if q < len(s.tokens):
                for li, layer in enumerate(mb.replay_layers):
                    ids[row, li] = made_up(index, q, layer)
        return ids

    def create(self, step_id, pool, topo, **kw):
        return self.controller.create_step(step_id, pool, topology=topo,
                                           sample_ids=[sid for sid, (_, s) in self.samples.items()
                                                       if sid.startswith(pool + "-")], **kw)

    # -------------------------------------------------------------------------
    def test_1_made_up_routing_comes_back_in_another_topology(self):
        self.create("a", "made_up", STEP_A, reuse_samples=True)
        uploads = []  # (rank, mb, ids)
        for rank in self.ranks(STEP_A):
            for mb in self.fetch("a", rank):
                uploads.append((rank, mb, self.made_up_upload(mb, rank, STEP_A)))
        self.assertGreater(len(uploads), 8)

        # Nothing uploaded yet: the commit names it; no recompute step.
        with self.assertRaisesRegex(errors.FailedPrecondition, "no recorded routing"):
            self.controller.commit_routing("a")

        first_rank, first_mb, first_ids = uploads[0]
        with RoutingUploader(self.d.address, "a", first_rank) as up:
            # Malformed: wrong layer count, an id out of range, repeated ids.
            with self.assertRaisesRegex(errors.InvalidArgument, "shape"):
                up.upload(first_mb.index, first_ids[:, :1])
            real = next(i for i, (sid, q) in enumerate(self.row_positions(first_mb, first_rank,
                                                                             STEP_A))
                        if q < len(self.samples[sid][1].tokens))
            bad = first_ids.copy()
            bad[real, 0, 0] = E
            with self.assertRaisesRegex(errors.InvalidArgument, "expert id %d, outside" % E):
                up.upload(first_mb.index, bad)
            bad = first_ids.copy()
            bad[real, 0, 1] = bad[real, 0, 0]
            with self.assertRaisesRegex(errors.InvalidArgument, "repeats expert id"):
                up.upload(first_mb.index, bad)
            # Placed once; the same again is accepted as repeated.
            ack = up.upload(first_mb, first_ids)
            self.assertGreater(ack.rows, 0)
            self.assertEqual(ack.repeated_rows, 0)
            again = up.upload(first_mb, first_ids)
            self.assertEqual((again.rows, again.repeated_rows), (ack.rows, ack.rows))
            self.assertEqual(again.missing_entries, ack.missing_entries)
            # A conflicting copy is refused, naming the entry, and changes nothing.
            other = first_ids.copy()
            other[real, 0] = (other[real, 0] + 1) % E
            sid, q = self.row_positions(first_mb, first_rank, STEP_A)[real]
            with self.assertRaisesRegex(errors.FailedPrecondition,
                                        'sample "%s" token %d layer %d' % (sid, q,
                                                                           first_mb.replay_layers[0])):
                up.upload(first_mb, other)
            self.assertEqual(up.upload(first_mb, first_ids).repeated_rows, ack.rows)

        # Partial: the commit names the first gap and how many entries miss.
        with self.assertRaisesRegex(errors.FailedPrecondition, r"was not uploaded \(\d+"):
            self.controller.commit_routing("a")

        missing = None
        for rank, mb, ids in uploads[1:]:
            with RoutingUploader(self.d.address, "a", rank) as up:
                missing = up.upload(mb, ids).missing_entries
        self.assertEqual(missing, 0)
        done = self.controller.commit_routing("a")
        self.assertEqual(done.samples, 12)
        self.assertEqual(done.tokens, sum(len(s.tokens) for sid, (_, s) in self.samples.items()
                                          if sid.startswith("made_up-")))
        self.assertEqual(done.stored_bytes, done.tokens * len(MOE) * K)  # uint8 ids (E <= 256)
        self.controller.release("a")

        # Durable: a restart replays the commit from the log.
        self.restart_daemon()
        info = self.create("b", "made_up", STEP_B, replay_source="recompute")
        self.assertEqual(info.replay_source, 1)
        real_rows = 0
        for rank in self.ranks(STEP_B):
            for mb in self.fetch("b", rank):
                got, mask = wire(mb.replay_experts), wire(mb.replay_mask)
                want = self.made_up_upload(mb, rank, STEP_B)
                for row, (sid, q) in enumerate(self.row_positions(mb, rank, STEP_B)):
                    if q < len(self.samples[sid][1].tokens):
                        real_rows += 1
                        self.assertEqual(mask[row], 1, (rank, mb.index, sid, q))
                        # Kept as sets: each entry's ids ascending.
                        np.testing.assert_array_equal(got[row], np.sort(want[row], axis=-1),
                                                      err_msg=str((rank, mb.index, sid, q)))
                    else:
                        self.assertEqual(mask[row], 0, (rank, mb.index, sid, q))
        # Every pipeline stage receives every row (sequence parallel splits
        # rows over tp, which is 1 here).
        self.assertEqual(real_rows, done.tokens * STEP_B["pp"])
        self.controller.release("b")

        # A sample with no recompute routing: refused, and still free after.
        with self.assertRaisesRegex(errors.FailedPrecondition, '"made_up-bare" holds no'):
            self.controller.create_step("c", "made_up", topology=STEP_B,
                                        sample_ids=["made_up-bare"], replay_source="recompute")
        self.controller.create_step("c", "made_up", topology=STEP_B, sample_ids=["made_up-bare"])
        self.controller.release("c")

    def test_2_what_was_delivered_is_the_rollout_routing(self):
        self.create("d", "as_delivered", STEP_A, reuse_samples=True)
        for rank in self.ranks(STEP_A):
            with RoutingUploader(self.d.address, "d", rank) as up:
                for mb in self.fetch("d", rank):
                    up.upload(mb, wire(mb.replay_experts))
        self.controller.commit_routing("d")
        self.controller.release("d")
        self.create("e", "as_delivered", STEP_B, replay_source="recompute")
        compared = 0
        for rank in self.ranks(STEP_B):
            for mb in self.fetch("e", rank):
                got, mask = wire(mb.replay_experts), wire(mb.replay_mask)
                for row, (sid, q) in enumerate(self.row_positions(mb, rank, STEP_B)):
                    s = self.samples[sid][1]
                    if q < s.routed_experts.shape[0]:  # rows the rollout covered
                        self.assertEqual(mask[row], 1)
                        want = np.sort(s.routed_experts[q][mb.replay_layers], axis=-1)
                        np.testing.assert_array_equal(got[row], want,
                                                      err_msg=str((rank, mb.index, sid, q)))
                        compared += 1
                    elif q < len(s.tokens):  # the last token: filler of step "d", distinct
                        self.assertEqual(mask[row], 1)
                        self.assertEqual(len(set(got[row, 0].tolist())), K)
        self.assertEqual(compared, STEP_B["pp"] * sum(s.routed_experts.shape[0]
                                                      for sid, (_, s) in self.samples.items()
                                                      if sid.startswith("as_delivered-")))
        self.controller.release("e")

    def test_3_unknown_step_and_dense_refusals(self):
        with RoutingUploader(self.d.address, "no-such-step", (0, 0, 0, 0)) as up:
            with self.assertRaises(errors.NotFound):
                up.upload(0, np.zeros((1, 1, K), np.uint8))
        with self.assertRaises(errors.NotFound):
            self.controller.commit_routing("no-such-step")
        with self.assertRaisesRegex(errors.PayloadError, "< 0"):
            narrow_ids(np.array([[[-1, 2, 3, 4]]]))
        self.assertEqual(narrow_ids(np.array([[[1, 300]]])).dtype, np.uint16)
        self.assertEqual(narrow_ids(np.array([[[1, 255]]], np.int64)).dtype, np.uint8)


if __name__ == "__main__":
    unittest.main()
