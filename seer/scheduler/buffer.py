"""The request buffer: the scheduler's global view of every request of one iteration.

It holds what the real system knows and nothing more: prompts, tokens and logprobs received
so far, and where each chunk ran. True output lengths are not here on purpose; only the
oracle policy gets them, from a previous run, through its own constructor.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from seer.request_ids import request_id
from seer.types import PromptSpec


class RequestStatus(enum.Enum):
    READY = "ready"  # waiting in the buffer for its next chunk
    RUNNING = "running"  # one chunk in flight on one instance
    FINISHED = "finished"  # EOS or the length limit reached
    ENV = "env"  # multi-turn: waiting for its environment's observation; holds no instance slot


@dataclass(eq=False)
class Request:
    """One sample of a group, generated chunk by chunk."""

    request_id: str
    group_id: int
    sample_index: int
    prompt_ids: list[int]
    max_tokens: int
    seq: int  # global arrival order: the stable tie-break of every policy
    status: RequestStatus = RequestStatus.READY
    generated_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    instances: list[str] = field(default_factory=list)  # one entry per dispatched chunk
    finish_reason: str | None = None
    first_start: float | None = None
    last_finish: float | None = None
    failures: int = 0
    turns: int = 0  # multi-turn: model turns ended so far (the policies' view of TurnState.turns)

    @property
    def generated(self) -> int:
        return len(self.generated_ids)

    @property
    def context_len(self) -> int:
        return len(self.prompt_ids) + len(self.generated_ids)

    @property
    def chunks(self) -> int:
        return len(self.instances)

    @property
    def last_instance(self) -> str | None:
        """Where this request's KV was last written, i.e. the instance holding its prefix."""
        return self.instances[-1] if self.instances else None

    def next_prompt(self) -> list[int]:
        """The next chunk continues from the original prompt plus everything generated so far."""
        return [*self.prompt_ids, *self.generated_ids]


@dataclass
class TurnState:
    """A multi-turn request's turns (kept by the buffer beside the Request): its generated_ids hold
    every turn's tokens and the observations between them."""

    loss_mask: list[int] = field(default_factory=list)  # 1 on the model's tokens (one logprob each), 0 on observations
    turn_start: int = 0  # index in generated_ids where the current turn began
    turns: int = 0  # model turns ended so far


@dataclass(eq=False)
class Group:
    """G requests sharing one prompt: the unit GRPO trains on, not the unit we schedule."""

    group_id: int
    prompt: PromptSpec
    requests: list[Request]


