"""The run config's `dgds:` section (imports nothing heavy: `import seer.config` must stay light)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from seer.dgds.tree.suffix_tree import MAX_DEPTH
from seer.dgds.vllm.settings import ProposerSettings
from seer.dgds.wire import TOKEN_ENV  # noqa: F401  (the run's secret: see there)


@dataclass(frozen=True)
class DGDSConfig:
    enabled: bool = False  # grouped speculative decoding: a draft server and the DGDS proposer in every instance
    address: str | None = None  # host:port of a running `seer-dgds serve`; None launches one here
    host: str = "127.0.0.1"  # where a launched draft server binds
    num_speculative_tokens: int = 8  # gamma_max
    mode: Literal["group", "request"] = "group"  # request: per-request-only drafting (ablation)
    adaptive: bool = ProposerSettings.adaptive  # Algorithm 1 draft lengths; False: always gamma_max
    max_depth: int = MAX_DEPTH  # suffix-tree depth: the longest context a draft is matched on
    ready_timeout_s: float = 60.0  # how long a launched draft server may take to start

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1:
            raise ValueError(f"dgds.num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if self.address is not None and ":" not in self.address:
            raise ValueError(f"dgds.address must be host:port, got {self.address!r}")
