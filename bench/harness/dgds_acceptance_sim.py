"""Offline acceptance of speculative drafts on recorded token streams (the shape of Seer's Table 2).

A drafted token counts as accepted when it equals the token the request actually produced next
(what greedy verification does, and what the paper's offline table measures). One decoding step
emits the accepted prefix of the draft plus one bonus token, so the acceptance length of a step is
``accepted + 1`` and the mean over all steps of all requests is the table's number.

The drafter of a step sees the group's tree: the prompt, ``n`` sibling responses of the group (the
references, complete, as in the paper's setting) and the request's own tokens so far. Because the
tree's content at position t does not depend on how the earlier steps were split, the accepted
length is computed once per position (``accepted_at``) and the steps are then replayed per drafting
mode (``replay``), which keeps the benchmark to one tree pass per request and reference count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from seer.dgds.tree.drafting import draft
from seer.dgds.tree.suffix_tree import SuffixTree
from seer.dgds.types import DraftParams

from seer.sim.scripts import mask_runs

Drafter = Callable[[Sequence[int]], list[tuple[int, ...]]]  # context -> candidate paths


@dataclass(frozen=True)
class AcceptanceResult:
    steps: int
    tokens: int

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verification step, bonus token included."""
        return self.tokens / self.steps if self.steps else 0.0


def accepted_prefix(path: Sequence[int], actual: Sequence[int]) -> int:
    """How many leading draft tokens match what was really generated."""
    n = 0
    for a, b in zip(path, actual):
        if a != b:
            break
        n += 1
    return n


def replay(accepted: Sequence[int]) -> AcceptanceResult:
    """Decode a stream of len(accepted) tokens: at position t a step emits accepted[t] + 1 tokens."""
    t = steps = 0
    n = len(accepted)
    while t < n:
        t += min(accepted[t] + 1, n - t)
        steps += 1
    return AcceptanceResult(steps, n)


def merge(results: Sequence[AcceptanceResult]) -> AcceptanceResult:
    return AcceptanceResult(sum(r.steps for r in results), sum(r.tokens for r in results))


def tree_accepted_at(
    prompt: Sequence[int],
    response: Sequence[int],
    references: Sequence[Sequence[int]],
    params_by_mode: dict[str, DraftParams],
    *,
    max_depth: int = 64,
    include_prompt: bool = True,
) -> dict[str, list[int]]:
    """Per mode, the accepted draft length at every position of ``response`` (group tree drafts).

    Multi-path modes (top_k > 1) accept the best of their paths, as tree verification would.
    """
    tree = SuffixTree(max_depth)
    if include_prompt:
        tree.extend(tree.add_sequence(), prompt)
    for ref in references:
        tree.extend(tree.add_sequence(), ref)
    own = tree.add_sequence()
    lookup = max(p.pattern_lookup_max for p in params_by_mode.values())
    context = list(prompt)
    out: dict[str, list[int]] = {m: [] for m in params_by_mode}
    for t, tok in enumerate(response):
        tail = context[-lookup:]
        actual = response[t : t + max(p.max_spec_tokens for p in params_by_mode.values())]
        for mode, params in params_by_mode.items():
            paths, _ = draft(tree, tail, params)
            out[mode].append(max((accepted_prefix(p.tokens, actual) for p in paths), default=0))
        tree.extend(own, (tok,))
        context.append(tok)
    return out


def ngram_accepted_at(
    prompt: Sequence[int], response: Sequence[int], *, k: int, lookup_min: int, lookup_max: int
) -> list[int]:
    """vLLM's ``ngram`` proposer (prompt lookup over the request's own context), same scoring.

    Uses vLLM's own matching function, so the comparison is with the proposer as shipped.
    """
    import numpy as np
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

    tokens = np.asarray(list(prompt) + list(response), dtype=np.int32)
    p = len(prompt)
    out = []
    for t in range(len(response)):
        d = _find_longest_matched_ngram_and_propose_tokens(tokens[: p + t], lookup_min, lookup_max, 1 << 30, k)
        out.append(accepted_prefix(d.tolist(), response[t : t + k]))
    return out


def turns_accepted_at(
    prompt: Sequence[int],
    response: Sequence[int],
    mask: Sequence[int],
    references: Sequence[tuple[Sequence[int], Sequence[int]]],
    params: DraftParams,
    *,
    observations: bool,
    max_depth: int = 64,
) -> list[list[int]]:
    """Multi-turn: per model turn, the accepted draft length at each of its tokens.

    `response` holds every turn and the observations between them, `mask` is 1 on the model's
    tokens; `references` are the group's other (response, mask) pairs. The tree holds the prompt
    and a sequence per turn, as the proposer's one sequence per chunk does (a turn is a chunk when
    it fits one): the turn's model tokens only, or with `observations` the observation before it
    too. Either way the drafter matches the request's own context, observations included (the
    engine's tokens), and a draft is checked against the rest of its turn only (the turn ends at
    its stop sequence).
    """
    def segments(seq, m):
        """(observation before, turn) pairs, in order."""
        out, obs = [], []
        for i, j, model in mask_runs(m):
            if model:
                out.append((obs, list(seq[i:j])))
                obs = []
            else:
                obs = list(seq[i:j])
        return out

    tree = SuffixTree(max_depth)
    tree.extend(tree.add_sequence(), prompt)
    for ref, ref_mask in references:
        for obs, turn in segments(ref, ref_mask):
            tree.extend(tree.add_sequence(), (obs if observations else []) + turn)
    context = list(prompt)
    out: list[list[int]] = []
    pos = 0
    for obs, turn in segments(response, mask):
        while mask[pos] == 0:  # the observation before this turn: in the engine's context
            context.append(response[pos])
            pos += 1
        own = tree.add_sequence()
        if observations and obs:
            tree.extend(own, obs)
        accepted = []
        for k, tok in enumerate(turn):
            end = min(len(turn), k + params.max_spec_tokens)
            paths, _ = draft(tree, context[-params.pattern_lookup_max:], params)
            accepted.append(max((accepted_prefix(p.tokens, turn[k:end]) for p in paths), default=0))
            tree.extend(own, (tok,))
            context.append(tok)
            pos += 1
        out.append(accepted)
    return out
