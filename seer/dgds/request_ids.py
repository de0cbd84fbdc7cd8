"""Map an engine's request id to the DGDS group and sequence it drafts from: the one parser.

The proposer inside vLLM sees only vLLM's internal ids. What the rollout chose is in there,
wrapped: the OpenAI completions server makes ``cmpl-<X-Request-Id>-<prompt index>-<8 hex>``, the
chat server ``chatcmpl-<id>-<8 hex>``, the offline engine ``<id>-<8 hex>``. Seer's scheduler
names requests ``<prefix>g<group>-s<sample>`` and their chunks ``...-c<k>`` (``-r<n>`` on a
retry), so the group is derivable from the id alone and no side channel to the engine is needed.

Any other id still works: it becomes a singleton group of its own (per-request drafting), so
another framework gets SuffixDecoding-style drafts until it adopts group-carrying ids. A caller can
also opt one request out of group drafting by prefixing its id with ``SOLO_PREFIX`` (A/B runs on
one engine compare group and per-request drafts on the same prompts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SOLO_PREFIX = "solo-"  # caller id prefix: draft from this request's own tokens only

_ENGINE_SUFFIX = re.compile(r"-[0-9a-f]{8}$")  # vLLM's random_uuid()[:8] on every internal id
_COMPLETION = re.compile(r"^cmpl-(?P<id>.+)-\d+$")  # + the prompt's index in a batched request
_CHAT = re.compile(r"^chatcmpl-(?P<id>.+)$")
_SEER = re.compile(
    r"^(?P<group>(?:.*-)?g\d+)-s(?P<sample>\d+)(?:-c(?P<chunk>\d+))?(?:-r(?P<retry>\d+))?$"
)


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
    m = _SEER.match(core)
    if m is None:
        return RequestRef(caller, f"req:{caller}", caller)
    sample = int(m.group("sample"))
    chunk = int(m.group("chunk")) if m.group("chunk") is not None else None
    request = f"{m.group('group')}-s{sample}"
    group = f"req:{request}" if solo else m.group("group")
    return RequestRef(
        caller_id=caller,
        group_id=group,
        sequence_id=core,
        sample_index=sample,
        chunk_index=chunk,
        first_chunk=chunk in (None, 0),
        probe=sample == probe_index,
        grouped=not solo,
    )
