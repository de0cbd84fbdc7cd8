"""The client's end of the sync lane (the server's, and the framing: seer/dgds/server/lane.py): one
blocking connection that DraftClient's background thread sends its Sync messages on."""

from __future__ import annotations

import socket

import grpc

from seer.dgds.wire import HELLO, LEN, OK, frame

_CODES = {c.value[0]: c for c in grpc.StatusCode}


class LaneError(grpc.RpcError):
    """A lane failure, shaped as the gRPC errors DraftClient already handles."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self):
        return ()


class LaneClient:
    """A blocking client connection (DraftClient's background thread): ``exchange`` sends one
    serialized SyncRequest and returns the serialized SyncResponse; LaneError on any failure,
    after which the connection is closed."""

    def __init__(self, host: str, port: int, token: str | None, timeout_s: float, max_message_bytes: int):
        self._max = max_message_bytes
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as e:
            raise LaneError(grpc.StatusCode.UNAVAILABLE, f"sync lane {host}:{port}: {e}") from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._io(lambda: self._sock.sendall(frame(HELLO + (token or "").encode())), timeout_s)
        self._read_status(timeout_s)

    def _io(self, fn, timeout_s: float):
        try:
            self._sock.settimeout(timeout_s)
            return fn()
        except socket.timeout:
            self.close()
            raise LaneError(grpc.StatusCode.DEADLINE_EXCEEDED, "sync lane: no answer in time") from None
        except OSError as e:
            self.close()
            raise LaneError(grpc.StatusCode.UNAVAILABLE, f"sync lane: {e}") from None

    def _recv_exactly(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self._sock.recv(min(n - len(out), 1 << 20))
            if not chunk:
                raise ConnectionResetError("the server closed the sync lane")
            out += chunk
        return bytes(out)

    def _read_status(self, timeout_s: float) -> bytes:
        def read() -> bytes:
            (n,) = LEN.unpack(self._recv_exactly(4))
            if n < 1 or n > self._max + 1:
                raise ConnectionResetError(f"sync lane: a frame of {n} bytes")
            return self._recv_exactly(n)

        data = self._io(read, timeout_s)
        if data[0] != OK:
            self.close()
            raise LaneError(_CODES.get(data[0], grpc.StatusCode.UNKNOWN), data[1:].decode(errors="replace"))
        return data[1:]

    def exchange(self, raw: bytes, timeout_s: float) -> bytes:
        self._io(lambda: self._sock.sendall(frame(raw)), timeout_s)
        return self._read_status(timeout_s)

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
