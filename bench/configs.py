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
    chunk_size: int | None = None  # None: the benchmark's chunk size

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
    """Configurations by comma-separated name, in ladder order; None or 'all' = the whole ladder.

    `name@N` is that configuration with N-token chunks (e.g. `context@128,context@256`), listed
    after the ladder's own, in the order given.
    """
    if not names or names == "all":
        return list(LADDER)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n.split("@", 1)[0] not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown configurations {unknown}; known: {list(BY_NAME)} (optionally name@chunk_size)")
    out = [c for c in LADDER if c.name in wanted]
    for n in wanted:
        if "@" in n:
            base, size = n.split("@", 1)
            if not size.isdigit() or int(size) <= 0:
                raise ValueError(f"{n!r}: the chunk size after @ must be a positive integer")
            c = BY_NAME[base]
            out.append(BenchConfig(n, c.policy, c.speculate, f"{c.label}, chunk {size}", int(size)))
    return out
