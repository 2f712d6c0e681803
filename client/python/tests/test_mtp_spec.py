"""ModelSpec's MTP fields (layout.md section 10): rules, proto/dict/JSON round
trips, how Sample checks and narrows payloads that carry MTP routing, and a
round trip through a running rollpackd (skipped by hand without one)."""

import json
import unittest

import numpy as np

from rollpack import FailedPrecondition, ModelSpec, PayloadError, Producer, Sample
from rollpack import ndarray as nd
from rollpack._proto import (rollouts_pb2, scheduler_pb2, scheduler_pb2_grpc, trainer_pb2,
                             trainer_pb2_grpc)
from tests.server_case import ServerTest

# N = 6, M = {1, 3, 5}, D = 2 (MTP layers 6, 7), E = 16, K = 2.
MTP = ModelSpec("mtp", num_layers=6, moe_layers=[1, 3, 5], num_experts=16, topk=2,
                num_mtp_layers=2, mtp_routing=True)
LIVE = ModelSpec("mtp", num_layers=6, moe_layers=[1, 3, 5], num_experts=16, topk=2,
                 num_mtp_layers=2)


def full_payload(rows, layers=8, junk=99):
    """int32 [rows, layers, 2]: distinct ids per (row, layer); dense layers
    0, 2, 4 hold junk (out of range, as engines leave them)."""
    r = np.arange(rows, dtype=np.int32)[:, None, None]
    l = np.arange(layers, dtype=np.int32)[None, :, None]
    j = np.arange(2, dtype=np.int32)[None, None, :]
    arr = (r * 3 + l * 5 + j * 7) % 16
    arr[:, [x for x in (0, 2, 4) if x < layers], :] = junk
    return arr.astype(np.int32)


class SpecRules(unittest.TestCase):
    def test_rules_match_the_server(self):
        for kw, words in (
                (dict(num_mtp_layers=-1), "num_mtp_layers is -1, must be in [0, 64]"),
                (dict(num_mtp_layers=65), "num_mtp_layers is 65"),
                (dict(mtp_routing=True), "mtp_routing is set but num_mtp_layers is 0"),
                (dict(num_experts=0, topk=0, num_mtp_layers=1, mtp_routing=True),
                 "mtp_routing is set but num_experts is 0"),
                (dict(num_layers=2**31 - 1, num_mtp_layers=1),
                 "num_layers is 2147483647, must be in [1, 4096]")):
            args = dict(num_layers=6, num_experts=16, topk=2)
            args.update(kw)
            with self.assertRaises(ValueError) as cm:
                ModelSpec("m", **args)
            self.assertIn(words, str(cm.exception))
            self.assertIn('model "m"', str(cm.exception))
        ModelSpec("dense", num_layers=4, num_mtp_layers=1)  # MTP layers, no routing: valid

    def test_derived_layers(self):
        self.assertEqual(MTP.payload_layers, (8, 5))
        self.assertEqual(MTP.stored_layer_ids, (1, 3, 5, 6, 7))
        self.assertEqual(MTP.mtp_layer_ids, (6, 7))
        self.assertEqual(MTP.routed_mtp_layers, 2)
        self.assertEqual(LIVE.payload_layers, (6, 3))
        self.assertEqual(LIVE.stored_layer_ids, (1, 3, 5))
        self.assertEqual(LIVE.routed_mtp_layers, 0)
        self.assertEqual(ModelSpec("d", num_layers=3).payload_layers, ())


class SpecRoundTrip(unittest.TestCase):
    def test_proto_dict_and_json(self):
        for s in (MTP, LIVE):
            pb = s.to_proto()
            self.assertEqual((pb.num_mtp_layers, pb.mtp_routing),
                             (s.num_mtp_layers, s.mtp_routing))
            again = ModelSpec.from_proto(rollouts_pb2.ModelSpec.FromString(pb.SerializeToString()))
            self.assertEqual(again, s)
            self.assertEqual(ModelSpec.from_dict(s.to_dict()), s)
            self.assertEqual(ModelSpec.from_json(json.dumps(s.to_dict())), s)
        self.assertNotEqual(MTP, LIVE)
        self.assertNotEqual(hash(MTP), hash(LIVE))
        self.assertEqual(MTP.to_dict()["num_mtp_layers"], 2)
        self.assertIs(MTP.to_dict()["mtp_routing"], True)

    def test_without_mtp_nothing_changes(self):
        plain = ModelSpec("m", num_layers=6, moe_layers=[1, 3, 5], num_experts=16, topk=2)
        self.assertNotIn("num_mtp_layers", plain.to_dict())
        self.assertNotIn("mtp_routing", plain.to_dict())
        old = rollouts_pb2.ModelSpec(name="m", num_layers=6, moe_layers=[1, 3, 5],
                                     num_experts=16, topk=2)
        self.assertEqual(plain.to_proto().SerializeToString(), old.SerializeToString())
        self.assertEqual(ModelSpec.from_proto(old), plain)
        self.assertEqual((ModelSpec.from_proto(old).num_mtp_layers,
                          ModelSpec.from_proto(old).mtp_routing), (0, False))

    def test_json_for_the_cli(self):
        s = ModelSpec.from_json('{"name": "ds", "num_layers": 61, "moe_layers": %s, '
                                '"num_experts": 256, "topk": 8, "num_mtp_layers": 1, '
                                '"mtp_routing": true}' % list(range(3, 61)))
        self.assertEqual(s.payload_layers, (62, 59))
        self.assertEqual(s.stored_layer_ids[-2:], (60, 61))


