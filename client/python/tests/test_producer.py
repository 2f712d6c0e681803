"""Producer / AsyncProducer client behaviour against an in-process fake
Rollouts server: batching, bounded streams, retries with backoff, deadlines,
token metadata, TLS, and exceptions carrying the server's message."""

import asyncio
import os
import socket
import subprocess
import tempfile
import time
import unittest

import grpc
import numpy as np

import rollpack
from rollpack import Producer, AsyncProducer, Sample
from rollpack._proto import rollouts_pb2
from tests import engines as eng
from tests.fake_server import Serve

S = eng.SMALL
FAST = dict(initial_backoff=0.01, max_backoff=0.05, timeout=10)


def samples(count, n=64, prefix="s", seed=0):
    toks = eng.tokens(n, seed)
    return [Sample("%s%d" % (prefix, i), toks, eng.routed(n - 1, S, seed=seed + i))
            for i in range(count)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sync(unittest.TestCase):
    def setUp(self):
        self.srv = Serve()
        self.fake = self.srv.servicer

    def tearDown(self):
        self.srv.stop()

    def producer(self, **kw):
        opts = dict(FAST)
        opts.update(kw)
        p = Producer(self.srv.address, "pool", **opts)
        self.addCleanup(p.close)
        return p

    def stored(self, sid):
        pb = rollouts_pb2.Sample()
        pb.ParseFromString(self.fake.samples[("pool", sid)])
        return pb

    def test_register_put_and_batching(self):
        p = self.producer(max_message_bytes=3000)
        self.assertTrue(p.register_model(S))
        self.assertFalse(p.register_model(S.to_dict()))
        batch = samples(10)
        r = p.put(iter(batch))
        self.assertEqual((r.accepted, r.duplicates, r.samples, r.streams), (10, 0, 10, 1))
        self.assertGreater(r.messages, 1)  # 3000-byte messages: several per stream
        self.assertEqual(self.fake.messages, r.messages)
        pb = self.stored("s3")
        self.assertEqual(rollpack.ndarray.from_proto(pb.routed_experts).dtype, np.uint8)
        np.testing.assert_array_equal(rollpack.ndarray.from_proto(pb.routed_experts),
                                      eng.compact(batch[3].routed_experts, S))
        self.assertEqual(p.put(batch[0]).duplicates, 1)  # identical re-send: a no-op

    def test_bounded_in_flight_opens_new_streams(self):
        p = self.producer(max_message_bytes=1000, max_unacked_bytes=2500)
        p.register_model(S)
        pulled = []

        def gen():
            for s in samples(12):
                pulled.append(s.sample_id)
                yield s
        r = p.put(gen())
        self.assertEqual(r.accepted, 12)
        self.assertGreaterEqual(r.streams, 4)
        self.assertEqual(self.fake.put_calls, r.streams)
        self.assertEqual(len(self.fake.samples), 12)

    def test_model_fetched_from_pool(self):
        self.producer().register_model(S)
        p = self.producer()
        self.assertEqual(p.model(), S)
        self.assertEqual(p.put(samples(2)).accepted, 2)
        with self.assertRaises(rollpack.NotFound) as cm:
            Producer(self.srv.address, "nope", **FAST).put(samples(1))
        self.assertIn('pool "nope" does not exist', str(cm.exception))

    def test_retries_resource_exhausted_and_unavailable(self):
        p = self.producer(max_message_bytes=1000)
        p.register_model(S)
        self.fake.faults = [(grpc.StatusCode.RESOURCE_EXHAUSTED, "over memory limit", 2),
                            (grpc.StatusCode.UNAVAILABLE, "draining", 1)]
        r = p.put(samples(6))
        self.assertEqual(r.retries, 2)
        self.assertEqual(self.fake.put_calls, 3)
        self.assertEqual(len(self.fake.samples), 6)
        # one sample per message: the 2 messages committed before the first
        # fault are re-sent by the successful attempt and count as duplicates
        self.assertEqual((r.accepted, r.duplicates), (6, 2))

    def test_retries_run_out(self):
        p = self.producer(max_attempts=3)
        p.register_model(S)
        self.fake.faults = [(grpc.StatusCode.RESOURCE_EXHAUSTED, "server over 1024 bytes", 0)] * 3
        with self.assertRaises(rollpack.ResourceExhausted) as cm:
            p.put(samples(1))
        self.assertIn("server over 1024 bytes", str(cm.exception))
        self.assertIn("after 3 attempts", str(cm.exception))
        self.assertEqual(cm.exception.code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertEqual(cm.exception.details, "server over 1024 bytes")

    def test_backpressure_is_bounded_by_time_not_attempts(self):
        # 20 refusals in a row: more than the 8 attempts producers used to give
        # up after; the default keeps retrying for minutes, warning meanwhile.
        p = self.producer(warn_every=0.05)
        p.register_model(S)
        self.fake.faults = [(grpc.StatusCode.RESOURCE_EXHAUSTED, "over memory limit", 0)] * 20
        with self.assertLogs("rollpack", level="WARNING") as logs:
            r = p.put(samples(1))
        self.assertEqual(r.retries, 20)
        self.assertIn("RESOURCE_EXHAUSTED for", logs.output[0])
        self.assertIn("still retrying (retry_for 600 s)", logs.output[0])
        # A time budget, not a count: it gives up once retry_for has passed.
        q = self.producer(retry_for=0.3)
        self.fake.faults = [(grpc.StatusCode.RESOURCE_EXHAUSTED, "over memory limit", 0)] * 1000
        start = time.monotonic()
        with self.assertRaises(rollpack.ResourceExhausted):
            q.put(samples(1, prefix="late"))
        self.assertLess(time.monotonic() - start, 5)
        self.assertGreaterEqual(time.monotonic() - start, 0.3)
        self.fake.faults = []

    def test_errors_carry_the_server_message_and_are_not_retried(self):
        p = self.producer(max_message_bytes=1000)
        p.register_model(S)
        with self.assertRaises(rollpack.InvalidArgument) as cm:
            p.put(samples(3) + samples(1, prefix="bad") + samples(2, prefix="t"))
        self.assertIn('sample "bad0": routed_experts[0, 1, 2] is 99', str(cm.exception))
        self.assertEqual(self.fake.put_calls, 1)
        self.assertIn(("pool", "s2"), self.fake.samples)  # earlier messages stay committed
        self.assertNotIn(("pool", "t0"), self.fake.samples)
        other = samples(1, seed=9)[0]
        with self.assertRaises(rollpack.AlreadyExists) as cm:
            p.put(Sample("s0", other.tokens, other.routed_experts))
        self.assertIn('sample "s0" exists', str(cm.exception))
        with self.assertRaises(rollpack.FailedPrecondition):
            p.register_model(eng.WIDE)

    def test_client_side_refusal_after_committing_what_precedes(self):
        for mmb in (16 << 20, 1000):  # all in one message / one sample per message
            self.fake.samples.clear()
            p = self.producer(max_message_bytes=mmb)
            p.register_model(S)
            good = samples(2)
            bad = Sample("x", good[0].tokens, good[0].routed_experts + 100)
            with self.assertRaises(rollpack.PayloadError) as cm:
                p.put(good + [bad] + samples(1, prefix="after"))
            self.assertIn("'x'", str(cm.exception))
            self.assertEqual(sorted(k[1] for k in self.fake.samples), ["s0", "s1"])

    def test_deadline(self):
        p = self.producer(timeout=0.2, max_attempts=5)
        self.fake.delay = 1.0
        with self.assertRaises(rollpack.DeadlineExceeded):
            p.register_model(S)
        self.assertEqual(len(self.fake.metadata), 1)  # not retried

    def test_token_metadata(self):
        self.producer(token="s3cr3t").register_model(S)
        self.assertEqual(self.fake.metadata[-1].get("authorization"), "Bearer s3cr3t")
        self.producer().model()
        self.assertNotIn("authorization", self.fake.metadata[-1])

    def test_oversized_message_is_not_retried(self):
        srv = Serve(options=[("grpc.max_receive_message_length", 4096)])
        self.addCleanup(srv.stop)
        srv.servicer.models["pool"] = S.to_proto()
        p = Producer(srv.address, "pool", max_attempts=5, **FAST)
        self.addCleanup(p.close)
        with self.assertRaises(rollpack.ResourceExhausted) as cm:
            p.put(samples(1, n=400))
        self.assertIn("max_message_bytes", str(cm.exception))
        self.assertEqual(srv.servicer.put_calls, 1)  # one attempt, no retry

    def test_messages_are_split_by_sample_count_too(self):
        p = self.producer(max_samples_per_message=3)
        p.register_model(S)
        r = p.put(samples(7))
        self.assertEqual((r.accepted, r.messages), (7, 3))  # 3 + 3 + 1, bytes far below 16 MiB
        self.assertEqual(self.fake.messages, 3)
        # 0 (as the server's flag reads it) or None: bytes alone decide.
        for unlimited in (0, None):
            self.fake.messages = 0
            unbounded = self.producer(max_samples_per_message=unlimited)
            r = unbounded.put(samples(7, prefix="u%s" % unlimited))
            self.assertEqual(r.messages, 1)
        with self.assertRaises(ValueError):
            self.producer(max_samples_per_message=-1)

    def test_a_message_over_the_servers_sample_count_is_not_retried(self):
        p = self.producer(max_attempts=5)
        p.register_model(S)
        self.fake.faults = [(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             "PutSamplesRequest has 9 samples; the server takes at most 4 per "
                             "message (--max-samples-per-message): send smaller messages", 0)]
        with self.assertRaises(rollpack.ResourceExhausted) as cm:
            p.put(samples(9))
        self.assertIn("lower max_samples_per_message, now 65536", str(cm.exception))
        self.assertEqual(self.fake.put_calls, 1)  # one attempt, no retry


class Unreachable(unittest.TestCase):
    def test_unavailable_after_backoff(self):
        p = Producer("127.0.0.1:%d" % free_port(), "pool", max_attempts=3, **FAST)
        self.addCleanup(p.close)
        with self.assertRaises(rollpack.Unavailable) as cm:
            p.register_model(S)
        self.assertIn("after 3 attempts", str(cm.exception))


class Tls(unittest.TestCase):
    def test_tls_with_root_certificate(self):
        d = tempfile.mkdtemp()
        key, crt = os.path.join(d, "k.pem"), os.path.join(d, "c.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                        "-out", crt, "-days", "1", "-subj", "/CN=rollpack-test",
                        "-addext", "subjectAltName=DNS:rollpack-test,IP:127.0.0.1"],
                       check=True, capture_output=True)
        with open(key, "rb") as k, open(crt, "rb") as c:
            creds = grpc.ssl_server_credentials([(k.read(), c.read())])
        srv = Serve(creds=creds)
        self.addCleanup(srv.stop)
        with Producer(srv.address, "pool", root_certificates=crt, server_name="rollpack-test",
                      token="t", **FAST) as p:
            self.assertTrue(p.register_model(S))
            self.assertEqual(p.put(samples(2)).accepted, 2)
        with Producer(srv.address, "pool", max_attempts=1, **FAST) as plain:
            with self.assertRaises(rollpack.RollpackError):
                plain.model(timeout=2)


class Async(unittest.TestCase):
    def setUp(self):
        self.srv = Serve()
        self.fake = self.srv.servicer

    def tearDown(self):
        self.srv.stop()

    def test_async_put_with_async_source_and_retry(self):
        async def main():
            async with AsyncProducer(self.srv.address, "pool", max_message_bytes=1000,
                                     max_unacked_bytes=3000, token="a", **FAST) as p:
                self.assertTrue(await p.register_model(S))

                async def gen():
                    for s in samples(8):
                        await asyncio.sleep(0)
                        yield s
                self.fake.faults = [(grpc.StatusCode.UNAVAILABLE, "restarting", 1)]
                r = await p.put(gen())
                self.assertEqual(r.retries, 1)
                self.assertEqual(len(self.fake.samples), 8)
                self.assertGreater(r.streams, 1)
                r2 = await p.put(samples(2, prefix="sync"))
                self.assertEqual(r2.accepted, 2)
                with self.assertRaises(rollpack.InvalidArgument) as cm:
                    await p.put(samples(1, prefix="bad"))
                self.assertIn('sample "bad0"', str(cm.exception))
        asyncio.run(main())
        self.assertEqual(self.fake.metadata[-1].get("authorization"), "Bearer a")


if __name__ == "__main__":
    unittest.main()


class FiniteTokenFields(unittest.TestCase):
    def test_round_trip_and_refusals(self):
        spec = rollpack.ModelSpec("m", 4, (), 8, 2, finite_token_fields=["logprobs"])
        pb = spec.to_proto()
        self.assertEqual(list(pb.finite_token_fields), ["logprobs"])
        self.assertEqual(rollpack.ModelSpec.from_proto(pb), spec)
        self.assertEqual(rollpack.ModelSpec.from_dict(spec.to_dict()), spec)
        self.assertNotEqual(rollpack.ModelSpec("m", 4, (), 8, 2), spec)
        with self.assertRaisesRegex(ValueError, 'names "a" twice'):
            rollpack.ModelSpec("m", 4, (), 8, 2, finite_token_fields=["a", "a"])
        with self.assertRaisesRegex(ValueError, "a list of field names"):
            rollpack.ModelSpec("m", 4, (), 8, 2, finite_token_fields="logprobs")
