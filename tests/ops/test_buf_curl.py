"""The debugging calls of docs/operations.md, made with `buf curl` (npm
@bufbuild/buf, gRPC + server reflection) against a running rollpackd:
list services and methods, describe rollpack.v1.Plan, GetPool, CreateStep,
GetPlan for a step, the health check; then the same over TLS with tokens."""

import base64
import json
import os
import subprocess
import unittest

import numpy as np
from google.protobuf import descriptor_pb2

import harness
import rollpack


def push_samples(address, pool, n=6, tokens=48, **producer_args):
    rng = np.random.default_rng(0)
    spec = rollpack.ModelSpec("buf-test", num_layers=2, num_experts=8, topk=2)
    samples = []
    for i in range(n):
        toks = rng.integers(1, 1000, size=tokens, dtype=np.int32)
        experts = np.stack([np.stack([rng.choice(8, 2, replace=False) for _ in range(2)])
                            for _ in range(tokens)]).astype(np.uint8)
        samples.append(rollpack.Sample("s%d" % i, toks, experts))
    with rollpack.Producer(address, pool=pool, **producer_args) as p:
        p.register_model(spec)
        return p.put(samples)


class BufCurl:
    def __init__(self, url, *flags):
        self.exe = harness.buf()
        self.url = url
        self.flags = list(flags)

    def run(self, *args, data=None, path=""):
        cmd = [self.exe, "curl", "--protocol", "grpc"] + self.flags + list(args)
        if data is not None:
            cmd += ["--data", json.dumps(data)]
        cmd.append(self.url + path)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    def ok(self, *args, **kw):
        out = self.run(*args, **kw)
        if out.returncode != 0:
            raise AssertionError("buf curl %s failed (%d):\n%s%s"
                                 % (kw.get("path", args), out.returncode, out.stdout, out.stderr))
        return out.stdout


class BufCurlTest(unittest.TestCase):
    def test_plaintext_debugging_calls(self):
        with harness.tempdir() as d, harness.Rollpackd(d) as rp:
            curl = BufCurl("http://" + rp.address, "--http2-prior-knowledge")
            services = curl.ok("--list-services").split()
            for s in ["rollpack.v1.Rollouts", "rollpack.v1.Scheduler", "rollpack.v1.Trainer",
                      "grpc.health.v1.Health"]:
                self.assertIn(s, services)
            methods = curl.ok("--list-methods").split()
            for m in ["rollpack.v1.Rollouts/PutSamples", "rollpack.v1.Scheduler/GetPlan",
                      "rollpack.v1.Scheduler/ReleaseStep", "rollpack.v1.Trainer/FetchMicrobatches",
                      "rollpack.v1.Trainer/FetchPieces"]:
                self.assertIn(m, methods)

            # describe rollpack.v1.Plan: the reflection service's answer.
            out = curl.ok(data={"file_containing_symbol": "rollpack.v1.Plan"},
                          path="/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
            files = json.loads(out)["fileDescriptorResponse"]["fileDescriptorProto"]
            fields = None
            for b in files:
                fd = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(b))
                for msg in fd.message_type:
                    if fd.package == "rollpack.v1" and msg.name == "Plan":
                        fields = [f.name for f in msg.field]
            self.assertEqual(fields, ["step_id", "pool", "topology", "stats", "microbatches"])

            health = json.loads(curl.ok(data={}, path="/grpc.health.v1.Health/Check"))
            self.assertEqual(health, {"status": "SERVING"})

            put = push_samples(rp.address, "bufpool")
            self.assertEqual(put.accepted, 6)
            pool = json.loads(curl.ok(data={"pool": "bufpool"},
                                      path="/rollpack.v1.Rollouts/GetPool"))
            self.assertEqual(pool["numSamples"], "6")
            self.assertEqual(pool["model"]["numExperts"], 8)

            step = json.loads(curl.ok(
                data={"step_id": "step-1", "pool": "bufpool", "num_samples": 6,
                      "topology": {"dp": 2, "max_tokens_per_rank": 128}},
                path="/rollpack.v1.Scheduler/CreateStep"))
            self.assertEqual(step["stepId"], "step-1")
            plan = json.loads(curl.ok(data={"step_id": "step-1"},
                                      path="/rollpack.v1.Scheduler/GetPlan"))
            self.assertEqual(len(plan["microbatches"]), step["numMicrobatches"])
            ids = sorted(i for mb in plan["microbatches"] for g in mb["groups"]
                         for i in g["sampleIds"])
            self.assertEqual(ids, ["s%d" % i for i in range(6)])

            missing = curl.run(data={"step_id": "nope"}, path="/rollpack.v1.Scheduler/GetPlan")
            self.assertNotEqual(missing.returncode, 0)
            self.assertIn("not_found", missing.stdout + missing.stderr)

    def test_tls_and_tokens(self):
        with harness.tempdir() as d:
            certs = harness.make_certs(d)
            tokens = os.path.join(d, "tokens")
            with open(tokens, "w") as f:
                f.write("producer producer-token-0123456789\n"
                        "trainer trainer-token-0123456789\n"
                        "admin admin-token-0123456789abcd\n")
            os.chmod(tokens, 0o600)
            with harness.Rollpackd(d, "--tls-cert", certs["server.crt"], "--tls-key",
                                   certs["server.key"], "--auth-tokens", tokens) as rp:
                url = "https://localhost:%d" % rp.port
                curl = BufCurl(url, "--cacert", certs["ca.crt"])
                # Reflection and health stay open; rollpack methods need a token.
                self.assertIn("rollpack.v1.Scheduler", curl.ok("--list-services").split())
                self.assertEqual(json.loads(curl.ok(data={}, path="/grpc.health.v1.Health/Check")),
                                 {"status": "SERVING"})
                bare = curl.run(data={"pool": "p"}, path="/rollpack.v1.Rollouts/GetPool")
                self.assertNotEqual(bare.returncode, 0)
                self.assertIn("unauthenticated", bare.stdout + bare.stderr)

                put = push_samples("localhost:%d" % rp.port, "p", n=2, tls=True,
                                   root_certificates=certs["ca.crt"],
                                   token="producer-token-0123456789")
                self.assertEqual(put.accepted, 2)
                trainer = BufCurl(url, "--cacert", certs["ca.crt"],
                                  "-H", "authorization: Bearer trainer-token-0123456789")
                pool = json.loads(trainer.ok(data={"pool": "p"},
                                             path="/rollpack.v1.Rollouts/GetPool"))
                self.assertEqual(pool["numSamples"], "2")
                denied = trainer.run(data={"step_id": "x"}, path="/rollpack.v1.Scheduler/ReleaseStep")
                self.assertNotEqual(denied.returncode, 0)
                self.assertIn("permission_denied", denied.stdout + denied.stderr)
                # Plaintext to the TLS port fails.
                plain = BufCurl("http://" + rp.address, "--http2-prior-knowledge").run(
                    "--list-services")
                self.assertNotEqual(plain.returncode, 0)


if __name__ == "__main__":
    unittest.main()
