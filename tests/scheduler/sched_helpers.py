"""Hand-built scheduler states and a deterministic in-process engine for the driver tests."""

from __future__ import annotations

import asyncio
import hashlib

from seer import request_ids
from seer.types import Telemetry
from seer.types import GenerateRequest, GenerateResult, PromptSpec
from seer.scheduler.buffer import Request, RequestStatus
from seer.scheduler.placement import InstanceLoad


def prompts(n: int, prompt_len: int = 4) -> list[PromptSpec]:
    return [PromptSpec(i, f"p{i}", [100 + i] * prompt_len, {}) for i in range(n)]


def request(group: int, index: int, *, generated: int = 0, max_tokens: int = 1000, seq: int | None = None,
            prompt_len: int = 4) -> Request:
    """A ready request as the buffer would hold it after `generated` tokens."""
    req = Request(request_ids.request_id(group, index), group, index, [1] * prompt_len, max_tokens,
                  seq if seq is not None else group * 100 + index)
    req.generated_ids = [7] * generated
    req.logprobs = [-0.1] * generated
    return req


def finished(req: Request, length: int) -> Request:
    req.generated_ids = [7] * length
    req.status = RequestStatus.FINISHED
    return req


def loads(*capacities: int, reserved: tuple[int, ...] = ()) -> list[InstanceLoad]:
    out = [InstanceLoad(f"i{k}", k, capacity_tokens=c) for k, c in enumerate(capacities)]
    for load, r in zip(out, reserved):
        load.reserved_tokens = r
        load.running = 1 if r else 0
    return out


def token_at(request_id: str, position: int) -> int:
    """The fake engine's output: a function of (request, absolute position) only, so a request
    generated in chunks on any instances must equal the same request generated in one go."""
    h = hashlib.blake2b(f"{request_id}/{position}".encode(), digest_size=4).digest()
    return 1000 + int.from_bytes(h, "little") % 5000


class FakeInstance:
    """An InstanceBackend that 'generates' deterministic tokens up to a hidden per-request length.

    It keeps a local prefix cache (request ids it has run), so cached_prefix_tokens shows whether
    a chunk stayed or moved. `fail_once` makes the first chunk with that id raise. After
    `fault_after` chunks started, the instance dies (`fault="dead"`: every call raises, chunks in
    flight included) or hangs (`fault="hung"`: every call blocks forever).
    """

    def __init__(self, name: str, lengths: dict[str, int], prompt_lens: dict[str, int],
                 capacity: int = 10_000, step_s: float = 0.0, fail_once: set[str] = frozenset(),
                 fault: str | None = None, fault_after: int = 0):
        self.name = name
        self.lengths = lengths  # request id -> length at which it emits EOS
        self.prompt_lens = prompt_lens
        self.capacity = capacity
        self.step_s = step_s
        self.fail_once = set(fail_once)
        self.seen: set[str] = set()
        self.requests: list[GenerateRequest] = []
        self.active_tokens = 0
        self.running = 0
        self.max_running = 0
        self.aborted: list[str] = []
        self.fault = fault
        self.fault_after = fault_after

    async def _check_fault(self) -> None:
        if self.fault is None or len(self.requests) <= self.fault_after:
            return
        if self.fault == "dead":
            raise ConnectionError(f"{self.name}: connection refused")
        await asyncio.Event().wait()  # hung: never answers

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        self.requests.append(req)
        await self._check_fault()
        if req.request_id in self.fail_once:
            self.fail_once.discard(req.request_id)
            raise ConnectionError(f"{self.name} dropped {req.request_id}")
        base = request_ids.parse(req.request_id).request  # the whole request of a chunk (or retry)
        done = len(req.prompt_ids) - self.prompt_lens[base]
        n = min(req.max_tokens, self.lengths[base] - done)
        cached = len(req.prompt_ids) if base in self.seen else 0
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.active_tokens += len(req.prompt_ids) + n
        try:
            await asyncio.sleep(self.step_s * n)
            await self._check_fault()  # died or hung while this chunk was running
        finally:
            self.running -= 1
            self.active_tokens -= len(req.prompt_ids) + n
        self.seen.add(base)
        tokens = [token_at(base, done + i) for i in range(n)]
        return GenerateResult(
            request_id=req.request_id,
            token_ids=tokens,
            logprobs=[-(done + i) / 1000 for i in range(n)],
            finish_reason="stop" if done + n >= self.lengths[base] else "length",
            cached_prefix_tokens=cached,
            prompt_tokens=len(req.prompt_ids),
            instance=self.name,
            start_time=0.0,
            finish_time=0.0,
        )

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def telemetry(self) -> Telemetry:
        await self._check_fault()
        return Telemetry(self.name, 0.0, self.active_tokens / self.capacity, self.capacity,
                         self.running, 0, 0)


def fake_cluster(n_instances: int, ps: list[PromptSpec], lengths: dict[tuple[int, int], int], prefix: str = "",
                 **kw) -> list[FakeInstance]:
    """FakeInstances over a workload: lengths[(group, index)] -> EOS length."""
    by_id = {request_ids.request_id(g, k, prefix): n for (g, k), n in lengths.items()}
    plens = {request_ids.request_id(g, k, prefix): len(ps[g].prompt_ids) for (g, k) in lengths}
    return [FakeInstance(f"i{j}", by_id, plens, **kw) for j in range(n_instances)]
