"""Starts a rollpackd to attack and measures what it holds.

Used by rollpack_abuse.py (the program) and test_abuse.py (its bounds under
CTest). Everything runs on 127.0.0.1 with ephemeral ports (host_probes:
on an address of namespaces it makes); every process started here is
stopped here.
"""

import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

import grpc

PRODUCER_TOKEN = "abuse-producer-token-0123456789"
TRAINER_TOKEN = "abuse-trainer-token-0123456789"
ADMIN_TOKEN = "abuse-admin-token-0123456789"


def make_certs(directory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate
    from the CA, made with openssl in `directory`: {name: path}."""
    script = (
        "set -e; cd '%s'; "
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=abuse-ca "
        "  -keyout ca.key -out ca.crt 2>/dev/null; "
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext; "
        "openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key "
        "  -out server.csr 2>/dev/null; "
        "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 "
        "  -extfile server.ext -out server.crt 2>/dev/null; "
        "openssl req -newkey rsa:2048 -nodes -subj /CN=client -keyout client.key "
        "  -out client.csr 2>/dev/null; "
        "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 "
        "  -out client.crt 2>/dev/null" % directory)
    subprocess.run(["bash", "-c", script], check=True)
    return {n: os.path.join(directory, n) for n in
            ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Server:
    """``with Server(binary, args) as s``: a rollpackd on 127.0.0.1:0
    (``host``: another local address, e.g. one host_probes.TwoHosts made).

    ``s.address``, ``s.pid``; ``s.rss()`` now; ``s.peak`` the highest RSS
    sampled (every 20 ms) since start or ``reset_peak()``. ``auth=True``
    writes a token file (producer/trainer/admin tokens above).
    ``metrics=True`` serves /metrics on 127.0.0.1:0: ``s.metrics()``."""

    def __init__(self, binary, args=(), auth=False, mutual_tls=False, start_timeout=30.0,
                 host="127.0.0.1", metrics=False, tls=False):
        self.binary = binary
        self.host = host
        self.dir = tempfile.TemporaryDirectory(prefix="rollpack-abuse-")
        self.port_file = os.path.join(self.dir.name, "port")
        self.metrics_port_file = os.path.join(self.dir.name, "metrics-port")
        self.log_path = os.path.join(self.dir.name, "rollpackd.log")
        self.args = [binary, "--listen", "%s:0" % host, "--port-file", self.port_file,
                     "--log-level", "warning"] + list(args)
        if metrics:
            self.args += ["--metrics-listen", "127.0.0.1:0",
                          "--metrics-port-file", self.metrics_port_file]
        if auth:
            tokens = os.path.join(self.dir.name, "tokens")
            with open(tokens, "w") as f:
                f.write("producer %s\ntrainer %s\nadmin %s\n"
                        % (PRODUCER_TOKEN, TRAINER_TOKEN, ADMIN_TOKEN))
            os.chmod(tokens, 0o600)
            self.args += ["--auth-tokens", tokens]
        # With mutual_tls: clients need a certificate from this CA
        # (self.certs: paths, see make_certs).
        # With tls: TLS without client certificates (clients trust the CA).
        self.certs = make_certs(self.dir.name) if mutual_tls or tls else None
        if self.certs:
            self.args += ["--tls-cert", self.certs["server.crt"], "--tls-key",
                          self.certs["server.key"]]
        if mutual_tls:
            self.args += ["--tls-client-ca", self.certs["ca.crt"]]
        self.start_timeout = start_timeout
        self.proc = None
        self.address = None
        self.peak = 0
        self._stop_sampling = threading.Event()
        self._sampler = None

    def __enter__(self):
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("rollpackd exited with %d before serving:\n%s"
                                   % (self.proc.returncode, self.output()))
            try:
                with open(self.port_file) as f:
                    text = f.read().strip()
                if text:
                    self.address = "%s:%d" % (self.host, int(text))
                    break
            except FileNotFoundError:
                pass
            time.sleep(0.02)
        else:
            self.kill()
            raise RuntimeError("rollpackd did not serve within %.0f s" % self.start_timeout)
        self.pid = self.proc.pid
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def __exit__(self, *exc):
        self.kill()
        self.dir.cleanup()
        return False

    def _sample(self):
        while not self._stop_sampling.is_set():
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (FileNotFoundError, ProcessLookupError, ValueError):
                return
            time.sleep(0.02)

    def rss(self):
        return rss_bytes(self.pid)

    def metrics(self, timeout=5.0):
        """GET /metrics (``metrics=True``): {name: value}, a name's labelled
        series summed."""
        with open(self.metrics_port_file) as f:
            port = int(f.read().strip())
        # No proxy, whatever the environment says: the endpoint is on loopback.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open("http://127.0.0.1:%d/metrics" % port, timeout=timeout) as response:
            text = response.read().decode()
        values = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            name = series.split("{", 1)[0]
            try:
                values[name] = values.get(name, 0.0) + float(value)
            except ValueError:
                continue
        return values

    def reset_peak(self):
        self.peak = self.rss()

    def alive(self):
        return self.proc.poll() is None

    def output(self):
        self._log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def terminate_seconds(self, limit=60.0):
        """SIGTERM; seconds until the process exited, None if it did not
        within `limit` (it is then SIGKILLed)."""
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=limit)
            return time.monotonic() - start
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self):
        self._stop_sampling.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if getattr(self, "_log", None) is not None and not self._log.closed:
            self._log.close()


class NormalClient:
    """A well-behaved client calling GetPool (NOT_FOUND is an answer) every
    `interval` s on its own connection while the abuse runs: how many calls
    failed or took longer than `slow` s, and the slowest."""

    def __init__(self, address, token=None, interval=0.1, slow=1.0, deadline=5.0, certs=None):
        self.address, self.token, self.certs = address, token, certs
        self.interval, self.slow, self.deadline = interval, slow, deadline
        self.calls = self.failed = self.slow_calls = 0
        self.worst = 0.0
        self.first_error = None
        self._stop = threading.Event()
        self._thread = None

    def call_once(self):
        """One call on a fresh channel: (ok, seconds, error)."""
        if self.certs:
            def read(name):
                with open(self.certs[name], "rb") as f:
                    return f.read()
            credentials = grpc.ssl_channel_credentials(
                read("ca.crt"), read("client.key"), read("client.crt"))
            channel = grpc.secure_channel(self.address, credentials)
        else:
            channel = grpc.insecure_channel(self.address)
        try:
            stub = channel.unary_unary("/rollpack.v1.Rollouts/GetPool")
            md = [("authorization", "Bearer " + self.token)] if self.token else None
            # GetPoolRequest{pool: "normal-client"}: field 1, length 13.
            request = b"\x0a\x0dnormal-client"
            start = time.monotonic()
            try:
                stub(request, metadata=md, timeout=self.deadline)
                return True, time.monotonic() - start, None
            except grpc.RpcError as e:
                took = time.monotonic() - start
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return True, took, None
                return False, took, "%s: %s" % (e.code().name, e.details())
        finally:
            channel.close()

    def _run(self):
        while not self._stop.is_set():
            ok, took, error = self.call_once()
            self.calls += 1
            self.worst = max(self.worst, took)
            if not ok:
                self.failed += 1
                self.first_error = self.first_error or error
            elif took > self.slow:
                self.slow_calls += 1
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False

    def summary(self):
        return {"calls": self.calls, "failed": self.failed, "slow": self.slow_calls,
                "worst_s": round(self.worst, 3), "first_error": self.first_error}
