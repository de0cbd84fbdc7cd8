"""Oracle longest-first: the upper bound context-aware scheduling is compared to (benchmarks only).

It is the only policy given true output lengths, and it gets them from a previous run through
its constructor; the request buffer never carries them, so no other policy can read them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from seer.types import Sample
from seer.scheduler.config import DEFAULTS
from seer.scheduler.buffer import Request
from seer.scheduler.decisions import Decision, Dispatch, Wait
from seer.scheduler.placement import InstanceLoad, PlacementConfig
from seer.scheduler.policies.base import Policy
from seer.scheduler.policies.index import PriorityIndex

LengthKey = tuple[int, int]  # (group_id, sample_index): stable across runs of the same prompts


def true_lengths_from_samples(samples: Iterable[Sample]) -> dict[LengthKey, int]:
    """The length table a previous run of the same workload yields."""
    return {(s.group_id, s.sample_index): s.num_tokens for s in samples}


class OracleLongestFirst(Policy):
    name = "oracle_lfs"
    reads_true_lengths = True

    def __init__(
        self,
        true_lengths: Mapping[LengthKey, int],
        chunk_size: int | None = DEFAULTS.chunk_size,
        placement: PlacementConfig | None = None,
    ) -> None:
        super().__init__(chunk_size, placement)
        self._true_lengths = dict(true_lengths)
        self._ready = PriorityIndex()  # key: (-remaining true length,)

    def true_length(self, req: Request) -> int:
        try:
            return self._true_lengths[(req.group_id, req.sample_index)]
        except KeyError:
            raise KeyError(
                f"oracle_lfs has no true length for group {req.group_id} sample {req.sample_index}; "
                "run the same workload once without the oracle first"
            ) from None

    def reserve_tokens(self, req: Request, max_tokens: int) -> int:
        """Exactly what the chunk will generate: the oracle's KV reservations pack perfectly."""
        return min(max_tokens, self.true_length(req) - req.generated)

    def on_ready(self, req: Request) -> None:
        self._ready.add(req, (-(self.true_length(req) - req.generated),))

    def on_dispatched(self, decision: Dispatch) -> None:
        self._ready.discard(decision.request)

    def pick(self, loads: Sequence[InstanceLoad]) -> Decision:
        req = self._ready.peek()
        if req is None:
            return Wait("idle")
        return self.place(req, loads, "oracle")
