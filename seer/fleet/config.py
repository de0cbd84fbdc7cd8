"""The run config's `instances:` section: how many vLLM instances, or which running ones to use.

Light on purpose: `seer.config` composes it, and `import seer.config` loads nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class InstancesConfig:
    count: int = 2  # vLLM instances to launch (one CPU core or GPU set each)
    urls: list[str] = field(default_factory=list)  # connect to running servers instead of launching
    kv_cache_bytes: int | None = 256 * 2**20  # per instance; CPU RAM reserved for KV blocks
    max_num_seqs: int = 256  # vLLM's --max-num-seqs: requests an instance runs at once
    startup_timeout_s: float = 600.0  # how long launched instances may take to answer /health
    extra_args: list[str] = field(default_factory=list)  # more vLLM server arguments for launched instances
