"""Typed records that cross the rollout boundary.

Every part of Seer (baseline dispatch, the divided-rollout scheduler, rewards, the trainer,
benchmarks) exchanges these records, so they are plain dataclasses with no behaviour beyond
derived properties.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

# Whose failure a failed sample's is (Sample.failure; `reward_error` says what happened). "system":
# Seer's own (an agent host that could not start, a fault of the gateway, an agent runner that
# crashed): the sample is no sample of the policy, so it keeps reward None and is never trained
# (RolloutBatch.train_groups). The others are the user's programs: the sample is the policy's, scored
# as its reward says (0), and trained as before.
FailureKind = Literal["system", "agent", "environment", "reward"]
SYSTEM_FAILURE: FailureKind = "system"


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings shared by every request of an iteration."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 1024
    seed: int | None = None
    ignore_eos: bool = False  # trace-driven benchmarks: generate exactly max_tokens


@dataclass(frozen=True)
class GenerateRequest:
    """One token-in request to one instance (a whole request, or one chunk of it)."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    logprobs: bool = True
    priority: int = 0  # engine priority (lower first, preempted last); nonzero needs a priority-scheduling engine
    # Strings the engine may stop at (multi-turn: the environment's; Seer cuts turns itself as
    # well, since a stop string can straddle two chunks, which no engine sees).
    stop: tuple[str, ...] = ()
    # vLLM's per-request cache salt: a salted request shares no cached or pooled KV with any other,
    # so the engine computes every token (routing replay recomputes missing routing this way).
    cache_salt: str | None = None


@dataclass(frozen=True)
class GenerateResult:
    """What an instance returned for one GenerateRequest."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS / stop token), "length" (max_tokens), "abort"
    cached_prefix_tokens: int  # prompt tokens the instance did not recompute
    prompt_tokens: int
    instance: str
    start_time: float
    finish_time: float
    # Routing replay: the experts of every token this chunk computed (an instance with routing
    # capture on), rows for positions routing_start, routing_start + 1, ... of prompt + tokens.
    routing: Routing | None = None
    routing_start: int = 0


@dataclass(frozen=True)
class PromptSpec:
    """One prompt of the dataset: a GRPO group is G samples of it."""

    index: int
    text: str
    prompt_ids: list[int]
    reference: dict  # whatever the reward function needs (answer, metadata); never shown to the model


@dataclass(frozen=True)
class Routing:
    """The experts each MoE layer chose for each token, as the rollout computed them (R3).

    Compact on purpose (docs/extending.md): ``layers x top_k`` bytes per token with uint8 ids.
    """

    layers: int  # MoE layers, in model order
    top_k: int
    dtype: str  # "uint8" when num_experts <= 256, else "uint16"
    data: bytes  # tokens x layers x top_k ids, row-major, prompt tokens first

    @property
    def num_tokens(self) -> int:
        width = self.layers * self.top_k * (1 if self.dtype == "uint8" else 2)
        return len(self.data) // width if width else 0


@dataclass(frozen=True)
class Branch:
    """Where a sample sits in an agent session's tree of calls (the gateway; docs/extending.md)."""

    session: str  # the session's id (one per agent run; G sessions form a group)
    path: tuple[int, ...]  # call indices from the session's root to this sample's last call
    parent: str | None = None  # request_id of the sample whose tokens this one extends, if any


@dataclass
class Sample:
    """One finished response of a group, with everything training and stats need."""

    group_id: int
    sample_index: int  # 0..G-1 within the group
    request_id: str
    prompt: PromptSpec
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    start_time: float
    finish_time: float
    instances: list[str]  # instance of each chunk, in order (one entry for whole-request dispatch)
    weight_version: int = 0
    response_text: str = ""
    reward: float | None = None
    reward_error: str | None = None
    # Multi-turn samples: response_ids holds every turn, the environment's tokens included; the
    # mask is 1 on tokens the policy generated (trained on) and 0 on the environment's. None: all 1.
    loss_mask: list[int] | None = None
    turns: int = 1
    # The one extension the model, gateway and trainer work share (docs/extending.md).
    routing: Routing | None = None  # None: a dense model, or routing replay off
    branch: Branch | None = None  # None: one trajectory per sample (single-turn, Environment)
    failure: FailureKind | None = None  # whose failure `reward_error` is (FailureKind); None: none, or not a failure

    @property
    def num_tokens(self) -> int:
        return len(self.response_ids)

    @property
    def session(self) -> str:
        """What counts once in a group: an agent session (all its leaves), else the sample itself."""
        return self.branch.session if self.branch is not None else self.request_id


@dataclass(frozen=True)
class WeightsRef:
    """A weight version as the trainer publishes it and the fleet loads it into every instance.

    `uri` names where the weights are: a local HF safetensors directory (`file://` or a plain
    path) today; a fleet whose instances live on other machines resolves other schemes itself
    (a broadcast, an object store) without the loop knowing."""

    version: int
    uri: str
    format: str = "hf-safetensors"
    # When the instances do not share a filesystem with the trainer: the checkpoint's files
    # ({name: bytes}) in a store every node reaches (a Ray ObjectRef), and what each file must be
    # ((name, size, sha256) per file), checked on the instance's node before anything is applied.
    payload: object | None = None
    manifest: tuple[tuple[str, int, str], ...] = ()

    @staticmethod
    def manifest_of(files: dict[str, bytes]) -> tuple[tuple[str, int, str], ...]:
        import hashlib

        return tuple((name, len(data), hashlib.sha256(data).hexdigest()) for name, data in sorted(files.items()))

    @property
    def local_path(self) -> str | None:
        if self.uri.startswith("file://"):
            return self.uri[len("file://"):]
        return None if "://" in self.uri else self.uri


