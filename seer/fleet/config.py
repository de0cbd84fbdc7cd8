"""The run config's `instances:` section: how many vLLM instances, or which running ones to use.

Light on purpose: `seer.config` composes it, and `import seer.config` loads nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class InstancesConfig:
    count: int = 2
    urls: list[str] = field(default_factory=list)  # connect to running servers instead of launching
    kv_cache_bytes: int | None = 256 * 2**20  # per instance; CPU RAM reserved for KV blocks
    max_num_seqs: int = 256
    startup_timeout_s: float = 600.0
    extra_args: list[str] = field(default_factory=list)
