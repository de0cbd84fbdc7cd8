"""vLLM's own speculative-decoding counters, read from its Prometheus ``/metrics`` text.

Acceptance is judged by the engine's numbers, not the proposer's: ``drafts`` (verification steps
of a drafted request), ``draft_tokens`` and ``accepted_tokens``, summed over engines. A phase of a
benchmark or test takes the difference of two readings (``seer.types.SpecDecodeCounters``).
"""

from __future__ import annotations

from seer.procs.prometheus import parse_prometheus
from seer.types import SpecDecodeCounters

_COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
}


def spec_decode_counters(metrics_text: str) -> SpecDecodeCounters:
    found = dict.fromkeys(_COUNTERS.values(), 0.0)
    for name, _, value in parse_prometheus(metrics_text, ("vllm:spec_decode_num_",)):
        field = _COUNTERS.get(name)
        if field is not None:
            found[field] += value
    return SpecDecodeCounters(**found)
