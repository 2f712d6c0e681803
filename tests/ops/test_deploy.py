"""Every manifest in deploy/ parses, and its ports and flags match
rollpackd's: flag names against `rollpackd --helpfull`, ports across
Deployment, probes, Service, ServiceMonitor, Dockerfile and systemd unit;
the runtime image installs the libraries rollpackd links; the dashboard
queries only metrics rollpackd exports and shows every one of them (a
single durable server's and a cluster member's); the PrometheusRule carries
the same rules as deploy/prometheus; --version and rollpack_build_info agree."""

import json
import os
import re
import shlex
import subprocess
import unittest

import yaml

import harness

DEPLOY = os.path.join(harness.REPO, "deploy")
GRPC_PORT = 50051
METRICS_PORT = 9464


def rollpackd_flags():
    exe = harness.require_env_binary("ROLLPACKD")
    out = subprocess.run([exe, "--helpfull"], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    # absl: "    --max_memory (help...); default: 0;" under "Flags from server/rollpackd_main.cc:".
    section = re.split(r"Flags from \S*server/rollpackd_main\.cc:", text, 1)
    if len(section) != 2:
        raise AssertionError("no rollpackd_main.cc flags in --helpfull:\n" + text[:2000])
    body = re.split(r"\n\s*Flags from ", section[1], 1)[0]
    return {m.replace("_", "-") for m in re.findall(r"^\s+--([a-z0-9_]+) \(", body, re.M)}


def split_flags(args):
    """['--a=b', '--c', 'd'] -> {'a': 'b', 'c': 'd'} (dashed names)."""
    out = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            raise AssertionError("not a flag: %r in %r" % (a, args))
        if "=" in a:
            k, v = a[2:].split("=", 1)
        else:
            k = a[2:]
            v = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else "true"
            i += 0 if v == "true" else 1
        out[k] = v
        i += 1
    return out


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def dashboard_families(expr):
    """Metric families a PromQL expression reads (histogram series by family)."""
    return set(re.findall(r"\b((?:rollpack|exposer|process)_[a-z0-9_]+?)(?:_bucket|_sum|_count)?"
                          r"\b(?=[{\[ )]|$)", expr))


def exported_families():
    """Families live rollpackds declare (# TYPE lines): a single server with
    --data-dir (the durable-log families), and a member of a cluster on a
    real etcd (the cluster families)."""
    texts = {}
    with harness.tempdir() as d:
        single, member = os.path.join(d, "single"), os.path.join(d, "member")
        os.mkdir(single)
        os.mkdir(member)
        with harness.Rollpackd(single, "--data-dir", os.path.join(single, "data")) as rp:
            texts["single"] = rp.scrape()
        with harness.Etcd(d) as etcd, harness.Rollpackd(
                member, "--data-dir", os.path.join(member, "data"), "--cluster-etcd", etcd.url,
                "--cluster-lease-seconds", "2") as rp:
            texts["member"] = rp.scrape()
    declared = {k: set(re.findall(r"^# TYPE (\S+) ", v, re.M)) for k, v in texts.items()}
    # Not vacuous: each mode adds its families, and both have the rest.
    for mode, family in [("single", "rollpack_durable_log_cut_bytes"),
                         ("single", "process_open_fds"), ("single", "rollpack_build_info"),
                         ("member", "rollpack_cluster_members"),
                         ("member", "rollpack_durable_log_cut_bytes"),
                         ("member", "rollpack_ingested_samples_total")]:
        assert family in declared[mode], (mode, family, sorted(declared[mode]))
    return declared["single"] | declared["member"]


class DeployTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.flags = rollpackd_flags()
        for f in ["listen", "metrics-listen", "max-memory", "auth-tokens", "tls-cert",
                  "tls-key", "tls-client-ca", "max-concurrent-streams", "max-message-bytes"]:
            assert f in cls.flags, (f, cls.flags)

    def check_flags(self, args, where):
        flags = split_flags(args)
        for name in flags:
            self.assertIn(name, self.flags, "%s: --%s is not a rollpackd flag" % (where, name))
        self.assertEqual(port_of(flags["listen"]), GRPC_PORT, where)
        self.assertEqual(port_of(flags["metrics-listen"]), METRICS_PORT, where)
        if "max-memory" in flags:
            self.assertGreater(int(flags["max-memory"]), 0)
        return flags

    def test_every_yaml_and_json_parses(self):
        seen = 0
        for root, _, files in os.walk(DEPLOY):
            for f in files:
                path = os.path.join(root, f)
                if f.endswith((".yaml", ".yml")):
                    with open(path) as fh:
                        docs = [d for d in yaml.safe_load_all(fh) if d is not None]
                    self.assertTrue(docs, path)
                    seen += 1
                elif f.endswith(".json"):
                    with open(path) as fh:
                        json.load(fh)
                    seen += 1
        self.assertGreaterEqual(seen, 6)

    def kube(self, name):
        with open(os.path.join(DEPLOY, "kubernetes", name)) as f:
            return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(f) if d}

    def test_kubernetes_sidecar(self):
        objs = self.kube("vllm-rollpackd.yaml")
        pod = objs[("Deployment", "vllm-rollout")]["spec"]["template"]
        containers = {c["name"]: c for c in pod["spec"]["containers"]}
        self.assertIn("vllm", containers)
        rp = containers["rollpackd"]
        flags = self.check_flags(rp["args"], "kubernetes rollpackd args")
        ports = {p["name"]: p["containerPort"] for p in rp["ports"]}
        expected_ports = {"grpc": GRPC_PORT, "metrics": METRICS_PORT}
        if "capture-listen" in flags:
            # The capture port in front of the engine container's port.
            expected_ports["capture"] = port_of(flags["capture-listen"])
            engine_ports = [p["containerPort"] for p in containers["vllm"]["ports"]]
            self.assertIn(port_of(flags["capture-upstream"].removeprefix("http://")), engine_ports)
            self.assertTrue(any(flags["capture-model"].startswith(m["mountPath"] + "/")
                                for m in rp["volumeMounts"]), flags["capture-model"])
        self.assertEqual(ports, expected_ports)
        # gRPC probes speak plaintext: a TLS port is probed with tcpSocket.
        probe_kind = "tcpSocket" if "tls-cert" in flags else "grpc"
        for probe in ["startupProbe", "readinessProbe", "livenessProbe"]:
            self.assertEqual(rp[probe], {**rp[probe], probe_kind: {"port": GRPC_PORT}}, probe)
        mounts = [m["mountPath"] for m in rp["volumeMounts"]]
        if "cluster-etcd" in flags:
            # Cluster mode (docs/cluster.md): every replica is a member, it
            # advertises its pod IP, and with credentials (its Threat model)
            # tokens need mutual TLS, etcd is reached over TLS with the
            # member's certificate, and every file is mounted.
            self.assertGreater(objs[("Deployment", "vllm-rollout")]["spec"]["replicas"], 1)
            self.assertTrue(flags["cluster-advertise"].startswith("$(POD_IP):"), flags)
            self.assertEqual(port_of(flags["cluster-advertise"]), GRPC_PORT)
            self.assertTrue(any(flags["data-dir"].startswith(m) for m in mounts), mounts)
            if "auth-tokens" in flags:
                for f in ["tls-cert", "tls-key", "tls-client-ca"]:
                    self.assertIn(f, flags, "cluster mode with tokens needs mutual TLS")
            if flags["cluster-etcd"].startswith("https://"):
                for f in ["cluster-etcd-ca", "cluster-etcd-cert", "cluster-etcd-key"]:
                    self.assertIn(f, flags)
            for f in ["auth-tokens", "tls-cert", "tls-key", "tls-client-ca", "cluster-etcd-ca",
                      "cluster-etcd-cert", "cluster-etcd-key"]:
                if f in flags:
                    self.assertTrue(any(flags[f].startswith(m + "/") for m in mounts),
                                    (f, flags[f], mounts))
            # The mounted Secrets exist: certificates.yaml issues the TLS
            # ones, this file holds the tokens.
            certs = self.kube("certificates.yaml")
            issued = {c["spec"]["secretName"] for (kind, _), c in certs.items()
                      if kind == "Certificate"}
            volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
            for v in volumes.values():
                if "secret" in v:
                    name = v["secret"]["secretName"]
                    self.assertTrue(name in issued or ("Secret", name) in objs, name)
            member = certs[("Certificate", "rollpack-member")]["spec"]
            self.assertEqual(member["commonName"], flags.get("cluster-member-identity",
                                                             "rollpack-member"))
        else:
            # The token file is mounted where --auth-tokens points.
            self.assertTrue(any(flags["auth-tokens"].startswith(m + "/") for m in mounts), mounts)
        # Memory limit leaves room above --max-memory.
        limit = rp["resources"]["limits"]["memory"]
        self.assertTrue(limit.endswith("Gi"))
        self.assertGreater(int(limit[:-2]) * 2**30, int(flags["max-memory"]))
        # The producer in the pod dials the sidecar.
        env = {e["name"]: e for e in containers["vllm"]["env"]}
        self.assertEqual(port_of(env["ROLLPACK_ADDRESS"]["value"]), GRPC_PORT)
        svc = objs[("Service", "rollpackd")]
        self.assertEqual(svc["spec"]["selector"], {
            k: v for k, v in pod["metadata"]["labels"].items() if k in svc["spec"]["selector"]})
        sports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
        self.assertEqual(sports, {"grpc": (GRPC_PORT, "grpc"), "metrics": (METRICS_PORT, "metrics")})
        self.svc_labels = svc["metadata"]["labels"]

    def test_servicemonitor_and_rules(self):
        svc = self.kube("vllm-rollpackd.yaml")[("Service", "rollpackd")]
        objs = self.kube("monitoring.yaml")
        sm = objs[("ServiceMonitor", "rollpackd")]
        for k, v in sm["spec"]["selector"]["matchLabels"].items():
            self.assertEqual(svc["metadata"]["labels"].get(k), v)
        self.assertEqual([e["port"] for e in sm["spec"]["endpoints"]], ["metrics"])
        self.assertEqual(sm["spec"]["endpoints"][0]["path"], "/metrics")
        with open(os.path.join(DEPLOY, "prometheus", "rollpack-rules.yml")) as f:
            rules = yaml.safe_load(f)
        self.assertEqual(objs[("PrometheusRule", "rollpackd")]["spec"], rules)

    def test_prometheus_config(self):
        promtool = harness.require_tool("promtool")
        cfg = os.path.join(DEPLOY, "prometheus", "prometheus.yml")
        out = subprocess.run([promtool, "check", "config", cfg], capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        with open(cfg) as f:
            targets = yaml.safe_load(f)["scrape_configs"][0]["static_configs"][0]["targets"]
        self.assertEqual([port_of(t) for t in targets], [METRICS_PORT])
        with open(os.path.join(DEPLOY, "prometheus", "scrape-kubernetes.yml")) as f:
            job = yaml.safe_load(f)["scrape_configs"][0]
        self.assertIn({"source_labels": ["__meta_kubernetes_pod_container_port_name"],
                       "regex": "metrics", "action": "keep"}, job["relabel_configs"])

    def test_systemd_unit(self):
        with open(os.path.join(DEPLOY, "systemd", "rollpackd.service")) as f:
            text = f.read().replace("\\\n", " ")
        sections = {}
        current = None
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                current = sections.setdefault(line.strip("[]"), {})
            else:
                k, v = line.split("=", 1)
                current[k] = v
        self.assertEqual(set(sections), {"Unit", "Service", "Install"})
        argv = shlex.split(sections["Service"]["ExecStart"])
        self.assertTrue(argv[0].endswith("/rollpackd"))
        flags = self.check_flags(argv[1:], "systemd ExecStart")
        # Metrics stay on loopback on a bare host.
        self.assertTrue(flags["metrics-listen"].startswith("127.0.0.1:"))
        grace = int(flags["shutdown-grace-seconds"])
        self.assertGreater(int(sections["Service"]["TimeoutStopSec"]), grace)

    def test_dockerfile(self):
        with open(os.path.join(DEPLOY, "Dockerfile")) as f:
            text = f.read()
        stages = re.findall(r"^FROM (\S+)(?: AS (\S+))?", text, re.M)
        self.assertEqual([s[0] for s in stages], ["debian:bookworm", "debian:bookworm-slim"])
        self.assertIn("RUN bash tools/install_deps.sh", text)
        self.assertIn("COPY --from=build /src/build/bin/rollpackd", text)
        self.assertEqual(sorted(int(p) for p in re.search(r"^EXPOSE (.*)$", text, re.M)
                                .group(1).split()), sorted([GRPC_PORT, METRICS_PORT]))
        cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
        self.check_flags(cmd, "Dockerfile CMD")
        # The runtime stage installs every package whose shared library
        # rollpackd loads (libc and the compiler runtime come with the base).
        runtime = text.split("AS runtime", 1)[1]
        listed = set(re.findall(r"\b(lib[a-z0-9+.\-]+\d[a-z0-9+.\-]*)\b",
                                runtime.split("COPY", 1)[0]))
        ldd = subprocess.run(["ldd", harness.require_env_binary("ROLLPACKD")],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(ldd.returncode, 0, ldd.stderr)
        libs = re.findall(r"=> (/\S+)", ldd.stdout)
        self.assertNotIn("not found", ldd.stdout)
        base = {"libc6", "libstdc++6", "libgcc-s1", "zlib1g", "libzstd1", "liblzma5", "libbz2-1.0",
                "libcrypt1", "libselinux1", "libpcre2-8-0", "libsystemd0", "libgpg-error0",
                "libgcrypt20", "liblz4-1", "libcap2", "libudev1"}
        closure = set()
        deps = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends",
                               "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces",
                               "--no-enhances"] + sorted(listed),
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(deps.returncode, 0, deps.stderr)
        for line in deps.stdout.splitlines():
            m = re.match(r"^\s*(?:\|?(?:Pre)?Depends: )?<?([a-z0-9][a-z0-9+.\-]*)(?::amd64)?>?$",
                         line)
            if m:
                closure.add(m.group(1))
        missing = []
        for lib in libs:
            owner = subprocess.run(["dpkg", "-S", os.path.realpath(lib)], capture_output=True,
                                   text=True)
            if owner.returncode != 0:  # usrmerge: /lib vs /usr/lib
                owner = subprocess.run(["dpkg", "-S", lib], capture_output=True, text=True)
            self.assertEqual(owner.returncode, 0, "no package owns %s" % lib)
            pkg = owner.stdout.split(":", 1)[0]
            if pkg not in base and pkg not in closure:
                missing.append((lib, pkg))
        self.assertEqual(missing, [], "runtime stage lacks these packages")

    def test_grafana_dashboard(self):
        with open(os.path.join(DEPLOY, "grafana", "rollpack-dashboard.json")) as f:
            dash = json.load(f)
        exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
        # Every graph says what its lines are.
        for p in dash["panels"]:
            if p["type"] == "row":
                continue
            self.assertTrue(p["options"]["legend"].get("showLegend"), p["title"])
            for t in p["targets"]:
                self.assertTrue(t.get("legendFormat"), (p["title"], t["expr"]))
        rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
        for row in ["Cluster", "Durable log", "Process"]:
            self.assertTrue(any(r.startswith(row) for r in rows), (row, rows))
        self.assertGreater(len(exprs), 20)
        used = set()
        for e in exprs:
            used |= dashboard_families(e)
        families = exported_families()
        self.assertEqual(used - families, set(), "dashboard queries unknown metrics")
        self.assertEqual(families - used, set(), "exported metrics without a panel")

    def test_version_and_build_info(self):
        """`rollpackd --version`, `rollpack --version` and `rollpack version`
        print one line and exit 0; rollpackd's rollpack_build_info says the
        same; the Python package carries the same version."""
        import rollpack
        line = re.compile(r"^(rollpackd?) (\d+\.\d+\.\d+) \(commit ([0-9a-f]{4,}|unknown), "
                          r"gRPC (\d+\.\d+\.\d+), protobuf (\d+\.\d+\.\d+)\)\n$")
        rollpackd = harness.require_env_binary("ROLLPACKD")
        cli = harness.require_env_binary("ROLLPACK_CLI")
        seen = []
        for args in ([rollpackd, "--version"], [cli, "--version"], [cli, "version"]):
            out = subprocess.run(args, capture_output=True, text=True, timeout=60)
            self.assertEqual((out.returncode, out.stderr), (0, ""), args)
            m = line.match(out.stdout)
            self.assertTrue(m, (args, out.stdout))
            self.assertEqual(m.group(1), os.path.basename(args[0]))
            seen.append(m.groups()[1:])
        self.assertEqual(len(set(seen)), 1, seen)
        version, commit, grpc_version, protobuf = seen[0]
        with open(os.path.join(harness.REPO, "base", "version.h")) as f:
            self.assertIn('kRollpackVersion[] = "%s";' % version, f.read())
        self.assertEqual(rollpack.__version__, version, "client/python/rollpack/__init__.py")
        with harness.tempdir() as d, harness.Rollpackd(d) as rp:
            samples = harness.parse_exposition(rp.scrape())
        info = [k for k in samples if k.startswith("rollpack_build_info{")]
        self.assertEqual(info, ['rollpack_build_info{commit="%s",grpc="%s",protobuf="%s",'
                                'version="%s"}' % (commit, grpc_version, protobuf, version)])
        self.assertEqual(samples[info[0]], 1.0)


if __name__ == "__main__":
    unittest.main()
