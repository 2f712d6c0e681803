"""An in-process Rollouts server for the producer's client-side behaviour
(batching, streams, retries, deadlines, metadata, TLS, error mapping).

It implements the ingest semantics of the contract (all-or-nothing per
message, idempotent identical re-sends, ALREADY_EXISTS for different
content) with fault injection; it is NOT a stand-in for rollpackd's
validation: the round trips through the real server are in test_roundtrip.
"""

import threading
import time
from concurrent import futures

import grpc

from rollpack._proto import rollouts_pb2, rollouts_pb2_grpc


class FakeRollouts(rollouts_pb2_grpc.RolloutsServicer):
    def __init__(self):
        self.lock = threading.Lock()
        self.models = {}
        self.samples = {}  # (pool, id) -> serialized Sample
        self.faults = []  # (code, details, messages_to_commit_first) per PutSamples call
        self.put_calls = 0
        self.messages = 0
        self.metadata = []
        self.delay = 0.0
        self.options = {}  # pool -> PoolOptions of its registration
        self.annotations = []  # AnnotateSamplesRequest, as received

    def _md(self, ctx):
        with self.lock:
            self.metadata.append(dict(ctx.invocation_metadata()))

    def RegisterModel(self, req, ctx):
        self._md(ctx)
        time.sleep(self.delay)
        with self.lock:
            old = self.models.get(req.pool)
            if old is not None and old != req.model:
                ctx.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          'pool "%s" holds model "%s", a different spec' % (req.pool, old.name))
            self.models[req.pool] = req.model
            self.options.setdefault(req.pool, req.options)
        return rollouts_pb2.RegisterModelResponse(created=old is None, model=req.model)

    def GetPool(self, req, ctx):
        self._md(ctx)
        time.sleep(self.delay)
        with self.lock:
            if req.pool not in self.models:
                ctx.abort(grpc.StatusCode.NOT_FOUND, 'pool "%s" does not exist' % req.pool)
            n = sum(1 for (p, _) in self.samples if p == req.pool)
            return rollouts_pb2.PoolInfo(pool=req.pool, model=self.models[req.pool], num_samples=n,
                                         num_free_samples=n)

    def PutSamples(self, it, ctx):
        self._md(ctx)
        with self.lock:
            self.put_calls += 1
            fault = self.faults.pop(0) if self.faults else None
        accepted = dups = stored = 0
        for i, req in enumerate(it):
            if fault is not None and i >= fault[2]:
                ctx.abort(fault[0], fault[1])
            with self.lock:
                self.messages += 1
                staged = {}
                for s in req.samples:
                    if s.sample_id.startswith("bad"):
                        ctx.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  'sample "%s": routed_experts[0, 1, 2] is 99, outside [0, 16) '
                                  '(%d samples committed by this stream)' % (s.sample_id, accepted))
                    key = (req.pool, s.sample_id)
                    data = s.SerializeToString(deterministic=True)
                    if key in self.samples or key in staged:
                        if self.samples.get(key, staged.get(key)) != data:
                            ctx.abort(grpc.StatusCode.ALREADY_EXISTS,
                                      'sample "%s" exists with different content' % s.sample_id)
                        dups += 1
                    else:
                        staged[key] = data
                        stored += len(data)
                    accepted += 1
                self.samples.update(staged)
        if fault is not None:
            ctx.abort(fault[0], fault[1])
        return rollouts_pb2.PutSamplesResponse(accepted=accepted, duplicates=dups,
                                               stored_bytes=stored)


    def AnnotateSamples(self, req, ctx):
        """Records the request; refuses an unknown pool and an id twice (the
        server's checks on stored samples are rollpackd's, test_grpo)."""
        self._md(ctx)
        with self.lock:
            if req.pool not in self.models:
                ctx.abort(grpc.StatusCode.NOT_FOUND, 'pool "%s" does not exist' % req.pool)
            ids = [a.sample_id for a in req.annotations]
            for i in ids:
                if ids.count(i) > 1:
                    ctx.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              'sample "%s" is annotated twice in one request' % i)
            self.annotations.append(req)
        return rollouts_pb2.AnnotateSamplesResponse(annotated=len(req.annotations))


class Serve:
    """Starts FakeRollouts on 127.0.0.1:<ephemeral> (TLS when creds given)."""

    def __init__(self, creds=None, options=()):
        self.servicer = FakeRollouts()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=list(options))
        rollouts_pb2_grpc.add_RolloutsServicer_to_server(self.servicer, self.server)
        if creds is None:
            port = self.server.add_insecure_port("127.0.0.1:0")
        else:
            port = self.server.add_secure_port("127.0.0.1:0", creds)
        self.address = "127.0.0.1:%d" % port
        self.server.start()

    def stop(self):
        self.server.stop(None).wait()
