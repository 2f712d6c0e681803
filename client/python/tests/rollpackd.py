"""Starts and stops a real rollpackd for round-trip tests.

The binary is $ROLLPACKD (set by CTest to ${CMAKE_BINARY_DIR}/bin/rollpackd),
else <repo>/build/bin/rollpackd. Under CTest (ROLLPACKD set) a missing
binary is a failure; in a manual run without ROLLPACKD it skips the tests.
"""

import os
import signal
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.request

_REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", ".."))


def binary():
    path = os.environ.get("ROLLPACKD")
    if path:
        if not os.access(path, os.X_OK):
            raise AssertionError("ROLLPACKD=%s is not an executable (build rollpackd first)" % path)
        return path
    path = os.path.join(_REPO, "build", "bin", "rollpackd")
    if not os.access(path, os.X_OK):
        raise unittest.SkipTest("%s not built and $ROLLPACKD unset" % path)
    return path


class Rollpackd:
    """``with Rollpackd() as d: d.address`` -- 127.0.0.1, ephemeral port
    (via --port-file); always SIGTERMed and waited for on exit."""

    def __init__(self, *extra_args, start_timeout=30.0):
        self.exe = binary()
        self.dir = tempfile.TemporaryDirectory(prefix="rollpackd-test-")
        self.port_file = os.path.join(self.dir.name, "port")
        self.log_path = os.path.join(self.dir.name, "log")
        self.args = [self.exe, "--listen", "127.0.0.1:0", "--port-file", self.port_file] + list(extra_args)
        self.start_timeout = start_timeout
        self.proc = None
        self.address = None
        self.returncode = None

    def start(self):
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise AssertionError("rollpackd exited with %d before serving:\n%s"
                                     % (self.proc.returncode, self.output()))
            try:
                with open(self.port_file) as f:
                    text = f.read().strip()
                if text:
                    self.address = "127.0.0.1:%d" % int(text)
                    return self
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.05)
        self.stop()
        raise AssertionError("rollpackd wrote no port to %s within %.0fs:\n%s"
                             % (self.port_file, self.start_timeout, self.output()))

    def output(self):
        if getattr(self, "_final_output", None) is not None:
            return self._final_output
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self):
        if self.proc is not None and self.returncode is None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.returncode = self.proc.returncode
            self.log.close()
            self._final_output = None
            self._final_output = self.output()
        return self.returncode

    def cleanup(self):
        self.stop()
        self.dir.cleanup()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()  # stops it; output() and returncode stay readable


def read_port_file(path, timeout=30.0):
    """The port rollpackd wrote to ``path`` (--metrics-port-file), waiting
    for the file up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise AssertionError("no port in %s after %.0f s" % (path, timeout))
            time.sleep(0.05)


def scrape_metric(metrics_port, name):
    """The value of the unlabelled series `name` on rollpackd's /metrics."""
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % metrics_port, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{}"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("%s not exported" % name)


ETCD = "/usr/bin/etcd"  # Debian's etcd-server


def start_etcd(test, tmp):
    """A one-member etcd on 127.0.0.1 ephemeral ports with its data under
    ``tmp``, stopped when ``test`` (a unittest.TestCase) ends; returns its
    client URL, what --cluster-etcd takes."""
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    url, peer = "http://127.0.0.1:%d" % ports[0], "http://127.0.0.1:%d" % ports[1]
    etcd = subprocess.Popen([ETCD, "--data-dir", os.path.join(tmp, "etcd"),
                             "--listen-client-urls", url, "--advertise-client-urls", url,
                             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                             "--initial-cluster", "default=" + peer],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    test.addCleanup(etcd.wait)
    test.addCleanup(etcd.terminate)
    return url
