"""How the DGDS proposer inside vLLM is configured: vLLM's speculative config plus env vars.

vLLM's ``SpeculativeConfig`` forbids unknown keys, so only what it already has travels in
``--speculative-config``; the rest comes from ``SEER_DGDS_*`` environment variables, which vLLM's
engine-core and worker processes inherit from the server's environment.

From ``--speculative-config``:
  ``num_speculative_tokens``          gamma_max: the most tokens drafted per request and step
  ``suffix_decoding_max_tree_depth``  longest context suffix matched in the tree (pattern_lookup_max)
  ``suffix_decoding_min_token_prob``  a draft path stops below this cumulative probability

From the environment (defaults in brackets):
  ``SEER_DGDS_ADDRESS``        host:port of a ``seer-dgds serve``; unset: an embedded server in the
                               engine process (groups shared within this instance only)
  ``SEER_DGDS_TOKEN``          the shared server's secret (read by DraftClient; the embedded
                               server makes its own) [unset: a server started with --insecure]
  ``SEER_DGDS_MODE``           ``group`` (drafts from the group's tree) or ``request`` (each request
                               drafts from its own tokens only) [group]
  ``SEER_DGDS_ADAPTIVE``       1: Algorithm 1 sets draft lengths online; 0: always gamma_max [1]
  ``SEER_DGDS_LAMBDA``         Algorithm 1's preference for probe requests [2.0]
  ``SEER_DGDS_PROBE_INDEX``    sample index of each group's high-priority probe request [0]
  ``SEER_DGDS_PATTERN_MIN``    shortest context suffix matched [1]
  ``SEER_DGDS_UPDATE_TOKENS``  tokens per request batched into one update to the server [8]
  ``SEER_DGDS_FETCH_S``        seconds between incremental fetches of other instances' tokens [0.05]
  ``SEER_DGDS_TTL_S``          a group is dropped this long after its last append [600]
  ``SEER_DGDS_PROMPT``         1: the task prompt is a sequence of the tree too [1]
  ``SEER_DGDS_DEBUG_LOG``      a file path: one line per drafted row (ids, sampled, draft) [unset]
  ``SEER_DGDS_STATS_FILE``     a file path: the proposer's counters, step-cost fit, beta and chosen
                               plans as JSON, rewritten after every step (tests, benchmarks) [unset]
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

MODES = ("group", "request")


@dataclass(frozen=True)
class ProposerSettings:
    address: str | None = None
    mode: str = "group"
    gamma_max: int = 8
    pattern_lookup_min: int = 1
    pattern_lookup_max: int = 24
    min_token_prob: float = 0.1
    adaptive: bool = True
    lam: float = 2.0
    probe_index: int = 0
    update_batch_tokens: int = 8
    fetch_interval_s: float = 0.05
    ttl_s: float = 600.0
    include_prompt: bool = True

    @property
    def per_request(self) -> bool:
        return self.mode == "request"

    def problem(self) -> str | None:
        if self.mode not in MODES:
            return f"SEER_DGDS_MODE must be one of {MODES}, got {self.mode!r}"
        if self.gamma_max < 1:
            return "num_speculative_tokens must be >= 1"
        if not 1 <= self.pattern_lookup_min <= self.pattern_lookup_max:
            return "need 1 <= SEER_DGDS_PATTERN_MIN <= suffix_decoding_max_tree_depth"
        if self.update_batch_tokens < 1 or self.fetch_interval_s <= 0 or self.ttl_s <= 0:
            return "SEER_DGDS_UPDATE_TOKENS, SEER_DGDS_FETCH_S and SEER_DGDS_TTL_S must be positive"
        return None


def _flag(value: str) -> bool:
    return value.strip().lower() not in ("0", "false", "no", "off", "")


def settings_from(
    num_speculative_tokens: int,
    max_tree_depth: int | None = None,
    min_token_prob: float | None = None,
    env: Mapping[str, str] | None = None,
) -> ProposerSettings:
    """Settings from the speculative config's fields and the environment; ValueError if invalid."""
    env = os.environ if env is None else env
    d = ProposerSettings()
    try:
        s = ProposerSettings(
            address=env.get("SEER_DGDS_ADDRESS") or None,
            mode=env.get("SEER_DGDS_MODE", d.mode).strip().lower(),
            gamma_max=int(num_speculative_tokens),
            pattern_lookup_min=int(env.get("SEER_DGDS_PATTERN_MIN", d.pattern_lookup_min)),
            pattern_lookup_max=int(max_tree_depth or d.pattern_lookup_max),
            min_token_prob=float(d.min_token_prob if min_token_prob is None else min_token_prob),
            adaptive=_flag(env.get("SEER_DGDS_ADAPTIVE", "1")),
            lam=float(env.get("SEER_DGDS_LAMBDA", d.lam)),
            probe_index=int(env.get("SEER_DGDS_PROBE_INDEX", d.probe_index)),
            update_batch_tokens=int(env.get("SEER_DGDS_UPDATE_TOKENS", d.update_batch_tokens)),
            fetch_interval_s=float(env.get("SEER_DGDS_FETCH_S", d.fetch_interval_s)),
            ttl_s=float(env.get("SEER_DGDS_TTL_S", d.ttl_s)),
            include_prompt=_flag(env.get("SEER_DGDS_PROMPT", "1")),
        )
    except ValueError as e:
        raise ValueError(f"bad SEER_DGDS_* setting: {e}") from None
    problem = s.problem()
    if problem:
        raise ValueError(problem)
    return s
