"""TrainerClient against a real rollpackd with token auth and TLS:

- --auth-tokens: the trainer token fetches every micro-batch of a rank; no,
  an unknown or a producer's token raise rollpack.Unauthenticated naming the
  problem (UNAUTHENTICATED / PERMISSION_DENIED); routing agreement reports
  need the token too;
- --tls-cert: root certificates as a path or PEM bytes, the server name
  override, mutual TLS with a client certificate; a plaintext client fails;
- the C ABI's stream entry point (ABI 3): rpt_stream_open without
  connection options sends no token; rpt_stream_options' struct_size: a
  struct longer than this library's (a newer header) is read up to what it
  knows, a shorter one is refused; the ABI 1 and 2 entry points are gone;
  rpt_stream_options.delivery: each value fetches, an unknown one is
  refused, a struct from before the field reads it as auto.

Certificates are made with openssl at test time.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

import grpc
import numpy as np

import rollpack
from rollpack import errors
from rollpack._proto import scheduler_pb2, scheduler_pb2_grpc
from tests.rollpackd import Rollpackd
from tests.test_trainer import _need_trainer, make_samples

PRODUCER = "producer-token-0123456789"
TRAINER = "trainer-token-0123456789"
ADMIN = "admin-token-0123456789abc"
NUM_LAYERS, MOE, E, K = 4, [1, 3], 32, 4
TOPO = dict(dp=1, cp=1, tp=1, pp=2)


def _write_tokens(directory):
    path = os.path.join(directory, "tokens")
    with open(path, "w") as f:
        f.write("producer %s\ntrainer %s\nadmin %s\n" % (PRODUCER, TRAINER, ADMIN))
    os.chmod(path, 0o600)
    return path


def make_certs(directory):
    """CA; a server certificate for DNS:rollpack-test only (so dialling
    127.0.0.1 needs the server name override); a client certificate."""
    if shutil.which("openssl") is None:
        raise AssertionError("openssl is not installed (tools/install_deps.sh installs it)")
    script = r"""
set -e
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=rollpack-test-ca \
  -keyout ca.key -out ca.crt 2>/dev/null
printf 'subjectAltName=DNS:rollpack-test\n' > server.ext
openssl req -newkey rsa:2048 -nodes -subj /CN=rollpack-test -keyout server.key \
  -out server.csr 2>/dev/null
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
  -extfile server.ext -out server.crt 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=trainer -keyout client.key -out client.csr \
  2>/dev/null
openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
  -out client.crt 2>/dev/null
