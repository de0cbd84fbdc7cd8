"""vLLM's own speculative-decoding counters, read from its Prometheus ``/metrics`` text.

Acceptance is judged by the engine's numbers, not the proposer's: ``drafts`` (verification steps
of a drafted request), ``draft_tokens`` and ``accepted_tokens``, summed over engines. A phase of a
benchmark or test takes the difference of two readings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COUNTER = re.compile(
    r"^vllm:spec_decode_num_(drafts|draft_tokens|accepted_tokens)_total(?:\{[^}]*\})?\s+(\S+)$"
)


@dataclass(frozen=True)
class SpecDecodeCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0

    def __sub__(self, other: SpecDecodeCounters) -> SpecDecodeCounters:
        return SpecDecodeCounters(self.drafts - other.drafts, self.draft_tokens - other.draft_tokens,
                                  self.accepted_tokens - other.accepted_tokens)

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens per verification step of drafted requests, bonus token included."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None


def spec_decode_counters(metrics_text: str) -> SpecDecodeCounters:
    found = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}
    for line in metrics_text.splitlines():
        m = _COUNTER.match(line)
        if m:
            found[m.group(1)] += float(m.group(2))
    return SpecDecodeCounters(**found)
