"""How Producer.put turns samples into PutSamplesRequest messages: packed by
bytes and by count, encoded lazily, the messages of the current stream kept
for a re-send (rollpack.producer says why)."""

import threading

from rollpack._proto import rollouts_pb2
from rollpack.sample import Sample


class Feed:
    """Turns samples into PutSamplesRequest messages, lazily, remembering
    the messages of the current stream for a re-send. An error while
    encoding (or from the caller's iterable) ends the stream cleanly: the
    samples before it are sent and committed, and the caller re-raises it
    after the server's answer."""

    def __init__(self, samples, pool, spec, max_message_bytes, max_samples_per_message,
                 max_unacked_bytes, result):
        if isinstance(samples, Sample):
            samples = [samples]
        self.pool, self.spec = pool, spec
        self.max_message_bytes, self.max_unacked_bytes = max_message_bytes, max_unacked_bytes
        self.max_samples_per_message = max_samples_per_message
        self.result = result
        self.unacked, self.unacked_bytes = [], 0
        self.error = None
        self.done = False
        self.is_async = hasattr(samples, "__aiter__")
        self._it = samples.__aiter__() if self.is_async else iter(samples)
        self._cur, self._cur_size = None, 0
        self._gen = 0
        self._lock = threading.Lock()
        self._alock = None

    def _push(self, s):
        """Adds a sample; returns the previous message when it is full."""
        if not isinstance(s, Sample):
            raise TypeError("put() takes rollpack.Sample objects, got %s" % type(s).__name__)
        hint = s.wire_size_hint()
        out = None
        if self._cur is not None and (
                self._cur_size + hint > self.max_message_bytes
                or 0 < self.max_samples_per_message <= len(self._cur.samples)):
            out = self._flush()
        if self._cur is None:
            self._cur, self._cur_size = rollouts_pb2.PutSamplesRequest(pool=self.pool), 0
        pb = self._cur.samples.add()
        try:
            s.to_proto(self.spec, pb)
        except BaseException:
            del self._cur.samples[-1]
            if out is not None:  # keep the full message: _step flushes it
                self._cur = out
            raise
        self._cur_size += hint
        return out

    def _flush(self):
        req, self._cur, self._cur_size = self._cur, None, 0
        return req if req is not None and len(req.samples) else None

    def _record(self, req):
        n = req.ByteSize()
        self.unacked.append(req)
        self.unacked_bytes += n
        self._count(req, n)

    def _count(self, req, n):
        self.result.messages += 1
        self.result.samples += len(req.samples)
        self.result.wire_bytes += n

    def _open(self):
        return not self.done and self.error is None and self.unacked_bytes < self.max_unacked_bytes

    def _begin(self):
        """Starts a stream attempt: later pulls of older attempts' iterators
        (grpc may still run one in its consumer thread) stop."""
        self._gen += 1
        replay = list(self.unacked)
        for req in replay:  # re-send after a failed attempt
            self._count(req, req.ByteSize())
        return self._gen, replay

    def _step(self, s, end, err):
        """Handles one pulled sample (or the end / an error); returns the
        message to send, if any."""
        if err is not None:
            self.error = err
            req = self._flush()
        elif end:
            self.done = True
            req = self._flush()
        else:
            try:
                req = self._push(s)
            except BaseException as e:  # noqa: B902 - re-raised by put()
                self.error = e
                req = self._flush()
        if req is not None:
            self._record(req)
        return req

    def stream(self):
        """Request iterator of one stream attempt (sync source)."""
        with self._lock:
            gen, replay = self._begin()
        yield from replay
        while True:
            with self._lock:
                if gen != self._gen or not self._open():
                    return
                s, end, err = None, False, None
                try:
                    s = next(self._it)
                except StopIteration:
                    end = True
                except BaseException as e:  # noqa: B902
                    err = e
                req = self._step(s, end, err)
            if req is not None:
                yield req

    async def astream(self):
        """Request iterator of one stream attempt (sync or async source)."""
        async with self._alock:
            gen, replay = self._begin()
        for req in replay:
            yield req
        while True:
            async with self._alock:
                if gen != self._gen or not self._open():
                    return
                s, end, err = None, False, None
                try:
                    s = (await self._it.__anext__()) if self.is_async else next(self._it)
                except (StopIteration, StopAsyncIteration):
                    end = True
                except Exception as e:
                    err = e
                req = self._step(s, end, err)
            if req is not None:
                yield req

    def acked(self):
        self.unacked, self.unacked_bytes = [], 0
