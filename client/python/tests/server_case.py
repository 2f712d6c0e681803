"""A test class over one real rollpackd: started once for the class, with an
insecure channel to it and its Scheduler and Trainer stubs, and required to
exit 0 on SIGTERM when the class is done."""

import unittest

import grpc

from rollpack._proto import scheduler_pb2_grpc, trainer_pb2_grpc
from tests.rollpackd import Rollpackd


class ServerTest(unittest.TestCase):
    """``cls.d`` (the daemon), ``cls.channel``, ``cls.sched``, ``cls.trainer``.
    A subclass sets CHANNEL_OPTIONS for the channel (e.g. no receive limit)."""

    CHANNEL_OPTIONS = ()

    @classmethod
    def setUpClass(cls):
        cls.d = Rollpackd()
        cls.addClassCleanup(cls.d.cleanup)
        cls.d.start()
        cls.channel = grpc.insecure_channel(cls.d.address, list(cls.CHANNEL_OPTIONS))
        cls.addClassCleanup(cls.channel.close)
        cls.sched = scheduler_pb2_grpc.SchedulerStub(cls.channel)
        cls.trainer = trainer_pb2_grpc.TrainerStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        rc = cls.d.stop()
        if rc != 0:
            raise AssertionError("rollpackd exited with %s on SIGTERM (expected 0):\n%s"
                                 % (rc, cls.d.output()))
