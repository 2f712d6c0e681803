"""An in-process Trainer server that streams micro-batches a test wrote by
hand, for what the trainer client does with bytes rollpackd would not send
(forged fields) or does not send yet.

FetchMicrobatches streams ``microbatches`` from the request's start_index;
FetchPieces streams ``pieces`` (PieceRows set: the header pieces on the
member dialled, a member's own pieces on the others) or, when there are
none, answers UNIMPLEMENTED as an older rollpackd does. It is NOT a stand-in
for rollpackd's layout: the round trips through the real server are in
test_trainer and test_roundtrip.
"""

import threading
from concurrent import futures

import grpc

from rollpack._proto import trainer_pb2_grpc


class FakeTrainer(trainer_pb2_grpc.TrainerServicer):
    def __init__(self, microbatches=(), pieces=None):
        self.microbatches = list(microbatches)
        self.pieces = None if pieces is None else list(pieces)
        self.lock = threading.Lock()
        self.calls = []  # ("FetchMicrobatches" | "FetchPieces", request)

    def FetchMicrobatches(self, req, ctx):
        with self.lock:
            self.calls.append(("FetchMicrobatches", req))
        for m in self.microbatches:
            if m.index >= req.start_index:
                yield m

    def FetchPieces(self, req, ctx):
        with self.lock:
            self.calls.append(("FetchPieces", req))
        if self.pieces is None:
            ctx.abort(grpc.StatusCode.UNIMPLEMENTED, "FetchPieces is not served")
        for p in self.pieces:
            if p.index >= req.start_index:
                yield p


class ServeTrainer:
    """Starts a FakeTrainer on 127.0.0.1:<ephemeral>; ``address`` is known
    before the servicer's micro-batches are set (a header piece names it)."""

    def __init__(self, microbatches=(), pieces=None):
        self.servicer = FakeTrainer(microbatches, pieces)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                                  options=[("grpc.max_send_message_length", -1)])
        trainer_pb2_grpc.add_TrainerServicer_to_server(self.servicer, self.server)
        self.address = "127.0.0.1:%d" % self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def stop(self):
        self.server.stop(None).wait()
