"""Plug-ins that tests (and tests/test_plugins_e2e.py's seer-run) name by `module:object` path."""

from __future__ import annotations

from seer.scheduler.decisions import Wait
from seer.scheduler.policies.base import Policy
from seer.scheduler.policies.index import PriorityIndex


class NewestFirst(Policy):
    """Last come, first served: the opposite of divided's order, so a test can tell it ran."""

    name = "newest_first"

    def __init__(self, chunk_size=8192, placement=None, *, reason: str = "newest"):
        super().__init__(chunk_size, placement)
        self.reason = reason
        self._ready = PriorityIndex()
        self._n = 0
        self.dispatched = 0

    def on_ready(self, req):
        self._n += 1
        self._ready.add(req, (-self._n,))

    def on_dispatched(self, decision):
        self._ready.discard(decision.request)
        self.dispatched += 1

    def pick(self, loads):
        req = self._ready.peek()
        return Wait("idle") if req is None else self.place(req, loads, self.reason)

    def summary(self):
        return {"dispatched": self.dispatched, "reason": self.reason}


class Unnamed(NewestFirst):
    """No `name` of its own: recorded under its class name."""


class NoKeywords(Policy):
    """A policy whose constructor does not take chunk_size and placement (a config error)."""

    def __init__(self):
        super().__init__()

    def on_ready(self, req): ...
    def on_dispatched(self, decision): ...
    def pick(self, loads): return Wait("idle")


NOT_A_POLICY = 3


def sums(n: int = 3, offset: int = 0) -> list[dict]:
    """A loader: `n` 'add these' prompts with their answers, as a JSONL file's lines would hold them."""
    return [{"prompt": f"loader prompt {i}: {i + offset} + 1 =", "answer": i + offset + 1} for i in range(n)]


def chats(n: int = 2) -> list[dict]:
    """A loader of chat records: `messages` instead of `prompt`."""
    return [{"messages": [{"role": "system", "content": "Add."}, {"role": "user", "content": f"{i} + 1"}],
             "answer": i + 1} for i in range(n)]


def broken() -> list[dict]:
    """Record 1 lacks its prompt."""
    return [{"prompt": "fine", "answer": 1}, {"question": "where is the prompt?"}]


def not_a_list() -> int:
    return 7


def reward_by_length(response_text: str, reference: dict) -> float:
    return min(1.0, len(response_text) / 100)


def tagged(n: int = 3, tag: str = "untagged") -> list[dict]:
    """A loader for seer-run: `n` prompts whose reference carries `tag` (tag_reward checks it)."""
    return [{"prompt": f"count to {i + 2}:", "tag": tag} for i in range(n)]


def tag_reward(response_text: str, reference: dict) -> float:
    """1 for a sample of a tagged "e2e" record: proof that the rollout scored the plug-in's records."""
    return 1.0 if reference.get("tag") == "e2e" else 0.0


def per_session_baseline(groups):
    """An advantage estimator by path (trainer.advantage_estimator): the baseline is the mean over
    agent sessions of each session's mean reward, so a session with many branches counts once."""
    out = []
    for g in groups:
        sessions: dict[str, list[float]] = {}
        for r, s in zip(g.rewards, g.samples):
            sessions.setdefault(s.branch.session if s.branch else s.request_id, []).append(r)
        base = sum(sum(v) / len(v) for v in sessions.values()) / len(sessions)
        out.append([r - base for r in g.rewards])
    return out


def numbered(n: int = 12) -> list[dict]:
    """A loader whose references carry each prompt's number (half_constant reads it)."""
    return [{"prompt": f"count to {i + 2}:", "number": i} for i in range(n)]


def half_constant(response_text: str, reference: dict) -> float:
    """Dynamic sampling's test reward: even-numbered prompts score a constant (an all-equal group),
    the others the parity of the text's checksum (informative, almost surely)."""
    import zlib

    if reference["number"] % 2 == 0:
        return 1.0
    return float(zlib.crc32(response_text.encode()) % 2)


def long_prompts(n: int = 2, chars: int = 150) -> list[dict]:
    """A loader of `n` prompts of about `chars` tokens (the byte tokenizer): longer than a KV block
    (128 tokens), so a group's samples share their prompt's first block through the prefix cache
    or the pool."""
    return [{"prompt": (f"prompt {i}: " + "count the letters of this line. " * 10)[:chars]} for i in range(n)]


def reward_by_checksum(response_text: str, reference: dict) -> float:
    """A reward in [0, 1) that differs between any two different texts (almost surely): an untrained
    model's group then always has a reward spread, so every update moves the policy."""
    import zlib

    return zlib.crc32(response_text.encode()) % 1000 / 1000
