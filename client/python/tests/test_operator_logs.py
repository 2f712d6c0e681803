"""What an operator reads in rollpackd's log (docs/operations.md, "Logs"),
from a real rollpackd run with --log-format json and token auth: a line per
control call naming the caller's role and the outcome, a created step's plan
stats, a trainer stream's end with what it carried, refusals at warning level
with the client's message (rate-limited under a flood), and shutdown progress."""

import json
import os
import tempfile
import unittest

import grpc

from rollpack import errors
from rollpack._proto import trainer_pb2, trainer_pb2_grpc
from rollpack.controller import Controller
from rollpack.producer import Producer
from tests.rollpackd import Rollpackd
from tests.test_controller import S, TOPO, rollouts

PRODUCER = "producer-token-0123456789"
TRAINER = "trainer-token-0123456789"
ADMIN = "admin-token-0123456789abc"


def _lines(text):
    out = []
    for raw in text.splitlines():
        if raw.strip():
            out.append(json.loads(raw))  # every line is one JSON object
    return out


class OperatorLogs(unittest.TestCase):
    def test_calls_streams_refusals_and_shutdown(self):
        tmp = tempfile.TemporaryDirectory(prefix="rollpack-logs-")
        self.addCleanup(tmp.cleanup)
        tokens = os.path.join(tmp.name, "tokens")
        with open(tokens, "w") as f:
            f.write("producer %s\ntrainer %s\nadmin %s\n" % (PRODUCER, TRAINER, ADMIN))
        os.chmod(tokens, 0o600)
        d = Rollpackd("--log-format", "json", "--auth-tokens", tokens)
        d.start()
        self.addCleanup(d.cleanup)
        p = Producer(d.address, "logs", token=PRODUCER, timeout=30)
        self.addCleanup(p.close)
        p.register_model(S)
        p.put(rollouts("logs", 4))
        # A refused put: a sample whose id is empty.
        bad = rollouts("logs-bad", 1)[0]
        bad.sample_id = ""
        with self.assertRaises(errors.InvalidArgument):
            p.put([bad])
        # A flood of refusals: an unknown token, 40 times.
        channel = grpc.insecure_channel(d.address)
        self.addCleanup(channel.close)
        stub = trainer_pb2_grpc.TrainerStub(channel)
        for _ in range(40):
            with self.assertRaises(grpc.RpcError):
                list(stub.FetchMicrobatches(trainer_pb2.FetchRequest(step_id="x"),
                                            metadata=[("authorization", "Bearer nope-nope-nope")],
                                            timeout=10))
        c = Controller(d.address, token=ADMIN, timeout=30)
        self.addCleanup(c.close)
        c.create_step("logs-step", "logs", num_samples=4, topology=TOPO)
        fetched = list(stub.FetchMicrobatches(
            trainer_pb2.FetchRequest(step_id="logs-step",
                                     rank=trainer_pb2.RankCoords(dp=1)),
            metadata=[("authorization", "Bearer " + TRAINER)], timeout=30))
        self.assertGreater(len(fetched), 0)
        c.release("logs-step")
        self.assertEqual(d.stop(), 0)
        with open(d.log_path) as f:
            lines = _lines(f.read())
        msgs = [(l["level"], l["msg"]) for l in lines]
        text = "\n".join("%s %s" % m for m in msgs)

        def find(level, *parts):
            hits = [m for lv, m in msgs if lv == level and all(p in m for p in parts)]
            self.assertTrue(hits, "no %s line with %s in:\n%s" % (level, parts, text))
            return hits

        find("info", "Rollouts/RegisterModel from ipv4:127.0.0.1:", "(producer): OK")
        find("warning", "Rollouts/PutSamples", "(producer): INVALID_ARGUMENT", "sample_id")
        created = find("info", "Scheduler/CreateStep", "(admin): OK", 'step "logs-step" in pool "logs"')
        self.assertRegex(created[0], r"4 samples, dp2 cp1 tp1 pp1, \d+ micro-batches per rank, "
                                     r"imbalance [\d.]+, sync [\d.]+, padding [\d.]+%, \d+ tokens, "
                                     r"planned in [\d.]+ ms")
        streamed = find("info", "Trainer/FetchMicrobatches", "(trainer): OK",
                        'step "logs-step" rank dp1 cp0 tp0 pp0')
        self.assertIn("micro-batches [0, %d) of %d written" % (len(fetched), len(fetched)),
                      streamed[0])
        find("info", "Scheduler/ReleaseStep", "(admin): OK")
        # The flood: 5 lines in the window, not 40.
        flood = [m for lv, m in msgs if lv == "warning" and "(unknown token): UNAUTHENTICATED" in m]
        self.assertEqual(len(flood), 5, text)
        self.assertIn('"unknown token"', flood[0])
        # Successful puts are debug: not in an info log.
        self.assertFalse([m for m in msgs if "Rollouts/PutSamples" in m[1] and ": OK" in m[1]])
        find("info", "shutting down")
        find("info", "stopped in")

    def test_log_level_warning_keeps_only_refusals(self):
        with Rollpackd("--log-level", "warning") as d:
            p = Producer(d.address, "quiet", timeout=30)
            self.addCleanup(p.close)
            p.register_model(S)
            with self.assertRaises(errors.NotFound):
                Controller(d.address, timeout=30).step("missing")
        out = d.output()
        self.assertNotIn("RegisterModel", out)
        self.assertNotIn("listening", out)
        self.assertIn("[warning] Scheduler/ListSteps from ipv4:127.0.0.1:", out)
        self.assertIn('NOT_FOUND "step "missing"', out)

    def test_bad_level_is_refused(self):
        d = Rollpackd("--log-level", "loud")
        with self.assertRaises(AssertionError) as failed:
            d.start()
        d.cleanup()
        self.assertIn('log level "loud" is not one of', str(failed.exception))


if __name__ == "__main__":
    unittest.main()