@dataclass
class InstanceStats:
    """Per-instance accounting over one iteration."""

    name: str
    busy_s: float = 0.0
    idle_s: float = 0.0
    output_tokens: int = 0
    preemptions: int = 0

    @property
    def idle_fraction(self) -> float:
        total = self.busy_s + self.idle_s
        return self.idle_s / total if total > 0 else 0.0


@dataclass
class IterationStats:
    """What an iteration's rollout costs: the numbers Seer is judged on."""

    iteration: int
    policy: str
    wall_s: float
    output_tokens: int
    tokens_per_s: float
    tail_s: float  # time spent only on the last 10% of requests to finish
    num_samples: int
    preemptions: int
    instances: list[InstanceStats] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class InstanceDrop:
    """An instance a rollout dropped mid-run: it failed or hung, and its chunks finished elsewhere."""

    instance: str
    reason: str
    at_s: float  # seconds after the rollout started


@dataclass
class RolloutBatch:
    """All samples of one iteration, grouped, plus the iteration's stats."""

    samples: list[Sample]
    stats: IterationStats
    # The rollout's raw timeline, for the iteration's trace (seer.watch.trace), on the driver's
    # monotonic clock: the scheduler's chunk events (seer.scheduler.events.ChunkEvent), the
    # instances' telemetry samples and named phases (name, start, end). Empty if a rollout keeps none.
    chunks: list = field(default_factory=list)
    telemetry: list[Telemetry] = field(default_factory=list)
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    env_waits: list = field(default_factory=list)  # multi-turn: seer.scheduler.events.EnvWait, tool waits
    # Instances the rollout gave up on (their chunks finished elsewhere): the loop hands them to the
    # fleet, which drops them for good, and the iteration's record lists them.
    dropped: list[InstanceDrop] = field(default_factory=list)

    def groups(self) -> dict[int, list[Sample]]:
        out: dict[int, list[Sample]] = {}
        for s in sorted(self.samples, key=lambda s: (s.group_id, s.sample_index)):
            out.setdefault(s.group_id, []).append(s)
        return out

    def train_groups(self) -> list[list[Sample]]:
        """The groups the trainer learns from: a system failure's samples left out (they are not the
        policy's, so neither their tokens nor their reward may move it, nor the group's baseline), and
        a group that lost some and kept fewer than 2 sessions dropped (no baseline to compare with)."""
        out = []
        for group in self.groups().values():
            kept = [s for s in group if s.failure != SYSTEM_FAILURE]
            if len(kept) == len(group) or len({s.session for s in kept}) >= 2:
                out.append(kept)
        return out

@dataclass(frozen=True)
class SpecDecodeCounters:
    """vLLM's speculative-decoding counters (summed over engines), or the difference of two readings.

    ``drafts``: verification steps of requests that had a draft; ``draft_tokens`` and
    ``accepted_tokens``: tokens proposed and kept. A phase of a run is ``after - before``.
    """

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0

    def __add__(self, other: SpecDecodeCounters) -> SpecDecodeCounters:
        return SpecDecodeCounters(self.drafts + other.drafts, self.draft_tokens + other.draft_tokens,
                                  self.accepted_tokens + other.accepted_tokens)

    def __sub__(self, other: SpecDecodeCounters) -> SpecDecodeCounters:
        return SpecDecodeCounters(self.drafts - other.drafts, self.draft_tokens - other.draft_tokens,
                                  self.accepted_tokens - other.accepted_tokens)

    @property
    def mean_acceptance_length(self) -> float | None:
        """Mean tokens per verification step of drafted requests, 1 + accepted / drafts (the bonus
        token included); None without drafts."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        """Share of drafted tokens accepted; None without drafted tokens."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens > 0 else None


@dataclass(frozen=True)
class Telemetry:
    """A snapshot of one instance's load, as its Prometheus /metrics reports it."""

    instance: str
    time: float
    kv_usage: float  # fraction of KV blocks in use, 0..1
    kv_capacity_tokens: int  # total KV slots (blocks * block size); 0 when unknown
    num_running: int
    num_waiting: int
    preemptions_total: int
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    external_prefix_cache_queries: int = 0  # KV-connector (pool) lookups
    external_prefix_cache_hits: int = 0
    block_size: int = 0  # tokens per KV block (vLLM allocates whole blocks); 0 when unknown

    @property
    def spec(self) -> SpecDecodeCounters:
        return SpecDecodeCounters(self.spec_num_drafts, self.spec_num_draft_tokens, self.spec_num_accepted_tokens)


@runtime_checkable
class InstanceBackend(Protocol):
    """A generation engine that takes token ids in and gives token ids out."""

    name: str

    async def generate(self, req: GenerateRequest) -> GenerateResult: ...

    async def abort(self, request_id: str) -> None: ...

    async def telemetry(self) -> Telemetry: ...


class LaunchSpec(Protocol):
    """What the KV pool and the DGDS read of an instance's launch record (seer.fleet.InstanceSpec)
    when they add their flags and environment to it; they return a copy via dataclasses.replace."""

    name: str
    model: str
    host: str
    port: int
    dtype: str
    extra_args: tuple[str, ...]
    env: dict[str, str]
