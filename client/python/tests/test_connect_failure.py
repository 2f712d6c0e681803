"""Mistakes refused loudly instead of accepted silently (issue 43), against a
real rollpackd.

Producer and Controller fail at once on what retrying cannot fix, naming the
cause: a TLS mismatch either way, a CA that did not sign the server's
certificate, an unknown token; an address nothing listens on or that does
not resolve after ``connect_grace``, not after ``retry_for`` (600 s). A
server started 2 s after the producer is still waited for; an address
reached before is a restart, retried as before. A topology size of 0 is
refused before it is sent (the CLI's ``--dp 0`` too), a negative one by the
server; rollpackd refuses a cluster member that would advertise a wildcard
address."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc

import rollpack
from rollpack import connect_failure, errors
from tests.rollpackd import Rollpackd, start_etcd

TOKEN = "producer-token-0123456789"
SPEC = rollpack.ModelSpec("cf-moe", num_layers=2, num_experts=8, topk=2)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_certificates(d):
    script = (
        "set -e; cd '%s'; "
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > leaf.ext; "
        "for ca in ca rogue; do openssl req -x509 -newkey rsa:2048 -nodes -days 1 "
        "  -subj /CN=$ca -keyout $ca.key -out $ca.crt 2>/dev/null; done; "
        "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key "
        "  -out server.csr 2>/dev/null; "
        "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 "
        "  -extfile leaf.ext -out server.crt 2>/dev/null" % d)
    subprocess.run(["bash", "-c", script], check=True)


class _Answer(Exception):
    """A failed call as grpc reports it: a code and details."""

    def __init__(self, code, details):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


class Classification(unittest.TestCase):
    def test_only_the_clients_own_connection_attempt_is_classified(self):
        unavailable = grpc.StatusCode.UNAVAILABLE
        own = ("failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:9: "
               "Failed to connect to remote host: Connection refused")
        self.assertEqual(connect_failure.classify(_Answer(unavailable, own)),
                         connect_failure.UNREACHABLE)
        self.assertEqual(connect_failure.classify(_Answer(
            unavailable, "DNS resolution failed for no-such-host.invalid:1: not found")),
            connect_failure.UNREACHABLE)
        # A member that answers because its etcd or a peer refused it was
        # reached: its answer is retried, never reported as this client's.
        self.assertEqual(connect_failure.classify(_Answer(
            unavailable, "etcd (http://127.0.0.1:2379): " + own)), connect_failure.RETRYABLE)
        self.assertEqual(connect_failure.classify(_Answer(
            unavailable, "member 10.0.0.2:50051: Ssl handshake failed: SSL_ERROR_SSL")),
            connect_failure.RETRYABLE)
        self.assertEqual(connect_failure.classify(_Answer(
            grpc.StatusCode.UNAUTHENTICATED, "unknown token")), connect_failure.PERMANENT)


class ConnectFailures(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="rollpack-connect-")
        cls.addClassCleanup(cls.tmp.cleanup)
        cls.dir = cls.tmp.name
        make_certificates(cls.dir)
        tokens = os.path.join(cls.dir, "tokens")
        with open(tokens, "w") as f:
            f.write("producer %s\nadmin %s-admin\n" % (TOKEN, TOKEN))
        os.chmod(tokens, 0o600)
        cls.plain = Rollpackd("--auth-tokens", tokens)
        cls.addClassCleanup(cls.plain.cleanup)
        cls.plain.start()
        cls.tls = Rollpackd("--tls-cert", cls.path("server.crt"),
                            "--tls-key", cls.path("server.key"))
        cls.addClassCleanup(cls.tls.cleanup)
        cls.tls.start()

    @classmethod
    def path(cls, name):
        return os.path.join(cls.dir, name)

    def register(self, address, **options):
        """(the exception register_model raised, seconds it took)."""
        start = time.monotonic()
        with rollpack.Producer(address, "p", **options) as p:
            try:
                p.register_model(SPEC)
            except errors.RollpackError as e:
                return e, time.monotonic() - start
        return None, time.monotonic() - start

    def test_refused_port_raises_after_the_grace_not_retry_for(self):
        address = "127.0.0.1:%d" % free_port()
        e, took = self.register(address, connect_grace=1.0)
        self.assertIsInstance(e, errors.Unavailable)
        self.assertIn("nothing accepts connections at %s (connection refused) for 1" % address,
                      str(e))
        self.assertIn("--listen", str(e))
        self.assertGreaterEqual(took, 1.0)
        self.assertLess(took, 5.0, "retry_for is 600 s")

    def test_unknown_host_raises_after_the_grace(self):
        e, took = self.register("no-such-host.invalid:50051", connect_grace=1.0)
        self.assertIsInstance(e, errors.Unavailable)
        self.assertIn("the host of no-such-host.invalid:50051 does not resolve", str(e))
        self.assertLess(took, 5.0)

    def test_tls_to_a_plaintext_server_raises_at_once(self):
        e, took = self.register(self.plain.address, root_certificates=self.path("ca.crt"))
        self.assertIsInstance(e, errors.Unavailable)
        self.assertIn("TLS handshake with %s failed" % self.plain.address, str(e))
        self.assertIn("does not speak TLS (rollpackd without --tls-cert)", str(e))
        self.assertIn("retrying cannot fix this", str(e))
        self.assertLess(took, 3.0, "connect_grace is 10 s")

    def test_plaintext_to_a_tls_server_raises_at_once(self):
        e, took = self.register(self.tls.address)
        self.assertIsInstance(e, errors.Unavailable)
        self.assertIn("%s speaks TLS (rollpackd --tls-cert) and this client does not"
                      % self.tls.address, str(e))
        self.assertLess(took, 5.0, "connect_grace is 10 s")

    def test_a_ca_that_did_not_sign_the_server_raises_at_once(self):
        e, took = self.register(self.tls.address, root_certificates=self.path("rogue.crt"))
        self.assertIn("certificate is not signed by the CA", str(e))
        self.assertIn("retrying cannot fix this", str(e))
        self.assertLess(took, 3.0)

    def test_an_unknown_token_raises_at_once(self):
        e, took = self.register(self.plain.address, token="not-a-token-of-the-server")
        self.assertIsInstance(e, errors.Unauthenticated)
        self.assertIn("rollpackd at %s refused the credentials" % self.plain.address, str(e))
        self.assertEqual(e.details, "unknown token")  # gRPC's text stays in details
        self.assertLess(took, 3.0)

    def test_controller_names_the_cause(self):
        with rollpack.Controller(self.tls.address) as c:
            with self.assertRaises(errors.Unavailable) as cm:
                c.pools()
        self.assertIn("speaks TLS (rollpackd --tls-cert) and this client does not",
                      str(cm.exception))
        with rollpack.Controller(self.plain.address, token="nope-nope-nope-nope") as c:
            with self.assertRaises(errors.Unauthenticated) as cm:
                c.pools()
        self.assertIn("refused the credentials", str(cm.exception))

    def test_a_server_started_two_seconds_later_is_waited_for(self):
        port = free_port()
        d = Rollpackd(start_timeout=30)
        d.args[d.args.index("127.0.0.1:0")] = "127.0.0.1:%d" % port
        self.addCleanup(d.cleanup)
        starter = threading.Timer(2.0, d.start)
        starter.start()
        self.addCleanup(starter.join)
        e, took = self.register("127.0.0.1:%d" % port)
        self.assertIsNone(e)
        self.assertGreaterEqual(took, 2.0)

    def test_an_address_reached_before_is_a_restart_retried_for_retry_for(self):
        address = "127.0.0.1:%d" % free_port()
        connect_failure.note_reached(address)
        e, took = self.register(address, connect_grace=0.5, retry_for=2.0)
        self.assertIsInstance(e, errors.Unavailable)
        self.assertGreaterEqual(took, 2.0)
        self.assertIn("attempts", str(e))


class StartupMistakes(unittest.TestCase):

    def test_a_topology_size_of_zero_is_refused_before_sending(self):
        from rollpack.controller import topology_message
        for field in ("dp", "cp", "tp", "pp"):
            with self.assertRaises(errors.PayloadError) as cm:
                topology_message({field: 0, "max_tokens_per_rank": 128})
            self.assertIn("topology: %s is 0, must be >= 1" % field, str(cm.exception))
        with self.assertRaises(errors.PayloadError):
            topology_message(dp=-2, max_tokens_per_rank=128)
        self.assertEqual(topology_message(max_tokens_per_rank=128).dp, 0)  # unset: 1 on the wire
        out = subprocess.run(
            [sys.executable, "-m", "rollpack", "step", "create", "s", "--pool", "p",
             "--num-samples", "1", "--dp", "0", "--max-tokens-per-rank", "128",
             "--server", "127.0.0.1:1"], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertIn("topology: dp is 0, must be >= 1", out.stderr)

    def test_the_server_refuses_a_negative_size_naming_it(self):
        from rollpack._proto import scheduler_pb2
        with Rollpackd() as d, rollpack.Controller(d.address) as c:
            with self.assertRaises(errors.InvalidArgument) as cm:
                c.create_step("s", "p", num_samples=1, topology=scheduler_pb2.Topology(
                    dp=-1, max_tokens_per_rank=128))
        self.assertIn("dp is -1", str(cm.exception))

    def test_a_member_that_would_advertise_a_wildcard_is_refused(self):
        from tests.rollpackd import binary
        for flags, named in ((["--listen", "0.0.0.0:0"], "--cluster-advertise"),
                             (["--listen", "127.0.0.1:0", "--cluster-advertise", "0.0.0.0:5"],
                              "--cluster-advertise \"0.0.0.0:5\" is a wildcard address")):
            out = subprocess.run([binary()] + flags + ["--cluster-etcd", "127.0.0.1:1"],
                                 capture_output=True, text=True, timeout=60)
            self.assertEqual(out.returncode, 2, out.stderr)
            self.assertIn(named, out.stderr)


    @unittest.skipUnless(os.access("/usr/bin/etcd", os.X_OK),
                         "Debian's etcd-server is not installed")
    def test_a_misnamed_cluster_is_warned_about_at_join(self):
        tmp = tempfile.mkdtemp(prefix="rollpack-misnamed-")
        self.addCleanup(shutil.rmtree, tmp, True)
        url = start_etcd(self, tmp)
        members = []
        for name in ("rollpack", "rollpack", "rolpack"):
            d = Rollpackd("--cluster-etcd", url, "--cluster-name", name,
                          "--cluster-lease-seconds", "2")
            self.addCleanup(d.cleanup)
            d.start()
            members.append(d)
        time.sleep(0.5)
        for d in members:
            d.stop()
        warning = 'cluster "rolpack" has no other member; etcd holds members of "rollpack" (2)'
        self.assertIn(warning, members[2].output())
        for d in members[:2]:  # the first member of a cluster, and the second
            self.assertNotIn("has no other member", d.output())


if __name__ == "__main__":
    unittest.main()
