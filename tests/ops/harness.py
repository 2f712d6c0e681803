"""Processes for the operations tests: a real rollpackd (127.0.0.1, ephemeral
gRPC and metrics ports via --port-file / --metrics-port-file), a real
Prometheus, and helpers. Every process started here is stopped by the
context manager's exit, on failure too.

Binaries come from the environment CTest sets (ROLLPACKD, ROLLPACK_CLI); a
missing binary or tool is a failure, never a skip.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def require_env_binary(var):
    path = os.environ.get(var)
    if not path or not os.access(path, os.X_OK):
        raise AssertionError("$%s=%r is not an executable (run through CTest after a build)"
                             % (var, path))
    return path


def require_tool(name):
    path = shutil.which(name)
    if path is None:
        raise AssertionError("%s not on PATH: run tools/install_deps.sh" % name)
    return path


def free_port():
    """A port free right now on 127.0.0.1 (for tools that cannot report the
    port they bound, like Prometheus)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_file(path, proc, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError("%s exited with %d before writing %s" % (what, proc.returncode, path))
        try:
            with open(path) as f:
                text = f.read().strip()
            if text:
                return text
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    raise AssertionError("%s wrote nothing to %s within %.0fs" % (what, path, timeout))


class Process:
    """A child process whose output goes to a log file; stop() SIGTERMs and
    waits (SIGKILL after a grace period)."""

    def __init__(self, args, log_path, env=None):
        self.args = args
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def output(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-6000:]
        except OSError:
            return ""

    def stop(self, grace=15):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


class Rollpackd:
    """``with Rollpackd(tmpdir, "--auth-tokens", f) as d: d.address, d.metrics_port``"""

    def __init__(self, workdir, *extra_args):
        self.workdir = workdir
        self.extra_args = list(extra_args)
        self.exe = require_env_binary("ROLLPACKD")

    def __enter__(self):
        port_file = os.path.join(self.workdir, "grpc.port")
        metrics_file = os.path.join(self.workdir, "metrics.port")
        for f in (port_file, metrics_file):
            if os.path.exists(f):
                os.remove(f)
        args = [self.exe, "--listen", "127.0.0.1:0", "--port-file", port_file,
                "--metrics-listen", "127.0.0.1:0", "--metrics-port-file", metrics_file,
                "--max-memory", "2000000000"] + self.extra_args
        self.process = Process(args, os.path.join(self.workdir, "rollpackd.log"))
        try:
            self.port = int(wait_for_file(port_file, self.process.proc, 30, "rollpackd"))
            self.metrics_port = int(wait_for_file(metrics_file, self.process.proc, 30, "rollpackd"))
        except BaseException:
            self.process.stop()
            raise AssertionError("rollpackd did not start:\n" + self.process.output())
        self.address = "127.0.0.1:%d" % self.port
        return self

    def scrape(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.metrics_port,
                                    timeout=10) as r:
            return r.read().decode()

    def __exit__(self, *exc):
        rc = self.process.stop()
        if exc[0] is None and rc != 0:
            raise AssertionError("rollpackd exited with %d:\n%s" % (rc, self.process.output()))


class Etcd:
    """One etcd member (Debian's etcd-server) on free loopback ports, its data
    in `workdir`: ``with Etcd(d) as e: Rollpackd(d2, "--cluster-etcd", e.url)``."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.exe = "/usr/bin/etcd"
        if not os.access(self.exe, os.X_OK):
            raise AssertionError("no /usr/bin/etcd: run tools/install_deps.sh")

    def __enter__(self):
        last = ""
        for attempt in range(3):  # a free port may be taken between probe and bind
            client, peer = free_port(), free_port()
            self.url = "http://127.0.0.1:%d" % client
            self.process = Process(
                [self.exe, "--name=ops", "--data-dir=" + os.path.join(self.workdir, "etcd%d" % attempt),
                 "--listen-client-urls=" + self.url, "--advertise-client-urls=" + self.url,
                 "--listen-peer-urls=http://127.0.0.1:%d" % peer,
                 "--initial-advertise-peer-urls=http://127.0.0.1:%d" % peer,
                 "--initial-cluster=ops=http://127.0.0.1:%d" % peer,
                 "--log-level=error", "--logger=zap"],
                os.path.join(self.workdir, "etcd.log"))
            if self._wait_healthy(30):
                return self
            last = self.process.output()
            self.process.stop()
        raise AssertionError("etcd did not start:\n" + last)

    def _wait_healthy(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if json.loads(r.read().decode()).get("health") == "true":
                        return True
            except (urllib.error.URLError, ConnectionError, OSError, ValueError):
                pass
            time.sleep(0.1)
        return False

    def __exit__(self, *exc):
        self.process.stop()


def parse_exposition(text):
    """{'name{labels}': value} of an exposition's samples."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, value = line.rsplit(" ", 1)
        out[key] = float(value)
    return out


class Prometheus:
    """A real Prometheus scraping `targets` every second, on a loopback port,
    with its TSDB in `workdir`."""

    def __init__(self, workdir, targets, rule_files=()):
        self.workdir = workdir
        self.targets = targets
        self.rule_files = list(rule_files)
        self.exe = require_tool("prometheus")

    def __enter__(self):
        config = os.path.join(self.workdir, "prometheus.yml")
        rules = "".join("  - %s\n" % json.dumps(f) for f in self.rule_files)
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                    + ("rule_files:\n" + rules if rules else "")
                    + "scrape_configs:\n  - job_name: rollpackd\n    static_configs:\n"
                    "      - targets: [%s]\n" % ", ".join('"%s"' % t for t in self.targets))
        last = ""
        for _ in range(3):  # the free port may be taken between probe and bind
            self.port = free_port()
            self.process = Process(
                [self.exe, "--config.file=" + config,
                 "--storage.tsdb.path=" + os.path.join(self.workdir, "tsdb"),
                 "--web.listen-address=127.0.0.1:%d" % self.port,
                 "--web.console.templates=/dev/null", "--web.console.libraries=/dev/null"],
                os.path.join(self.workdir, "prometheus.log"))
            if self._wait_ready(60):
                return self
            last = self.process.output()
            self.process.stop()
        raise AssertionError("prometheus did not become ready:\n" + last)

    def _wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/-/ready" % self.port,
                                            timeout=2) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        return False

    def api(self, path, **params):
        url = "http://127.0.0.1:%d/api/v1/%s?%s" % (self.port, path, urllib.parse.urlencode(params))
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read().decode())
        if body.get("status") != "success":
            raise AssertionError("prometheus %s: %s" % (path, body))
        return body["data"]

    def query(self, expr):
        """Instant vector result as {frozenset(labels.items()): value}."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return {frozenset(): float(data["result"][1])}
        return {frozenset(r["metric"].items()): float(r["value"][1]) for r in data["result"]}

    def query_one(self, expr):
        result = self.query(expr)
        if len(result) != 1:
            raise AssertionError("%s: want one series, got %r" % (expr, result))
        return next(iter(result.values()))

    def wait_for(self, expr, want, timeout=60):
        """Polls until `expr` is one series equal to `want` (after scrapes
        of the workload); returns the value or fails with the last seen."""
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            result = self.query(expr)
            if len(result) == 1:
                seen = next(iter(result.values()))
                if seen == want:
                    return seen
            else:
                seen = result
            time.sleep(0.5)
        raise AssertionError("%s: want %r, last seen %r" % (expr, want, seen))

    def __exit__(self, *exc):
        self.process.stop()


def tempdir():
    return tempfile.TemporaryDirectory(prefix="rollpack-ops-")


def make_certs(workdir):
    """CA, a server certificate for 127.0.0.1/localhost signed by it, and a
    client certificate signed by it, made with openssl. Returns the paths."""
    openssl = require_tool("openssl")
    script = r"""
set -e
cd "$1"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=rollpack-test-ca \
  -keyout ca.key -out ca.crt 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > server.ext
openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr 2>/dev/null
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
  -extfile server.ext -out server.crt 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=client -keyout client.key -out client.csr 2>/dev/null
openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
  -out client.crt 2>/dev/null
"""
    subprocess.run(["bash", "-c", script, "make_certs", workdir], check=True, timeout=120,
                   env=dict(os.environ, PATH=os.path.dirname(openssl) + ":" + os.environ["PATH"]))
    return {n: os.path.join(workdir, n) for n in
            ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")}


def buf():
    """Path of buf, installed into .tools/npm by tools/install_buf.sh
    (idempotent; a failure to install fails the test)."""
    out = subprocess.run(["bash", os.path.join(REPO, "tools", "install_buf.sh")],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise AssertionError("tools/install_buf.sh failed:\n" + out.stdout + out.stderr)
    path = out.stdout.strip().splitlines()[-1]
    if not os.access(path, os.X_OK):
        raise AssertionError("buf not executable at %r" % path)
    return path
