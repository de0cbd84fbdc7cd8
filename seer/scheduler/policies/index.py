"""A keyed priority set of requests whose keys change as they generate."""

from __future__ import annotations

from collections.abc import Iterator

from sortedcontainers import SortedList

from seer.scheduler.buffer import Request


class PriorityIndex:
    """Requests ordered by a policy's key (smallest first); re-keying is remove + add, O(log n).

    Entries are `(*key, seq)`, so requests themselves are never compared and ties go to the
    earlier request deterministically.
    """

    def __init__(self) -> None:
        self._entries: SortedList = SortedList()
        self._entry_of: dict[int, tuple] = {}
        self._request_of: dict[int, Request] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, req: Request) -> bool:
        return req.seq in self._entry_of

    def __iter__(self) -> Iterator[Request]:
        return (self._request_of[e[-1]] for e in self._entries)

    def add(self, req: Request, key: tuple) -> None:
        if req.seq in self._entry_of:
            raise ValueError(f"{req.request_id} already queued")
        entry = (*key, req.seq)
        self._entries.add(entry)
        self._entry_of[req.seq] = entry
        self._request_of[req.seq] = req

    def discard(self, req: Request) -> bool:
        entry = self._entry_of.pop(req.seq, None)
        if entry is None:
            return False
        self._entries.remove(entry)
        del self._request_of[req.seq]
        return True

    def rekey(self, req: Request, key: tuple) -> None:
        if self.discard(req):
            self.add(req, key)

    def peek(self) -> Request | None:
        return self._request_of[self._entries[0][-1]] if self._entries else None

    def peek_key(self) -> tuple | None:
        return self._entries[0][:-1] if self._entries else None
