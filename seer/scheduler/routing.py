"""Routing replay in the driver: a sample's routing joined from the chunks that computed its tokens.

An engine returns, with each chunk, the experts of the tokens that chunk computed
(`GenerateResult.routing`, rows from position `routing_start`); tokens whose KV it loaded (its
own prefix cache, the KV pool, a group-mate's prompt) have no row there. The ledger keeps, for
one rollout:

* each request's own rows, by position (a chunk's rows join the request's, whatever instance ran
  it);
* every computed row under the hash of its token prefix. Equal prefixes have equal KV, so the
  token an engine loaded instead of computing has its row under that key, from the chunk that did
  compute it: the group-mate that prefilled the shared prompt, the instance that held the prefix
  of a chunk that moved through the pool, another request sharing a template prefix.

A sample's routing (one row per prompt + response token, `seer.types.Routing`) takes its own row
for a position first (the computation whose KV its later tokens attended to), else the shared one.
What is still missing once the rollout's chunks are all back (the chunk that computed it died with
its instance, or the KV came from an earlier rollout of the same weights) is recomputed: the driver
sends the prefix again with a cache salt, so the engine computes every token
(`missing_prefix` / `add_recomputed`). A sample whose routing stays incomplete fails the rollout.

The last token of a response is never fed back to the engine, so no chunk computes it; its row
only shapes the logits after the last token, which no loss reads. It holds experts 0..top_k-1 of
every layer (counted as `last_token_filler`); a multi-turn observation and every earlier token has
a computed row.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from seer.types import GenerateResult, Routing


class RoutingIncomplete(RuntimeError):
    """A sample's routing could not be completed (recompute failed too): never trained misaligned."""


@dataclass(frozen=True)
class _Header:
    layers: int
    top_k: int
    dtype: str