"""
    subprocess.run(["bash", "-c", script], cwd=directory, check=True, capture_output=True)
    return {n: os.path.join(directory, n) for n in
            ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


def _fill(address, channel_creds=None, server_name=None):
    """Registers the model, puts samples and creates step "st" (as the
    producer and trainer roles); returns the number of micro-batches."""
    tls = {}
    if channel_creds is not None:
        tls = dict(root_certificates=channel_creds["root"], server_name=server_name,
                   client_certificate=channel_creds.get("cert"),
                   client_key=channel_creds.get("key"))
    spec = rollpack.ModelSpec("tiny", num_layers=NUM_LAYERS, moe_layers=MOE, num_experts=E,
                              topk=K)
    with rollpack.Producer(address, "pool", token=PRODUCER, **tls) as p:
        p.register_model(spec)
        p.put(make_samples(np.random.default_rng(3), 12, NUM_LAYERS, MOE, E, K, max_len=120))
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    if channel_creds is not None:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read(channel_creds["root"]),
            private_key=_read(channel_creds.get("key")),
            certificate_chain=_read(channel_creds.get("cert")))
        channel = grpc.secure_channel(address, creds, options)
    else:
        channel = grpc.insecure_channel(address)
    with channel:
        info = scheduler_pb2_grpc.SchedulerStub(channel).CreateStep(
            scheduler_pb2.CreateStepRequest(
                step_id="st", pool="pool", num_samples=12,
                topology=scheduler_pb2.Topology(max_tokens_per_rank=256, **TOPO)),
            metadata=(("authorization", "Bearer " + TRAINER),), timeout=30)
    return info.num_microbatches


def _read(x):
    if x is None or isinstance(x, bytes):
        return x
    with open(x, "rb") as f:
        return f.read()


def _agreement(trainer, mb):
    """Live ids = the replayed ones: full agreement, counts of every real row."""
    return trainer.routing_agreement(mb.replay_indices, mb.replay_indices, mask=mb.replay_mask)


class TokenAuth(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.trainer = _need_trainer()
        cls.tmp = tempfile.TemporaryDirectory(prefix="rollpack-auth-")
        cls.addClassCleanup(cls.tmp.cleanup)
        cls.d = Rollpackd("--auth-tokens", _write_tokens(cls.tmp.name))
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        cls.num_mb = _fill(cls.d.address)

    def client(self, **kw):
        return self.trainer.TrainerClient(self.d.address, "st", (0, 0, 0, 0), "cpu", **kw)

    def test_trainer_token_fetches(self):
        got = list(self.client(token=TRAINER))
        self.assertEqual(len(got), self.num_mb)
        self.assertEqual([mb.index for mb in got], list(range(self.num_mb)))
        self.assertGreater(sum(int(mb.replay_mask.sum()) for mb in got), 0)

    def test_missing_token(self):
        with self.assertRaises(errors.Unauthenticated) as cm:
            list(self.client())
        e = cm.exception
        self.assertEqual(e.code, grpc.StatusCode.UNAUTHENTICATED)
        self.assertIn("missing `authorization: Bearer <token>` metadata", str(e))

    def test_wrong_token(self):
        with self.assertRaises(rollpack.Unauthenticated) as cm:
            list(self.client(token="not-the-trainer-token-at-all"))
        self.assertEqual(cm.exception.code, grpc.StatusCode.UNAUTHENTICATED)
        self.assertIn("unknown token", str(cm.exception))
        self.assertIn("fetch st rank (0, 0, 0, 0)", str(cm.exception))

    def test_producer_role_may_not_fetch(self):
        with self.assertRaises(errors.Unauthenticated) as cm:
            list(self.client(token=PRODUCER))
        self.assertEqual(cm.exception.code, grpc.StatusCode.PERMISSION_DENIED)
        # delivery="auto" asks for direct pulls first (Trainer.FetchPieces).
        self.assertIn("role producer may not call /rollpack.v1.Trainer/FetchPieces",
                      str(cm.exception))
        with self.assertRaises(errors.Unauthenticated) as cm:
            list(self.client(token=PRODUCER, delivery="proxy"))
        self.assertEqual(cm.exception.code, grpc.StatusCode.PERMISSION_DENIED)
        self.assertIn("role producer may not call /rollpack.v1.Trainer/FetchMicrobatches",
                      str(cm.exception))

    def test_report_needs_the_token(self):
        c = self.client(token=TRAINER)
        self.addCleanup(c.close)
        mb = next(c)
        ack = c.report_routing_agreement(_agreement(self.trainer, mb))
        self.assertEqual(ack.rows_disagreeing, 0)
        self.assertGreater(ack.rows_compared, 0)
        agr = _agreement(self.trainer, mb)
        with self.assertRaises(errors.Unauthenticated) as cm:
            self.trainer.report_routing_agreement(self.d.address, "st", (0, 0, 0, 0), agr, mb)
        self.assertIn("missing `authorization", str(cm.exception))
        with self.assertRaises(errors.Unauthenticated) as cm:
            self.trainer.report_routing_agreement(self.d.address, "st", (0, 0, 0, 0), agr, mb,
                                                  token=PRODUCER)
        self.assertIn("role producer may not call /rollpack.v1.Telemetry/ReportRoutingAgreement",
                      str(cm.exception))
        ack2 = self.trainer.report_routing_agreement(self.d.address, "st", (0, 0, 0, 0), agr, mb,
                                                     token=TRAINER)
        self.assertGreaterEqual(ack2.reports, 2)

    def test_open_without_connect_sends_no_token(self):
        from rollpack import _capi
        import ctypes
        out = ctypes.c_void_p()
        lib = _capi._lib()
        opts = _capi.stream_options(0, 0, 0, 0, -1)
        self.assertEqual(lib.rpt_stream_open(self.d.address.encode(), None, b"st",
                                             ctypes.byref(opts), ctypes.byref(out)), 0)
        try:
            batch = ctypes.c_void_p()
            rc = lib.rpt_next(out, None, ctypes.byref(batch))
            self.assertEqual(rc, grpc.StatusCode.UNAUTHENTICATED.value[0])
            self.assertIn(b"missing", lib.rpt_last_error())
        finally:
            lib.rpt_close(out)

    def test_mismatched_client_cert_options(self):
        with self.assertRaises(ValueError):
            self.client(token=TRAINER, client_certificate=b"x")


class Tls(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.trainer = _need_trainer()
        cls.tmp = tempfile.TemporaryDirectory(prefix="rollpack-tls-")
        cls.addClassCleanup(cls.tmp.cleanup)
        cls.certs = make_certs(cls.tmp.name)
        tokens = _write_tokens(cls.tmp.name)
        cls.d = Rollpackd("--auth-tokens", tokens, "--tls-cert", cls.certs["server.crt"],
                          "--tls-key", cls.certs["server.key"])
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        cls.num_mb = _fill(cls.d.address, {"root": cls.certs["ca.crt"]}, "rollpack-test")
        cls.mtls = Rollpackd("--auth-tokens", tokens, "--tls-cert", cls.certs["server.crt"],
                             "--tls-key", cls.certs["server.key"], "--tls-client-ca",
                             cls.certs["ca.crt"])
        cls.addClassCleanup(cls.mtls.cleanup)
        cls.mtls.start()
        cls.mtls_num_mb = _fill(cls.mtls.address, {"root": cls.certs["ca.crt"],
                                                   "cert": cls.certs["client.crt"],
                                                   "key": cls.certs["client.key"]},
                                "rollpack-test")

    def fetch(self, address, **kw):
        return list(self.trainer.TrainerClient(address, "st", (0, 0, 0, 1), "cpu",
                                               token=TRAINER, **kw))

    def test_root_certificates_path_and_bytes(self):
        got = self.fetch(self.d.address, root_certificates=self.certs["ca.crt"],
                         server_name="rollpack-test")
        self.assertEqual(len(got), self.num_mb)
        with open(self.certs["ca.crt"], "rb") as f:
            pem = f.read()
        got = self.fetch(self.d.address, root_certificates=pem, server_name="rollpack-test")
        self.assertEqual(len(got), self.num_mb)
        c = self.trainer.TrainerClient(self.d.address, "st", (0, 0, 0, 1), token=TRAINER,
                                       root_certificates=pem, server_name="rollpack-test")
        self.addCleanup(c.close)
        ack = c.report_routing_agreement(_agreement(self.trainer, next(c)))
        self.assertEqual(ack.reports, 1)

    # A handshake that fails reads as UNAVAILABLE, but no wait fixes it: the
    # stream ends at once, not after resume_timeout (60 s), naming the cause.
    def test_plaintext_client_fails_at_once(self):
        start = time.monotonic()
        with self.assertRaises(errors.Unavailable) as cm:
            self.fetch(self.d.address)
        self.assertLess(time.monotonic() - start, 5.0)
        self.assertIn("speaks TLS (rollpackd --tls-cert) and this client does not",
                      str(cm.exception))

    def test_name_mismatch_fails_at_once(self):
        # The certificate is for rollpack-test, not 127.0.0.1.
        start = time.monotonic()
        with self.assertRaises(errors.Unavailable) as cm:
            self.fetch(self.d.address, root_certificates=self.certs["ca.crt"])
        self.assertLess(time.monotonic() - start, 5.0)
        self.assertIn("does not name the host dialled", str(cm.exception))

    def test_refused_port_fails_after_connect_grace(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            address = "127.0.0.1:%d" % s.getsockname()[1]
        start = time.monotonic()
        with self.assertRaises(errors.Unavailable) as cm:
            self.fetch(address, connect_grace=1.0)
        self.assertLess(time.monotonic() - start, 5.0)
        self.assertIn("nothing accepts connections at %s" % address, str(cm.exception))

    def test_mutual_tls(self):
        got = self.fetch(self.mtls.address, root_certificates=self.certs["ca.crt"],
                         client_certificate=self.certs["client.crt"],
                         client_key=self.certs["client.key"], server_name="rollpack-test")
        self.assertEqual(len(got), self.mtls_num_mb)
        with self.assertRaises(errors.Unavailable):
            self.fetch(self.mtls.address, root_certificates=self.certs["ca.crt"],
                       server_name="rollpack-test", resume_timeout=0)


class StreamOpenAbi(unittest.TestCase):
    """rpt_stream_open and its options struct, called directly (plain server)."""

    @classmethod
    def setUpClass(cls):
        cls.trainer = _need_trainer()
        from rollpack import _capi
        cls.capi = _capi
        cls.lib = _capi._lib()
        cls.d = Rollpackd()
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        cls.num_mb = _fill(cls.d.address)

    def open(self, options, size=None):
        """rpt_stream_open with options' struct_size set to `size`; returns
        (rc, stream handle)."""
        import ctypes
        if size is not None:
            options.struct_size = size
        out = ctypes.c_void_p()
        rc = self.lib.rpt_stream_open(self.d.address.encode(), None, b"st",
                                      ctypes.byref(options), ctypes.byref(out))
        return rc, out

    def read_all(self, stream):
        import ctypes
        n = 0
        try:
            while True:
                batch = ctypes.c_void_p()
                self.assertEqual(self.lib.rpt_next(stream, None, ctypes.byref(batch)), 0,
                                 self.lib.rpt_last_error())
                if not batch.value:
                    return n
                self.assertEqual(self.lib.rpt_batch_int(batch, b"index"), n)
                self.lib.rpt_batch_free(batch)
                n += 1
        finally:
            self.lib.rpt_close(stream)

    def test_version_and_old_entry_points_gone(self):
        self.assertEqual(self.lib.rpt_abi_version(), 3)
        for name in ("rpt_open", "rpt_open2"):
            self.assertFalse(hasattr(self.lib, name), name)

    def test_fetches_every_microbatch(self):
        rc, stream = self.open(self.capi.stream_options(0, 0, 0, 0, -1))
        self.assertEqual(rc, 0, self.lib.rpt_last_error())
        self.assertEqual(self.read_all(stream), self.num_mb)

    def test_longer_struct_of_a_newer_header(self):
        import ctypes

        class Newer(ctypes.Structure):
            _fields_ = [("known", self.capi.StreamOptions), ("added_later", ctypes.c_int64)]

        o = Newer()
        o.known = self.capi.stream_options(0, 0, 0, 0, -1)
        o.added_later = 12345
        out = ctypes.c_void_p()
        o.known.struct_size = ctypes.sizeof(Newer)
        rc = self.lib.rpt_stream_open(self.d.address.encode(), None, b"st",
                                      ctypes.cast(ctypes.byref(o),
                                                  ctypes.POINTER(self.capi.StreamOptions)),
                                      ctypes.byref(out))
        self.assertEqual(rc, 0, self.lib.rpt_last_error())
        self.assertEqual(self.read_all(out), self.num_mb)

    def test_short_struct_refused(self):
        rc, stream = self.open(self.capi.stream_options(0, 0, 0, 0, -1), size=8)
        self.assertEqual(rc, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertFalse(stream.value)
        self.assertIn(b"rpt_stream_options.struct_size is 8", self.lib.rpt_last_error())

    def test_delivery_field(self):
        # Every value fetches every micro-batch (one rollpackd).
        for name, value in self.capi.DELIVERY.items():
            rc, stream = self.open(self.capi.stream_options(0, 0, 0, 0, -1, delivery=value))
            self.assertEqual(rc, 0, self.lib.rpt_last_error())
            self.assertEqual(self.read_all(stream), self.num_mb, name)
        rc, stream = self.open(self.capi.stream_options(0, 0, 0, 0, -1, delivery=7))
        self.assertEqual(rc, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertFalse(stream.value)
        self.assertIn(b"rpt_stream_options.delivery is 7", self.lib.rpt_last_error())
        # A struct of the header before `delivery` (it ends at max_resumes)
        # reads it as 0 = auto, whatever lies past it.
        o = self.capi.stream_options(0, 0, 0, 0, -1, delivery=7)
        rc, stream = self.open(o, size=self.capi.StreamOptions.delivery.offset)
        self.assertEqual(rc, 0, self.lib.rpt_last_error())
        self.assertEqual(self.read_all(stream), self.num_mb)

    def test_null_options_refused(self):
        import ctypes
        out = ctypes.c_void_p()
        rc = self.lib.rpt_stream_open(self.d.address.encode(), None, b"st", None,
                                      ctypes.byref(out))
        self.assertEqual(rc, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertIn(b"NULL", self.lib.rpt_last_error())


if __name__ == "__main__":
    unittest.main()
