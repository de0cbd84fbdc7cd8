"""Seer's request ids: the one place that builds them and the one that parses them.

The grammar (what the scheduler sends and what the DGDS proposer inside an engine reads back):

* a request, sample ``s`` of GRPO group ``g``: ``<prefix>g<g>-s<s>`` (``request_id``); the prefix is
  the caller's, e.g. ``it3-`` per iteration, so groups of different iterations never meet;
* chunk ``k`` of it, one engine request: ``<request>-c<k>`` (``chunk_id``), so an abort or a retry
  never hits another chunk;
* the ``n``-th retry of a chunk (same index, hence same seed, but a fresh id on the engine):
  ``<chunk>-r<n>``.

The group is thus derivable from the id alone and no side channel to the engine is needed. Inside
vLLM the proposer sees only vLLM's internal ids, which wrap the caller's: the OpenAI completions
server makes ``cmpl-<X-Request-Id>-<prompt index>-<8 hex>``, the chat server
``chatcmpl-<id>-<8 hex>``, the offline engine ``<id>-<8 hex>`` (``caller_request_id`` unwraps them).

``parse_request_id`` maps an engine id to the DGDS group and sequence it drafts from. Any other id
still works: it becomes a singleton group of its own (per-request drafting), so another framework
gets SuffixDecoding-style drafts until it adopts group-carrying ids. A caller can also opt one
request out of group drafting by prefixing its id with ``SOLO_PREFIX`` (A/B runs on one engine
compare group and per-request drafts on the same prompts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SOLO_PREFIX = "solo-"  # caller id prefix: draft from this request's own tokens only

_ENGINE_SUFFIX = re.compile(r"-[0-9a-f]{8}$")  # vLLM's random_uuid()[:8] on every internal id
_COMPLETION = re.compile(r"^cmpl-(?P<id>.+)-\d+$")  # + the prompt's index in a batched request
_CHAT = re.compile(r"^chatcmpl-(?P<id>.+)$")
_SEER = re.compile(
    r"^(?P<group>(?P<prefix>(?:.*-)?)g(?P<index>\d+))-s(?P<sample>\d+)(?:-c(?P<chunk>\d+))?(?:-r(?P<retry>\d+))?$"
)


def request_id(group: int, sample: int, prefix: str = "") -> str:
    """The id of sample ``sample`` of group ``group``."""
    return f"{prefix}g{group}-s{sample}"


def chunk_id(request: str, chunk: int, retry: int = 0) -> str:
    """The engine id of chunk ``chunk`` of ``request`` (its ``retry``-th retry when > 0)."""
    return f"{request}-c{chunk}" + (f"-r{retry}" if retry else "")


@dataclass(frozen=True)
class SeerId:
    """A parsed Seer id. ``group``: the prefixed group key (``it3-g5``), shared by its samples."""

    prefix: str
    group_index: int
    sample: int
    chunk: int | None = None
    retry: int | None = None

    @property
    def group(self) -> str:
        return f"{self.prefix}g{self.group_index}"

    @property
    def request(self) -> str:
        """The whole request's id (chunk and retry dropped)."""
        return request_id(self.group_index, self.sample, self.prefix)


def parse(rid: str) -> SeerId | None:
    """The parts of a Seer request or chunk id; None for any other id."""
    m = _SEER.match(rid)
    if m is None:
        return None
    chunk, retry = m.group("chunk"), m.group("retry")
    return SeerId(m.group("prefix"), int(m.group("index")), int(m.group("sample")),
                  None if chunk is None else int(chunk), None if retry is None else int(retry))


@dataclass(frozen=True)
class RequestRef:
    """Where one engine request's tokens go and whom it drafts from.

    ``group_id``: the DGDS group (the GRPO group, or the request itself when ungrouped).
    ``sequence_id``: the request's sequence in that group's tree (one per chunk, so a chunk that
    lands on another instance never has to continue a sequence it has not seen).
    ``first_chunk``: whether the prompt is the task's prompt (later chunks' prompts carry the
    earlier chunks' output, which is already in the tree).
    ``probe``: the group's high-priority request for the draft-length policy.
    """

    caller_id: str
    group_id: str
    sequence_id: str
    sample_index: int | None = None
    chunk_index: int | None = None
    first_chunk: bool = True
    probe: bool = False
    grouped: bool = False


def caller_request_id(engine_request_id: str) -> str:
    """The id the caller chose, from vLLM's internal id (unknown wrappings pass through)."""
    rid = _ENGINE_SUFFIX.sub("", engine_request_id)
    for pattern in (_COMPLETION, _CHAT):
        m = pattern.match(rid)
        if m:
            return m.group("id")
    return rid


def parse_request_id(
    engine_request_id: str, *, per_request: bool = False, probe_index: int = 0
) -> RequestRef:
    """Group and sequence of an engine request.

    ``per_request`` (or a ``SOLO_PREFIX`` id) drafts from the request's own tokens only: its group
    is then the whole request (all its chunks), so the comparison with group drafting differs in
    the group context alone.
    """
    caller = caller_request_id(engine_request_id)
    solo = per_request
    core = caller
    if core.startswith(SOLO_PREFIX):
        solo, core = True, core[len(SOLO_PREFIX):]
    sid = parse(core)
    if sid is None:
        return RequestRef(caller, f"req:{caller}", caller)
    return RequestRef(
        caller_id=caller,
        group_id=f"req:{sid.request}" if solo else sid.group,
        sequence_id=core,
        sample_index=sid.sample,
        chunk_index=sid.chunk,
        first_chunk=sid.chunk in (None, 0),
        probe=sid.sample == probe_index,
        grouped=not solo,
    )