class RequestBuffer:
    """All groups and requests of one iteration, and their state transitions."""

    def __init__(
        self,
        prompts: Sequence[PromptSpec],
        group_size: int,
        max_tokens: int,
        request_id_prefix: str = "",
        multi_turn: bool = False,
    ) -> None:
        """`multi_turn`: requests start waiting for their environment (ENV) and carry a loss mask."""
        if group_size <= 0 or max_tokens <= 0:
            raise ValueError("group_size and max_tokens must be positive")
        self.groups: list[Group] = []
        self.requests: dict[str, Request] = {}
        self.turn_state: dict[str, TurnState] = {}  # multi-turn only
        seq = 0
        for gid, prompt in enumerate(prompts):
            reqs = []
            for k in range(group_size):
                rid = request_id(gid, k, request_id_prefix)
                if rid in self.requests:
                    raise ValueError(f"duplicate request id {rid}")
                req = Request(rid, gid, k, list(prompt.prompt_ids), max_tokens, seq)
                if multi_turn:
                    req.status = RequestStatus.ENV
                    self.turn_state[rid] = TurnState()
                seq += 1
                self.requests[rid] = req
                reqs.append(req)
            self.groups.append(Group(gid, prompt, reqs))
        self.num_running = 0
        self.num_finished = 0

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def done(self) -> bool:
        return self.num_finished == len(self.requests)

    def ready(self) -> list[Request]:
        """Requests waiting for a chunk, in arrival order (a policy's initial queue)."""
        return [r for r in self.requests.values() if r.status is RequestStatus.READY]

    def begin_chunk(self, req: Request, instance: str, now: float) -> int:
        """Mark `req` in flight on `instance`; returns the chunk index."""
        if req.status is not RequestStatus.READY:
            raise ValueError(f"{req.request_id} is {req.status.value}, not ready")
        req.status = RequestStatus.RUNNING
        req.instances.append(instance)
        if req.first_start is None:
            req.first_start = now
        self.num_running += 1
        return len(req.instances) - 1

    def end_chunk(
        self,
        req: Request,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        finish_reason: str,
        now: float,
    ) -> bool:
        """Append a chunk's output; True when the request is finished.

        Finished means EOS ("stop") or the request's own length limit. A chunk that hit only
        its chunk limit, or was aborted, sends the request back to the buffer for another chunk.
        """
        if req.status is not RequestStatus.RUNNING:
            raise ValueError(f"{req.request_id} is {req.status.value}, not running")
        if len(logprobs) not in (0, len(token_ids)):
            raise ValueError(f"{req.request_id}: {len(token_ids)} tokens but {len(logprobs)} logprobs")
        room = req.max_tokens - req.generated
        token_ids = list(token_ids)[:room]
        req.generated_ids.extend(token_ids)
        # Engines may omit logprobs; keep the lists aligned so training can tell.
        req.logprobs.extend(list(logprobs)[:room] if logprobs else [float("nan")] * len(token_ids))
        req.last_finish = now
        self.num_running -= 1
        finished = (
            finish_reason == "stop"
            or req.generated >= req.max_tokens
            # An engine that stops without tokens and without aborting will do it again: stop here
            # rather than loop forever.
            or (not token_ids and finish_reason != "abort")
        )
        if finished:
            req.status = RequestStatus.FINISHED
            req.finish_reason = finish_reason if finish_reason != "abort" else "length"
            self.num_finished += 1
        else:
            req.status = RequestStatus.READY
        return finished

    def requeue(self, req: Request, now: float, count_failure: bool = True) -> None:
        """A chunk failed without output: the request goes back unchanged (its chunk slot freed)."""
        if req.status is not RequestStatus.RUNNING:
            raise ValueError(f"{req.request_id} is {req.status.value}, not running")
        req.instances.pop()
        if count_failure:
            req.failures += 1
        req.status = RequestStatus.READY
        self.num_running -= 1

    # ---- multi-turn ---------------------------------------------------------------------------

    def end_turn_chunk(self, req: Request, token_ids: Sequence[int], logprobs: Sequence[float], now: float,
                       turn_over: bool) -> None:
        """Append a multi-turn chunk's model tokens (already cut to the turn); the request goes back
        to the buffer, or waits for its environment when its turn is over."""
        ts = self.turn_state.get(req.request_id)
        if req.status is not RequestStatus.RUNNING or ts is None:
            raise ValueError(f"{req.request_id} is {req.status.value}, not a running multi-turn request")
        if len(logprobs) not in (0, len(token_ids)):
            raise ValueError(f"{req.request_id}: {len(token_ids)} tokens but {len(logprobs)} logprobs")
        req.generated_ids.extend(token_ids)
        req.logprobs.extend(list(logprobs) if logprobs else [float("nan")] * len(token_ids))
        ts.loss_mask.extend([1] * len(token_ids))
        req.last_finish = now
        self.num_running -= 1
        if turn_over:
            ts.turns += 1
            req.turns = ts.turns
            req.status = RequestStatus.ENV
        else:
            req.status = RequestStatus.READY

    def add_observation(self, req: Request, token_ids: Sequence[int]) -> None:
        """The environment's tokens after a turn (never trained on); the next turn starts after them."""
        if req.status is not RequestStatus.ENV:
            raise ValueError(f"{req.request_id} is {req.status.value}, not waiting for its environment")
        if req.generated + len(token_ids) >= req.max_tokens:
            raise ValueError(f"{req.request_id}: an observation of {len(token_ids)} tokens leaves no room "
                             f"within max_tokens={req.max_tokens}")
        ts = self.turn_state[req.request_id]
        req.generated_ids.extend(token_ids)
        ts.loss_mask.extend([0] * len(token_ids))
        ts.turn_start = len(req.generated_ids)
        req.status = RequestStatus.READY

    def rewind(self, req: Request, keep: int) -> None:
        """A multi-turn request waiting for its environment goes back to an earlier point of its
        trajectory (the gateway's branches): its first `keep` generated tokens stay, with their
        loss mask and log-probs; the rest is dropped (the rollout kept a copy if it trains on it)."""
        ts = self.turn_state.get(req.request_id)
        if req.status is not RequestStatus.ENV or ts is None:
            raise ValueError(f"{req.request_id} is {req.status.value}, not waiting for its environment")
        if not 0 <= keep <= req.generated:
            raise ValueError(f"{req.request_id}: cannot rewind to {keep} of {req.generated} generated tokens")
        del req.logprobs[sum(ts.loss_mask[:keep]):]
        del req.generated_ids[keep:]
        del ts.loss_mask[keep:]
        ts.turn_start = min(ts.turn_start, keep)

    def finish(self, req: Request, finish_reason: str) -> None:
        """A multi-turn request is done (its environment said so, or a limit ended it)."""
        if req.status is not RequestStatus.ENV:
            raise ValueError(f"{req.request_id} is {req.status.value}, not waiting for its environment")
        req.status = RequestStatus.FINISHED
        req.finish_reason = finish_reason
        self.num_finished += 1
