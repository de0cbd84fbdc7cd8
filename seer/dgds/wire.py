"""What the draft server and its client share beyond ``seer.dgds.proto``: the packed uint32 arrays of
a Sync message, the sync lane's framing, the call metadata (the secret, the keys of lost groups)
and the secret's environment variable. Nothing heavy: ``seer.config`` reaches it through
``seer.dgds.server.config``, and the client inside vLLM imports it instead of server modules.
"""

from __future__ import annotations

import struct
import sys
from array import array

# The run's DGDS secret: read by `seer-dgds serve`, DraftClient (and so the proposer inside vLLM) and
# seer-run joining a server at dgds.address. An environment variable only: never a config field or
# a command-line argument (any local user can read those in /proc/<pid>/cmdline).
TOKEN_ENV = "SEER_DGDS_TOKEN"

# ---- call metadata ---------------------------------------------------------------------------

AUTH_KEY = "authorization"  # metadata key; value "Bearer <token>"
UNKNOWN_GROUP_KEY = "seer-dgds-unknown-group"  # trailing metadata of NOT_FOUND: the groups it did not know
ENDED_GROUP_KEY = "seer-dgds-ended-group"  # subset of the unknown ones: finished or expired


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries ``token`` (none without one)."""
    return ((AUTH_KEY, f"Bearer {token}"),) if token else ()


# ---- packed uint32 arrays (SyncRequest.tokens, SyncResponse.segments / tokens) -------------------


def u32(values=()) -> array:
    """A flat uint32 array (the packed wire format's token and segment arrays)."""
    return array("I", values)


if u32().itemsize != 4:  # pragma: no cover - every platform CPython supports has a 4-byte C int
    raise ImportError("seer.dgds needs a 4-byte array('I')")
LITTLE_ENDIAN = sys.byteorder == "little"


def unpack_u32(data: bytes) -> array:
    """Little-endian uint32 bytes (the wire format) as an array; ValueError if not whole uint32s."""
    if len(data) % 4:
        raise ValueError("packed uint32 field of a length that is not a multiple of 4")
    out = u32()
    out.frombytes(data)
    if not LITTLE_ENDIAN:  # pragma: no cover
        out.byteswap()
    return out


def pack_u32(values: array) -> bytes:
    """An array('I') as little-endian bytes."""
    if LITTLE_ENDIAN:
        return values.tobytes()
    swapped = array("I", values)  # pragma: no cover
    swapped.byteswap()  # pragma: no cover
    return swapped.tobytes()  # pragma: no cover


# ---- the sync lane's framing (seer/dgds/server/lane.py) ------------------------------------------

HELLO = b"seer-dgds-lane/1 "  # a client's first frame: this, then the run's secret
LEN = struct.Struct("<I")
OK = 0  # the status byte of a good answer (else a grpc.StatusCode value)


def frame(payload: bytes, status: int | None = None) -> bytes:
    """One frame: the length, the status byte (server frames after the hello) and the payload."""
    head = b"" if status is None else bytes((status,))
    return LEN.pack(len(head) + len(payload)) + head + payload
