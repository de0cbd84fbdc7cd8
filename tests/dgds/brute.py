"""Brute-force references for the suffix tree and drafting (tests only)."""

from __future__ import annotations

from collections import Counter
from typing import Sequence


def substring_counts(seqs: Sequence[Sequence[int]], max_len: int) -> Counter:
    """Occurrences of every substring of length 1..max_len."""
    c: Counter = Counter()
    for s in seqs:
        for i in range(len(s)):
            for n in range(1, min(max_len, len(s) - i) + 1):
                c[tuple(s[i : i + n])] += 1
    return c


def occurrences(seqs: Sequence[Sequence[int]], pattern: Sequence[int]) -> int:
    p = list(pattern)
    return sum(1 for s in seqs for i in range(len(s) - len(p) + 1) if list(s[i : i + len(p)]) == p)


def continuations(seqs: Sequence[Sequence[int]], pattern: Sequence[int]) -> Counter:
    """Next-token counts after each occurrence of ``pattern``."""
    p = list(pattern)
    c: Counter = Counter()
    for s in seqs:
        for i in range(len(s) - len(p)):
            if list(s[i : i + len(p)]) == p:
                c[s[i + len(p)]] += 1
    return c