class SampleWithMtp(unittest.TestCase):
    def test_full_payload_is_narrowed_to_moe_then_mtp_layers(self):
        n = 5
        truth = full_payload(n - 1)
        pb = Sample("a", np.arange(n, dtype=np.int32), truth).to_proto(MTP)
        r = nd.from_proto(pb.routed_experts)
        self.assertEqual(r.dtype, np.uint8)
        self.assertEqual(r.shape, (n - 1, 5, 2))
        np.testing.assert_array_equal(r, truth[:, [1, 3, 5, 6, 7], :])

    def test_compact_payload_is_sent_as_is(self):
        truth = full_payload(4)[:, [1, 3, 5, 6, 7], :].astype(np.uint8)
        r = nd.from_proto(Sample("a", np.arange(5), truth).to_proto(MTP).routed_experts)
        np.testing.assert_array_equal(r, truth)

    def test_ids_of_mtp_layers_are_checked(self):
        bad = full_payload(4)
        bad[2, 7, 1] = 16
        with self.assertRaises(PayloadError) as cm:
            Sample("a", np.arange(5), bad).to_proto(MTP)
        self.assertIn("expert id 16", str(cm.exception))

    def test_layer_counts(self):
        with self.assertRaises(PayloadError) as cm:
            Sample("a", np.arange(5), full_payload(4, layers=6)).check(MTP)
        self.assertIn("has 6 layers", str(cm.exception))
        self.assertIn("num_layers + num_mtp_layers = 8", str(cm.exception))
        with self.assertRaises(PayloadError) as cm:
            Sample("a", np.arange(5), full_payload(4)).check(LIVE)
        self.assertIn("has 8 layers", str(cm.exception))
        self.assertIn("mtp_routing=True", str(cm.exception))
        # Without mtp_routing the decoder-only payload is what is sent.
        r = nd.from_proto(Sample("a", np.arange(5), full_payload(4, layers=6)).to_proto(LIVE)
                          .routed_experts)
        self.assertEqual(r.shape, (4, 3, 2))

    def test_extend_keeps_mtp_layers(self):
        truth = full_payload(7)
        s = Sample("a", np.arange(5), truth[:4])
        s.extend(np.arange(8), truth[:, [1, 3, 5, 6, 7], :][4:], 4, spec=MTP)
        self.assertEqual(s.routed_experts.shape, (7, 5, 2))
        np.testing.assert_array_equal(s.routed_experts, truth[:, [1, 3, 5, 6, 7], :])


class ServerRoundTrip(ServerTest):
    """Producer -> rollpackd -> GetPool and Trainer.FetchMicrobatches."""

    def fetch(self, pool, step, pp):
        sched = scheduler_pb2_grpc.SchedulerStub(self.channel)
        info = sched.CreateStep(scheduler_pb2.CreateStepRequest(
            step_id=step, pool=pool, num_samples=1,
            topology=scheduler_pb2.Topology(pp=pp, max_tokens_per_rank=1 << 16)), timeout=30)
        trainer = trainer_pb2_grpc.TrainerStub(self.channel)
        mbs = [list(trainer.FetchMicrobatches(trainer_pb2.FetchRequest(
            step_id=step, rank=trainer_pb2.RankCoords(pp=p)), timeout=30)) for p in range(pp)]
        return info, mbs

    def test_mtp_spec_and_routing_round_trip(self):
        with Producer(self.d.address, "mtp", timeout=30) as p:
            self.assertTrue(p.register_model(MTP))
            self.assertFalse(p.register_model(MTP))
            with self.assertRaises(FailedPrecondition):
                p.register_model(LIVE)  # another model for the same pool
            n = 9
            truth = full_payload(n - 1)
            r = p.put(Sample("a", np.arange(n, dtype=np.int32), truth))
            self.assertEqual(r.accepted, 1)
        with Producer(self.d.address, "mtp", timeout=30) as fresh:
            self.assertEqual(fresh.model(), MTP)  # fetched with GetPool
        info, mbs = self.fetch("mtp", "s-mtp", 2)
        self.assertEqual([list(s.replay_layers) for s in info.stage_layers], [[1], [3, 5, 6, 7]])
        self.assertEqual([list(s.layers) for s in info.stage_layers], [[0, 1, 2], [3, 4, 5]])
        last = mbs[1][0]
        self.assertEqual(list(last.replay_layers), [3, 5, 6, 7])
        rep = nd.from_proto(last.replay_experts)
        self.assertEqual(rep.shape, (n, 4, 2))
        np.testing.assert_array_equal(rep[:n - 1], truth[:, [3, 5, 6, 7], :])
        np.testing.assert_array_equal(nd.from_proto(last.replay_mask), [1] * (n - 1) + [0])
        self.assertEqual(list(mbs[0][0].replay_layers), [1])

    def test_live_mtp_routers_get_nothing(self):
        with Producer(self.d.address, "live", timeout=30) as p:
            p.register_model(LIVE)
            with self.assertRaises(PayloadError):
                p.put(Sample("x", np.arange(5, dtype=np.int32), full_payload(4)))
            p.put(Sample("a", np.arange(5, dtype=np.int32), full_payload(4, layers=6)))
        info, mbs = self.fetch("live", "s-live", 1)
        self.assertEqual(list(mbs[0][0].replay_layers), [1, 3, 5])
        self.assertEqual(nd.from_proto(mbs[0][0].replay_experts).shape, (5, 3, 2))


if __name__ == "__main__":
    unittest.main()
