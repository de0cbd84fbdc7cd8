"""Typed records at the DGDS boundaries (client API, server, drafting)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass(frozen=True)
class DraftParams:
    """How to draft for one request (SuffixDecoding knobs, per request as in the paper's API).

    ``pattern_lookup_min/max`` bound the length of the context suffix matched in the tree;
    ``min_token_prob`` stops a path once its cumulative probability falls below it; ``top_k`` > 1
    asks for multi-path drafting (up to k distinct branches).
    """

    max_spec_tokens: int = 8
    pattern_lookup_min: int = 1
    pattern_lookup_max: int = 24
    top_k: int = 1
    min_token_prob: float = 0.1

    def problem(self) -> str | None:
        """Why these parameters are malformed, or None."""
        if self.max_spec_tokens < 0:
            return "max_spec_tokens must be >= 0"
        if self.pattern_lookup_min < 1:
            return "pattern_lookup_min must be >= 1"
        if self.pattern_lookup_max < self.pattern_lookup_min:
            return "pattern_lookup_max must be >= pattern_lookup_min"
        if self.top_k < 1:
            return "top_k must be >= 1"
        if not 0.0 <= self.min_token_prob <= 1.0:
            return "min_token_prob must be in [0, 1]"
        return None


@dataclass(frozen=True)
class SpeculateRow:
    """One request of a ``batch_speculate`` call: its ids and its full context (prompt + output)."""

    request_id: str
    group_id: str
    context: Sequence[int]
    params: DraftParams = DraftParams()


@dataclass(frozen=True)
class DraftPath:
    """One drafted branch. ``probs[i]`` is the cumulative probability of ``tokens[: i + 1]``
    (product of child count / parent count along the path); ``score`` = sum(probs), the expected
    number of accepted tokens under the tree's statistics."""

    tokens: tuple[int, ...]
    probs: tuple[float, ...]

    @property
    def score(self) -> float:
        return sum(self.probs)


@dataclass(frozen=True)
class Draft:
    """Drafts for one request: up to top_k paths, best first. Empty when nothing matched."""

    request_id: str
    paths: tuple[DraftPath, ...] = ()
    match_len: int = 0

    @property
    def tokens(self) -> tuple[int, ...]:
        """The best path's tokens (what a linear proposer feeds the verifier)."""
        return self.paths[0].tokens if self.paths else ()


@dataclass(frozen=True)
class Segment:
    """Tokens ``tokens`` of request ``request_id`` starting at position ``start`` (a log entry)."""

    request_id: str
    start: int
    tokens: tuple[int, ...] = field(default=())
