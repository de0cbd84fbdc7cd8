"""The sync lane: `Sync` messages over a plain TCP connection beside the gRPC server.

A gRPC stream message costs the draft server more than the work it carries: gRPC's asyncio server
hands every read and write between its poller threads and the event loop (wake-ups, context
switches, Cython and Python frames), several times the compiled core's own time per message
(docs/dgds.md, "Under load"). The lane carries the very same serialized `SyncRequest` /
`SyncResponse` bytes, answered by the same `DraftServicer` code, on one socket read and one write
per message in the server's event loop thread. Everything else (registration, finish, metrics,
server-side drafts, and clients that do not know the lane) stays on gRPC; a client learns the lane's
port from `RegisterGroupResponse.sync_lane_port` and falls back to the gRPC stream when it cannot
use it. The client's end is seer/dgds/client/lane.py; the framing both share is in seer/dgds/wire.py.

Framing, both ways: a little-endian uint32 length, then that many bytes. A client's first frame is
the hello: `HELLO` followed by the run's secret (nothing after it if the server has none); the
server answers one status frame and, if the secret is wrong, closes. After it, each client frame is
one serialized SyncRequest and each server frame one status byte (0: OK, else a grpc.StatusCode
value) followed by the serialized SyncResponse, or by the error's UTF-8 text, after which the
server closes the connection (as an aborted stream).

Bounds (Limits): at most ``max_lane_connections`` open connections (one more is answered
RESOURCE_EXHAUSTED and closed); a frame that does not arrive whole in one read is held against the
store's memory budget for its declared length until it is complete (RESOURCE_EXHAUSTED if the
budget has no room), and a connection that sends nothing for ``lane_idle_s`` in the middle of a
frame is closed (``LaneProtocol.idle_for``, checked by the server's reaper). Answers written but not
yet sent (a client that pipelines frames and does not read) are counted in the same budget
(``charge``, kept up to date by ``account``); past ``lane_unsent_bytes`` of them the connection's
further frames wait, unanswered and unread (reading paused), until the transport drains them, so
one read of many small frames never makes more than that bound plus one answer. A frame of a
connection with answers unsent, while the budget is spent, is answered RESOURCE_EXHAUSTED (after
the answers before it) and the connection closed.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import socket
import time

import grpc

from seer.dgds.server.group_store import DgdsError
from seer.dgds.wire import HELLO, LEN, OK, frame

log = logging.getLogger(__name__)

MAX_HELLO_BYTES = 4096
HELLO_TIMEOUT_S = 10.0


class LaneProtocol(asyncio.Protocol):
    """One client connection on the server's event loop: the hello, then `sync(raw) -> bytes`
    per frame. ``sync`` raises DgdsError for what the gRPC stream would abort with."""

    def __init__(self, sync, observe, status_of, token: str | None, max_message_bytes: int, open_set: set,
                 max_connections: int = 1024, reserve=None, release=None, *, max_unsent: int = 4 << 20,
                 charge=None, has_room=None):
        self._sync, self._observe, self._status_of = sync, observe, status_of
        self._open = open_set  # the server's open connections (LaneProtocols), closed when it stops
        self._hello = HELLO + (token or "").encode()
        self._max = max_message_bytes
        self._max_connections = max_connections
        self._reserve, self._release = reserve, release  # the store's budget for partial frames (bytes)
        self._held = 0  # bytes reserved for the partial frame in _buf
        self._max_unsent = max_unsent  # answers written and not yet sent, past which frames wait
        self._charge, self._has_room = charge, has_room  # the store's budget for those answers
        self._unsent = 0  # the unsent answer bytes charged (the transport's write buffer when last looked)
        self._waiting = False  # frames in _buf wait for the answers before them to drain
        self.last_read = time.monotonic()  # the last bytes received (the reaper's idle check)
        self._buf = bytearray()
        self._cache = [None]  # this connection's group lookup (GroupStore.sync_raw)
        self._authed = False
        self._transport: asyncio.Transport | None = None
        self._written: asyncio.Transport | None = None  # the transport until the connection is lost
        self._timer: asyncio.TimerHandle | None = None

    def idle_for(self, now: float) -> float:
        """Seconds this connection has sat in the middle of a frame (0 between frames, and while its
        whole frames wait for its client to read the answers before them)."""
        return now - self.last_read if self._buf and not self._waiting else 0.0

    def account(self) -> int:
        """Charge the budget with the answers written and not yet sent (the transport's write buffer),
        instead of what was charged; returns them."""
        t = self._written  # (also after _fail: a closing transport holds what it has to flush)
        n = t.get_write_buffer_size() if t is not None else 0
        if n != self._unsent and self._charge is not None:
            self._charge(n - self._unsent)
        self._unsent = n
        return n

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._transport = self._written = transport
        if len(self._open) >= self._max_connections:
            self._fail(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the sync lane holds its maximum of "
                                                           f"{self._max_connections} connections")
            return
        self._open.add(self)
        # pause_writing comes at or before the unsent bound, so resume_writing always follows a wait
        transport.set_write_buffer_limits(high=min(self._max_unsent, 64 << 10))
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._timer = asyncio.get_running_loop().call_later(HELLO_TIMEOUT_S, self._hello_late)

    def _hello_late(self) -> None:
        if not self._authed:
            self._fail(grpc.StatusCode.UNAUTHENTICATED, "no hello within the time allowed")

    def connection_lost(self, exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._open.discard(self)
        self._transport = self._written = None
        self._hold(0)
        self.account()  # (no transport: nothing unsent any more)
        self._buf = bytearray()
        self._waiting = False

    def _hold(self, n: int) -> bool:
        """Hold n bytes of the budget for the partial frame (instead of what was held)."""
        if self._release is None or n == self._held:
            return True
        if self._held:
            self._release(self._held)
            self._held = 0
        if n and not self._reserve(n):
            return False
        self._held = n
        return True

    def pause_writing(self) -> None:  # a client that does not read its answers: stop reading it
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:  # its answers drained: answer the frames that waited, read again
        self.account()
        if self._transport is None:
            return
        if self._waiting:
            self._waiting = False
            self._frames()
        if self._transport is not None and not self._waiting:
            self._transport.resume_reading()

    def _fail(self, code: grpc.StatusCode, message: str) -> None:
        t = self._transport
        if t is not None:
            t.write(frame(message.encode(), code.value[0]))
            t.close()
            self._open.discard(self)
            self._transport = None

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        if self._authed and not self._buf and len(data) >= 4 and not self._unsent:  # the usual case: one whole frame
            (n,) = LEN.unpack_from(data)
            if len(data) == 4 + n and n <= self._max:
                with memoryview(data) as view:
                    self._answer(view[4:])
                return
        self._buf += data
        if not self._waiting:
            self._frames()

    def _frames(self) -> None:
        """Answer the whole frames in _buf until one is partial, or the answers not yet sent pass
        the bound (the rest wait, reading paused, for ``resume_writing``)."""
        buf = self._buf
        while self._transport is not None and len(buf) >= 4:
            if self._authed and self.account() > self._max_unsent:
                self._waiting = True
                self._transport.pause_reading()
                return
            (n,) = LEN.unpack_from(buf)
            limit = self._max if self._authed else MAX_HELLO_BYTES
            if n > limit:
                self._fail(grpc.StatusCode.RESOURCE_EXHAUSTED, f"frame of {n} bytes over the limit of {limit}")
                return
            if len(buf) < 4 + n:
                if not self._hold(4 + n):
                    self._fail(grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"a frame of {n} bytes: the server's memory budget has no room for it")
                return
            payload = bytes(buf[4 : 4 + n])
            del buf[: 4 + n]
            self._hold(0)
            if self._authed:
                self._answer(payload)
            elif hmac.compare_digest(payload, self._hello):
                self._authed = True
                self._transport.write(frame(b"", OK))
            else:
                self._fail(grpc.StatusCode.UNAUTHENTICATED, "wrong hello or secret")

    def _answer(self, raw: bytes) -> None:
        if self._has_room is not None and self._unsent and not self._has_room():
            # (answers still unsent, the budget spent: this one would be more of what it cannot hold)
            self._fail(grpc.StatusCode.RESOURCE_EXHAUSTED, "the server's memory budget is spent (answers not yet "
                                                           "read included): read the answers, then send again")
            return
        t0 = time.perf_counter()
        try:
            out = self._sync(raw, self._cache)
        except DgdsError as e:
            self._observe("SyncLane", time.perf_counter() - t0, False)
            code, _ = self._status_of(e)
            self._fail(code, str(e))
            return
        self._observe("SyncLane", time.perf_counter() - t0, True)
        self._transport.write(frame(out if type(out) is bytes else out.SerializeToString(), OK))
        self.account()
