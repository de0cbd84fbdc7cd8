"""Multi-turn requests on divided rollout: where a turn ends, and what the dispatcher hands out and takes back.

A turn is one stretch of model tokens between two environment observations. It may span several
chunks (each a separate engine request), so an engine cannot see a stop sequence that straddles
a chunk boundary: Seer matches the environment's stop sequences itself on the turn's tokens after
every chunk (`StopMatcher`), and drops what an engine generated past them. A request whose turn
ended holds no instance slot until the rollout feeds back its environment's answer
(`Dispatcher.resume`); its KV stays in the instances' prefix caches and the pool meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from seer.scheduler.buffer import Request


@dataclass(frozen=True)
class TurnCut:
    """A turn ends within the chunk just returned: keep its first `keep` tokens."""

    keep: int
    reason: str  # "stop_sequence", "eos", "turn_length"


@dataclass(frozen=True)
class TurnEnd:
    """A request waits for its environment: before its first turn (`turn` 0, no tokens), or after turn `turn`."""

    request: Request
    turn: int
    token_ids: tuple[int, ...]  # the model's tokens of this turn (empty for turn 0)
    reason: str  # "start", or the TurnCut's reason, or "length" (the request's token budget is spent)


@dataclass(frozen=True)
class TurnReply:
    """The environment's answer to a TurnEnd: tokens to append (trained on by no one), or the end."""

    observation_ids: tuple[int, ...] = ()
    done: bool = False
    finish_reason: str = "stop"  # recorded on the sample when done ("stop", "length", "error")
    # The gateway's branches (seer.rollout.gateway): keep only the first `rewind_to` generated tokens
    # (model and observation tokens alike) before appending the observation, so the request continues
    # from an earlier point of its trajectory. None: continue after everything generated so far.
    rewind_to: int | None = None


class TurnSplitter(Protocol):
    """Decides after every chunk of a multi-turn request whether its turn is over."""

    def stop_for(self, request_id: str) -> tuple[str, ...]:
        """Strings sent to engines with this request's chunks (a hint: the cut is this object's)."""
        ...

    def turn_limit(self, request_id: str) -> int | None:
        """The most model tokens this request's current turn may have (None: no limit but the request's)."""
        ...

    def cut(self, turn_ids: Sequence[int], new_ids: Sequence[int], finish_reason: str,
            request_id: str = "") -> TurnCut | None:
        """`turn_ids`: the turn's tokens before this chunk; `new_ids`: the chunk's. None: the turn goes on."""
        ...


class StopMatcher:
    """Ends a turn at the first of `stop` in its decoded text (across chunk boundaries), at EOS
    (an engine's "stop" with no stop sequence in sight), or after `max_turn_tokens` tokens."""

    def __init__(self, stop: Sequence[str], decode: Callable[[list[int]], str], max_turn_tokens: int | None = None):
        if any(not s for s in stop):
            raise ValueError("stop sequences must be non-empty strings")
        if max_turn_tokens is not None and max_turn_tokens < 1:
            raise ValueError(f"max_turn_tokens must be >= 1, got {max_turn_tokens}")
        self.stop = tuple(stop)
        self.decode = decode
        self.max_turn_tokens = max_turn_tokens

    def _first_stop_end(self, ids: list[int]) -> int | None:
        """The fewest tokens of `ids` whose text holds a stop sequence (None: none does)."""
        if not self.stop or not any(s in self.decode(ids) for s in self.stop):
            return None
        lo, hi = 1, len(ids)  # the smallest prefix that contains one: containment only grows
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in self.decode(ids[:mid]) for s in self.stop):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def stop_for(self, request_id: str) -> tuple[str, ...]:
        return self.stop

    def turn_limit(self, request_id: str) -> int | None:
        return self.max_turn_tokens

    def cut(self, turn_ids: Sequence[int], new_ids: Sequence[int], finish_reason: str,
            request_id: str = "") -> TurnCut | None:
        before = len(turn_ids)
        ids = [*turn_ids, *new_ids]
        limit = self.max_turn_tokens
        # a stop sequence may begin in the previous chunks; it cannot end there (that turn would be over)
        end = self._first_stop_end(ids)
        if end is not None and end > before:
            if limit is None or end <= limit:
                return TurnCut(end - before, "stop_sequence")
        if limit is not None and len(ids) >= limit:
            return TurnCut(limit - before, "turn_length")
        if finish_reason == "stop" or (not new_ids and finish_reason != "abort"):
            return TurnCut(len(new_ids), "eos")
        return None
