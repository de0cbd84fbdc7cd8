"""The ablation ladder every comparison runs: baseline, + divided, + context, + grouped SD, oracle.

One definition shared by the simulator and the real benchmark, so both run the same
configurations under the same names (and the order check between them is meaningful).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BenchConfig:
    name: str
    policy: str  # seer.scheduler policy name
    speculate: bool = False  # grouped speculative decoding (DGDS proposer)
    label: str = ""

    @property
    def oracle(self) -> bool:
        return self.policy == "oracle_lfs"


LADDER: tuple[BenchConfig, ...] = (
    BenchConfig("baseline", "group_rr", label="baseline (group round-robin)"),
    BenchConfig("divided", "divided", label="+ divided rollout"),
    BenchConfig("context", "context", label="+ context-aware scheduling"),
    BenchConfig("grouped_sd", "context", speculate=True, label="+ grouped speculative decoding"),
    BenchConfig("oracle", "oracle_lfs", label="oracle longest-first (knows lengths)"),
)

BY_NAME = {c.name: c for c in LADDER}


def select(names: str | None) -> list[BenchConfig]:
    """Configurations by comma-separated name, in ladder order; None or 'all' = the whole ladder."""
    if not names or names == "all":
        return list(LADDER)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown configurations {unknown}; known: {list(BY_NAME)}")
    return [c for c in LADDER if c.name in wanted]
