"""Seer's context-aware scheduling (Algorithm 2 of the paper).

Responses of one group have strongly correlated lengths, so the first finished response of a
group predicts the rest. One probe request per group runs first, shortest-generated first, so
that short groups reveal their length quickly; every other request is ordered by its group's
estimate L_g, longest first (approximate longest-first without knowing lengths). A group with
nothing finished is estimated at the maximum length, so an unknown group is never put behind
known short ones.

Among requests with the same estimate (every group is at the maximum until its probe finishes),
the one that has generated most goes first. Lengths are heavy-tailed, so the expected remaining
length of a request grows with what it has already generated: continuing it is the closer
approximation of longest-first, and it is what bounds the tail, whose length is the longest
request's decode time plus one re-admission per chunk. It also keeps the request's prefix hot
in its instance's prefix cache. (Fresh requests first put every continuation behind all
not-yet-started work, and the longest requests waited in the buffer at each chunk boundary.)

Multi-turn: a trajectory's length is its tokens (the model's and the observations') and its
turns, each of which also waits for a tool and comes back through the buffer. A group's estimate
is then L_g + `turn_tokens` x T_g, T_g its most turns of a finished trajectory (raised to any
longer partial one): `turn_tokens` prices a turn boundary in decode tokens (default 0: tokens
only). Single-turn requests have no turns, so their order is L_g's whatever the setting.

Two options, off by default because they did not pay on the default long-tail workload
(docs/bench.md, "The default long-tail workload"):

* `early_packing` (the paper: "early on, many short requests are packed to fill memory; later,
  concurrency follows the KV budget so that requests are not preempted"): a chunk's KV
  reservation covers what the policy expects it to generate, not always the whole chunk. A
  request's first chunk, while nothing in its group has finished, reserves only its prompt (most
  responses are short, and the engine allocates KV as a request grows), so every request can
  start at once; once a sibling has finished, a request reserves up to its group's estimate L_g
  (at most the chunk); a request that has run a chunk while nothing in its group finished, or has
  outgrown its group's estimate, is the likely long one and reserves its whole chunk. The
  over-commit is bounded by the packed chunks in flight and ends with them; the engine queues or
  preempts (recompute) the excess meanwhile. Off by default: on the real benchmark the
  recomputation ate the gain (docs/bench-log.md, "Ideas measured on this workload").
* `continuations_first`: a request back from a chunk goes before every request not yet started,
  whatever the estimates, so that a within-group outlier (whose group looks short) never waits
  between its chunks behind new work. Off by default for `context`: it shortened the waits
  between chunks without a gain in throughput or tail time (docs/bench-log.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from seer.scheduler.config import DEFAULTS
from seer.scheduler.buffer import Request
from seer.scheduler.decisions import Decision, Dispatch, Wait
from seer.scheduler.placement import InstanceLoad, PlacementConfig
from seer.scheduler.policies.base import Policy
from seer.scheduler.policies.index import PriorityIndex


class ContextAware(Policy):
    name = "context"
    config_keys = ("starvation_after", "starvation_every", "early_packing", "continuations_first", "engine_priority")
    # A turn boundary in decode tokens (policy_args: {turn_tokens: N}); 0, tokens only, until a
    # real multi-turn comparison shows a value that pays (README, "Turns in the estimate").
    TURN_TOKENS = 0

    def __init__(
        self,
        chunk_size: int | None = DEFAULTS.chunk_size,
        placement: PlacementConfig | None = None,
        starvation_after: int = DEFAULTS.starvation_after,
        starvation_every: int = DEFAULTS.starvation_every,
        probe_index: int = 0,
        early_packing: bool = DEFAULTS.early_packing,
        continuations_first: bool = DEFAULTS.continuations_first,
        engine_priority: bool = DEFAULTS.engine_priority,
        turn_tokens: int = TURN_TOKENS,
    ) -> None:
        """Starvation guard: at most every `starvation_every`-th dispatch goes to the request that
        has waited longest, once it has been passed over by `starvation_after` dispatches.

        Serving every starving request at once would turn the policy into FIFO whenever many
        requests are ready (as at the start of an iteration); rationing the guard bounds every
        request's wait while keeping most dispatches longest-first.
        """
        super().__init__(chunk_size, placement)
        if starvation_after <= 0 or starvation_every <= 0:
            raise ValueError("starvation_after and starvation_every must be positive")
        if turn_tokens < 0:
            raise ValueError("turn_tokens must be >= 0")
        self.turn_tokens = turn_tokens
        self.starvation_after = starvation_after
        self.starvation_every = starvation_every
        self._last_guard = -starvation_every
        self.probe_index = probe_index
        self.early_packing = early_packing
        self.continuations_first = continuations_first
        self.ranks_engine = engine_priority
        self._probes = PriorityIndex()  # key: (generated,) -> shortest generated first
        # key: (fresh, -L_g, -generated) -> started requests first (continuations_first), then the
        # largest estimate, then most generated
        self._low = PriorityIndex()
        self._waiting = PriorityIndex()  # key: (dispatch count when it became ready,)
        self._low_members: dict[int, set[Request]] = {}
        self._longest_finished: dict[int, int] = {}
        self._longest_generated: dict[int, int] = {}
        self._most_turns: dict[int, int] = {}  # group -> most turns of any of its requests seen
        self._max_tokens: dict[int, int] = {}
        self._dispatches = 0
        self._by_reason: dict[str, int] = {}
        self._estimate_at_first_use: dict[int, tuple[int, bool]] = {}  # group -> (L_g, known)

    # -- the estimate ------------------------------------------------------------------------

    def estimate(self, group_id: int) -> int:
        """L_g: the longest finished response, raised to any longer partial one (conservative);
        the maximum length while nothing in the group has finished."""
        finished = self._longest_finished.get(group_id)
        if finished is None:
            return self._max_tokens[group_id]
        return max(finished, self._longest_generated.get(group_id, 0))

    def turns_estimate(self, group_id: int) -> int:
        """T_g: the most turns of a finished trajectory, raised to any partial one's (0 single-turn)."""
        return self._most_turns.get(group_id, 0)

    def priority(self, group_id: int) -> int:
        """The group's length for longest-first: L_g, plus its turns priced in tokens."""
        return self.estimate(group_id) + self.turn_tokens * self.turns_estimate(group_id)

    def reserve_tokens(self, req: Request, max_tokens: int) -> int:
        """Early packing: what the next chunk is expected to generate (see the module docstring)."""
        if not self.early_packing:
            return max_tokens
        g = req.group_id
        if g not in self._longest_finished:
            return 1 if req.generated == 0 else max_tokens  # 1: the prompt's blocks, nothing more
        remaining = self.estimate(g) - req.generated
        return max_tokens if remaining <= 0 else min(max_tokens, remaining)

    def engine_priority(self, req: Request) -> int:
        """With `engine_priority`: minus the tokens generated so far, so that a full engine preempts
        the request with the least progress (the cheapest to recompute and, lengths being heavy-tailed,
        the one with the least expected work left) and never a long request's continuation."""
        return -req.generated if self.ranks_engine else 0

    def is_probe(self, req: Request) -> bool:
        return req.sample_index == self.probe_index

    def _low_key(self, req: Request) -> tuple:
        if self.continuations_first:
            return (req.generated == 0, -self.priority(req.group_id), -req.generated)
        return (-self.priority(req.group_id), -req.generated)

    def _rekey_group(self, group_id: int) -> None:
        for member in self._low_members.get(group_id, ()):
            self._low.rekey(member, self._low_key(member))

    def _observe(self, req: Request) -> None:
        g = req.group_id
        self._max_tokens.setdefault(g, req.max_tokens)
        before = self.priority(g)
        self._longest_generated[g] = max(req.generated, self._longest_generated.get(g, 0))
        self._most_turns[g] = max(req.turns, self._most_turns.get(g, 0))
        if self.priority(g) != before:
            self._rekey_group(g)

    # -- events ------------------------------------------------------------------------------

    def on_ready(self, req: Request) -> None:
        self._observe(req)
        if self.is_probe(req):
            self._probes.add(req, (req.generated,))
        else:
            self._low.add(req, self._low_key(req))
            self._low_members.setdefault(req.group_id, set()).add(req)
        self._waiting.add(req, (self._dispatches,))

    def on_dispatched(self, decision: Dispatch) -> None:
        req = decision.request
        self._probes.discard(req)
        if self._low.discard(req):
            self._low_members[req.group_id].discard(req)
            if req.group_id not in self._estimate_at_first_use:
                known = req.group_id in self._longest_finished
                self._estimate_at_first_use[req.group_id] = (self.estimate(req.group_id), known)
        self._waiting.discard(req)
        if decision.reason == "starvation":
            self._last_guard = self._dispatches
        self._dispatches += 1
        self._by_reason[decision.reason] = self._by_reason.get(decision.reason, 0) + 1

    def on_finished(self, req: Request) -> None:
        self._observe(req)
        g = req.group_id
        before = self.priority(g) if g in self._longest_finished else None
        self._longest_finished[g] = max(req.generated, self._longest_finished.get(g, -1))
        if self.priority(g) != before:
            self._rekey_group(g)

    # -- the decision ------------------------------------------------------------------------

    def pick(self, loads: Sequence[InstanceLoad]) -> Decision:
        oldest = self._waiting.peek()
        if oldest is None:
            return Wait("idle")
        if (
            self._dispatches - self._last_guard >= self.starvation_every
            and self._dispatches - self._waiting.peek_key()[0] >= self.starvation_after
        ):
            return self.place(oldest, loads, "starvation")
        probe = self._probes.peek()
        if probe is not None:
            return self.place(probe, loads, "probe")
        return self.place(self._low.peek(), loads, "longest")

    def summary(self) -> dict:
        errors = []
        for g, (est, known) in self._estimate_at_first_use.items():
            final = self._longest_finished.get(g)
            if known and final:
                errors.append(abs(est - final) / final)
        return {
            "dispatches_by_reason": dict(self._by_reason),
            "groups_estimated_before_first_use": sum(k for _, k in self._estimate_at_first_use.values()),
            "groups": len(self._max_tokens),
            "mean_relative_estimate_error": sum(errors) / len(errors) if errors else None,
        }