class RoutingLedger:
    """The rows one rollout's chunks returned, by request and by token prefix."""

    def __init__(self) -> None:
        self.header: _Header | None = None
        self._own: dict[str, list[tuple[int, np.ndarray]]] = {}
        self._recomputed: dict[str, tuple[int, np.ndarray]] = {}
        self._shared: dict[int, tuple[np.ndarray, int]] = {}
        self._hashes: dict[str, list[int]] = {}
        self.counts: Counter = Counter()

    # ---- chunks coming back -----------------------------------------------------------------
    def record(self, request_id: str, tokens: list[int], prompt_len: int, kept: int, result: GenerateResult) -> None:
        """A chunk of `request_id` came back: its prompt was `tokens[:prompt_len]`, and `kept` of its
        generated tokens were kept (`tokens` holds the request's tokens after them). Rows of tokens
        the request did not keep (a multi-turn cut, a length cap) and of the last kept token when the
        engine never fed it back are dropped: their positions hold other tokens later."""
        n = len(result.token_ids)
        if result.routing is None:
            if n:
                self.counts["chunks_without_routing"] += 1
            return
        rows = self._rows(result.routing)
        start = result.routing_start
        end = min(start + len(rows), prompt_len + min(kept, max(n - 1, 0)), len(tokens))
        if end <= start:
            return
        rows = rows[: end - start]
        self._own.setdefault(request_id, []).append((start, rows))
        hashes = self._prefix_hashes(request_id, tokens, end)
        shared = self._shared
        for i in range(end - start):
            key = hashes[start + i]
            prev = shared.get(key)
            if prev is None:
                shared[key] = (rows, i)
            elif not np.array_equal(prev[0][prev[1]], rows[i]):
                self.counts["shared_rows_differing"] += 1  # two computations of one token disagreed
        self.counts["rows_recorded"] += end - start
        self.counts["prefix_rows_loaded"] += start  # positions the engine did not compute

    def _rows(self, routing: Routing) -> np.ndarray:
        header = _Header(routing.layers, routing.top_k, routing.dtype)
        if self.header is None:
            self.header = header
        elif header != self.header:
            raise RoutingIncomplete(f"instances disagree on the routing layout: {header} vs {self.header}")
        return np.frombuffer(routing.data, np.dtype(routing.dtype)).reshape(-1, routing.layers, routing.top_k)

    def _prefix_hashes(self, request_id: str, tokens: list[int], upto: int) -> list[int]:
        """hashes[p] identifies tokens[:p + 1] (kept per request, extended as its tokens grow)."""
        hs = self._hashes.setdefault(request_id, [])
        h = hs[-1] if hs else 0
        for t in tokens[len(hs): upto]:
            h = hash((h, t))
            hs.append(h)
        return hs

    # ---- a sample's routing -----------------------------------------------------------------
    def assemble(self, request_id: str, tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(rows [T, layers, top_k], have [T]) for the request's `tokens`: own rows first, then rows
        of the same prefix computed elsewhere, then recomputed ones."""
        h = self.header
        if h is None:
            raise RoutingIncomplete("routing replay is on but no chunk returned routing")
        T = len(tokens)
        out = np.zeros((T, h.layers, h.top_k), np.dtype(h.dtype))
        have = np.zeros(T, bool)
        for start, rows in self._own.get(request_id, ()):
            idx = np.arange(start, min(start + len(rows), T))
            fresh = ~have[idx]
            out[idx[fresh]] = rows[: len(idx)][fresh]
            have[idx] = True
        own = int(have.sum())
        hashes = self._prefix_hashes(request_id, tokens, T)
        for p in np.flatnonzero(~have):
            hit = self._shared.get(hashes[p])
            if hit is not None:
                out[p] = hit[0][hit[1]]
                have[p] = True
        shared = int(have.sum()) - own
        rec = self._recomputed.get(request_id)
        if rec is not None:
            start, rows = rec
            for p in np.flatnonzero(~have):
                if start <= p < start + len(rows):
                    out[p] = rows[p - start]
                    have[p] = True
        return out, have

    def missing_prefix(self, request_id: str, tokens: list[int]) -> int:
        """How many leading tokens must be recomputed to complete the routing (0: none); the last
        token is not counted (see the module's docstring)."""
        _, have = self.assemble(request_id, tokens)
        gaps = np.flatnonzero(~have[:-1])
        return int(gaps[-1]) + 1 if len(gaps) else 0

    def add_recomputed(self, request_id: str, result: GenerateResult, prefix_len: int) -> None:
        """The rows of a salted recompute of the request's first `prefix_len` tokens."""
        if result.routing is None:
            raise RoutingIncomplete(f"{request_id}: the recompute of its routing returned none")
        rows = self._rows(result.routing)[: max(prefix_len - result.routing_start, 0)]
        self._recomputed[request_id] = (result.routing_start, rows)
        self.counts["recompute_requests"] += 1

    def routing_of(self, request_id: str, tokens: list[int]) -> Routing:
        """The sample's Routing, one row per token; raises if any but the last is missing."""
        rows, have = self.assemble(request_id, tokens)
        gaps = np.flatnonzero(~have[:-1])
        if len(gaps):
            raise RoutingIncomplete(f"{request_id}: no routing for {len(gaps)} of {len(tokens)} tokens "
                                    f"(first at position {int(gaps[0])}), even after recomputing")
        if len(tokens) and not have[-1]:
            rows[-1] = np.arange(self.header.top_k, dtype=rows.dtype)
            self.counts["last_token_filler"] += 1
        self.counts["sample_rows"] += len(tokens)
        return Routing(self.header.layers, self.header.top_k, self.header.dtype, rows.tobytes())

    def summary(self) -> dict:
        """The rollout's routing counters (what the iteration's record keeps)."""
        out = dict(self.counts)
        if self.header is not None:
            width = self.header.layers * self.header.top_k * np.dtype(self.header.dtype).itemsize
            out.update(bytes_per_token=width, index_entries=len(self._shared))
        return out


__all__ = ["RoutingIncomplete", "RoutingLedger"]
