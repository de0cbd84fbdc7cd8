"""A session's tokens: its current root-to-leaf path of calls, and the points a next call may continue from.

Token-in, token-out: the path holds exactly the tokens the instances saw, the model's as generated
(never re-tokenized from text) and everything else (template, user, tool tokens) tokenized once when
its call arrived. A call is matched by its rendered text: the longest point of the path whose
conversation text the call's text starts with (the point after the last reply, when the agent just
appended a tool result; an earlier one when it edited or dropped history). Only the text after that
point is tokenized, together with the template's text the point's tokens do not hold yet (its `tail`:
what the chat template writes after the model's last token, Qwen's "\n" after `<|im_end|>`, or the
closing of a turn cut short), so that the tokens a call continues from are the tokenizer's encoding
of the call's rendered text, except the model's own tokens, which stay as it sampled them. A call that continues from an earlier point than the path's end starts a branch:
the path is cut back to that point, and the path it leaves, up to its last delivered reply, is kept
as a leaf (a sample of its own; docs/agents-gateway.md, "Branches").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@dataclass(frozen=True)
class Point:
    """A place on the path a call may continue from: the conversation text rendered up to it, kept
    as its length and digest (a session's memory grows with its tokens, not with calls x context)."""

    chars: int
    digest: bytes
    at: int  # path tokens up to here
    calls: tuple[int, ...]  # the calls whose replies lie on the path before here
    # the end of the text that the path's first `at` tokens do not hold: template text after the model's
    # last token (tokenized with the next call's text, as context: the model never sampled it)
    tail: str = ""

    @classmethod
    def of(cls, text: str, at: int, calls: tuple[int, ...], tail: str = "") -> Point:
        return cls(len(text), _digest(text), at, calls, tail)

    def starts(self, text: str) -> bool:
        return len(text) >= self.chars and _digest(text[:self.chars]) == self.digest


@dataclass(frozen=True)
class Leaf:
    """A finished root-to-leaf path of a session: trained as one sample."""

    ids: tuple[int, ...]
    mask: tuple[int, ...]  # 1 on the model's tokens
    logprobs: tuple[float, ...]  # one per model token
    calls: tuple[int, ...]  # call indices from the root


@dataclass(frozen=True)
class Plan:
    """What a call does to the path: where it continues from, and the tokens it appends."""

    point: Point
    rewind_to: int | None  # None: it extends the path's end
    new_ids: tuple[int, ...]
    leaf: Leaf | None  # the path it leaves behind, when it branches off a delivered reply

    @property
    def context_tokens(self) -> int:
        return self.point.at + len(self.new_ids)


@dataclass
class SessionPath:
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    points: list[Point] = field(default_factory=lambda: [Point.of("", 0, ())])
    delivered: int = 0  # path tokens up to the end of the last reply its agent received
    delivered_calls: tuple[int, ...] = ()
    branches: int = 0  # calls that continued from an earlier point than the path's end

    def match(self, text: str) -> tuple[Point, str]:
        """The point a call's rendered text continues from, and the text to tokenize after its tokens
        (the point's tail, then the call's text past the point)."""
        point = max((p for p in self.points if p.starts(text)), key=lambda p: (p.chars, p.at))
        return point, point.tail + text[point.chars:]

    def plan(self, point: Point, new_ids: list[int] | tuple[int, ...]) -> Plan:
        """What a call continuing from `point` with `new_ids` (its `match` text's tokens) does to
        the path (no change until `apply`)."""
        new_ids = tuple(new_ids)
        rewind = None if point.at == len(self.ids) else point.at
        leaf = None
        if rewind is not None and self.delivered > point.at:
            leaf = self.leaf_until_delivered()
        return Plan(point, rewind, new_ids, leaf)

    def leaf_until_delivered(self) -> Leaf:
        n = self.delivered
        lps = sum(self.mask[:n])
        return Leaf(tuple(self.ids[:n]), tuple(self.mask[:n]), tuple(self.logprobs[:lps]), self.delivered_calls)

    def apply(self, plan: Plan, text: str, call: int) -> None:
        """Cut the path back to the plan's point (a branch) and append the call's new tokens."""
        at = plan.point.at
        if plan.rewind_to is not None:
            self.branches += 1
            self.rewind(at)
            self.delivered_calls = plan.point.calls
        self.ids.extend(plan.new_ids)
        self.mask.extend([0] * len(plan.new_ids))
        self.points.append(Point.of(text, len(self.ids), plan.point.calls))

    def rewind(self, at: int) -> None:
        del self.logprobs[sum(self.mask[:at]):]
        del self.ids[at:]
        del self.mask[at:]
        self.points = [p for p in self.points if p.at <= at]
        self.delivered = min(self.delivered, at)

    def add_turn(self, ids: list[int], logprobs: list[float]) -> None:
        """The model's tokens of a turn (delivered or not: a cancelled call's stay undelivered)."""
        if len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} model tokens but {len(logprobs)} log-probs")
        self.ids.extend(ids)
        self.mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs)

    def deliver(self, text_after: str, call: int, tail: str = "") -> None:
        """The agent received the turn just added: the conversation including it is a point, whose
        last `tail` characters (template text after the turn's last token) are not tokens yet."""
        calls = (*self.points[-1].calls, call)
        self.delivered, self.delivered_calls = len(self.ids), calls
        self.points.append(Point.of(text_after, len(self.ids), calls, tail))


def template_tail(before: str, turn: str, shown: str, after: str, eos: str) -> str | None:
    """The chat template's text after a model turn that the turn's tokens do not hold: where the turn
    ends in `after` (the conversation re-rendered with the reply; `before`: rendered up to the turn),
    what follows it. `turn`: the turn's text as generated (its EOS's text kept); `shown`: the reply's
    text as the agent got it. Qwen's templates write "\n" after `<|im_end|>`: that "\n" is the tail.
    None: `after` does not continue `before`, there is no turn to find in it."""
    if not after.startswith(before):
        return None
    rest = after[len(before):]
    if rest.startswith(turn):  # rendered back as the model wrote it
        return rest[len(turn):]
    if eos and turn.endswith(eos):  # rendered otherwise (a tool call's JSON re-written, content trimmed):
        at = rest.rfind(eos)  # the turn ends at the template's own end of the turn, as it did at its EOS
        return rest[at + len(eos):] if at >= 0 else None
    if rest.startswith(shown):  # cut short (max_tokens, a stop string): the template closes it
        return rest[len(shown):]
    at = rest.rfind(eos) if eos else -1
    return rest[at:] if at >= 0 else None
