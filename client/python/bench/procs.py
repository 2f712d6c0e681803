"""Processes the benchmarks start on 127.0.0.1 ephemeral ports: a one-member
etcd (Debian's etcd-server) and rollpackd daemons, each with its own
temporary directory (logs there). The caller stops them (SIGTERM)."""

import os
import subprocess
import tempfile
import time


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_etcd(exe):
    d = tempfile.mkdtemp(prefix="tb-etcd-")
    client, peer = free_port(), free_port()
    url = "http://127.0.0.1:%d" % client
    purl = "http://127.0.0.1:%d" % peer
    proc = subprocess.Popen([exe, "--name", "tb", "--data-dir", d, "--listen-client-urls", url,
                             "--advertise-client-urls", url, "--listen-peer-urls", purl,
                             "--initial-advertise-peer-urls", purl,
                             "--initial-cluster", "tb=" + purl],
                            stdout=open(os.path.join(d, "log"), "wb"), stderr=subprocess.STDOUT)
    import urllib.request
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            return proc, url
        except Exception:
            if proc.poll() is not None:
                raise RuntimeError("etcd exited")
            time.sleep(0.1)
    raise RuntimeError("etcd did not start")


def start_rollpackd(exe, extra=()):
    d = tempfile.mkdtemp(prefix="tb-")
    pf = os.path.join(d, "port")
    proc = subprocess.Popen([exe, "--listen", "127.0.0.1:0", "--port-file", pf,
                             "--max-memory", str(8 << 30)] + list(extra),
                            stdout=open(os.path.join(d, "log"), "wb"), stderr=subprocess.STDOUT)
    for _ in range(600):
        if os.path.exists(pf) and open(pf).read().strip():
            return proc, "127.0.0.1:%d" % int(open(pf).read())
        if proc.poll() is not None:
            raise RuntimeError("rollpackd exited")
        time.sleep(0.05)
    raise RuntimeError("rollpackd did not start")
