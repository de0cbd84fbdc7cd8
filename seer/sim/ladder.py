"""The ablation ladder every comparison runs: baseline, + divided, + context, + grouped SD, oracle.

One definition shared by the simulator and the real benchmark, so both run the same
configurations under the same names (and the order check between them is meaningful).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class BenchConfig:
    name: str
    policy: str  # seer.scheduler policy name
    speculate: bool = False  # grouped speculative decoding (DGDS proposer)
    label: str = ""
    chunk_size: int | None = None  # None: the benchmark's chunk size
    sched: tuple[tuple[str, object], ...] = ()  # SchedulerConfig fields this configuration sets

    @property
    def oracle(self) -> bool:
        return self.policy == "oracle_lfs"


LADDER: tuple[BenchConfig, ...] = (
    BenchConfig("baseline", "group_rr", label="baseline (group round-robin)"),
    # Requests in arrival order, a started one before those not yet started (DividedFifo's
    # `continuations_first`): the reading of divided rollout whose tail matches the paper's
    # (docs/bench.md, "Current result", change 4).
    BenchConfig("divided", "divided", label="+ divided rollout", sched=(("continuations_first", True),)),
    BenchConfig("context", "context", label="+ context-aware scheduling"),
    BenchConfig("grouped_sd", "context", speculate=True, label="+ grouped speculative decoding"),
    BenchConfig("oracle", "oracle_lfs", label="oracle longest-first (knows lengths)"),
)

BY_NAME = {c.name: c for c in LADDER}


def parse_bool(value: str) -> bool:
    """true/false/1/0 (any case); ValueError otherwise, so that a typo never reads as True."""
    if value.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"expected true or false, got {value!r}")
    return value.lower() in ("true", "1")


def parse_sched(items: list[str], exclude: frozenset[str] = frozenset()) -> tuple[tuple[str, object], ...]:
    """`FIELD=VALUE` items as SchedulerConfig field overrides (booleans, ints, floats).

    `exclude`: fields the caller sets itself, which an override may not change.
    """
    from seer.scheduler import SchedulerConfig
    known = {f.name: f.default for f in fields(SchedulerConfig) if f.name not in exclude}
    out = []
    for item in items:
        key, _, value = item.partition("=")
        if key not in known or not value:
            raise ValueError(f"{item!r}: expected FIELD=VALUE with FIELD one of {sorted(known)}")
        if isinstance(known[key], bool):
            try:
                out.append((key, parse_bool(value)))
            except ValueError:
                raise ValueError(f"{item!r}: {key} is true or false") from None
        else:
            try:
                out.append((key, float(value) if "." in value or "e" in value.lower() else int(value)))
            except ValueError:
                raise ValueError(f"{item!r}: {key} takes a number") from None
    return tuple(out)


# Fields a configuration's `+FIELD=VALUE` may not set: the configuration and the benchmark own them.
DERIVED_FIELDS = frozenset({"policy", "chunk_size", "kv_pool", "max_running", "kv_capacity_tokens"})


def select(names: str | None) -> list[BenchConfig]:
    """Configurations by comma-separated name, in ladder order; None or 'all' = the whole ladder.

    Variants, listed after the ladder's own in the order given: `name@N` runs that configuration
    with N-token chunks (`context@128`); `name+FIELD=VALUE` with a scheduler setting changed
    (`context+engine_priority=true+early_packing=true`); both combine (`context@128+early_packing=true`).
    """
    if not names or names == "all":
        return list(LADDER)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n.split("+", 1)[0].split("@", 1)[0] not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown configurations {unknown}; known: {list(BY_NAME)} "
                         "(optionally name@chunk_size and +FIELD=VALUE)")
    out = [c for c in LADDER if c.name in wanted]
    for n in wanted:
        if n in BY_NAME:
            continue
        head, *overrides = n.split("+")
        base, at, size = head.partition("@")
        if at and (not size.isdigit() or int(size) <= 0):
            raise ValueError(f"{n!r}: the chunk size after @ must be a positive integer")
        try:
            sched = parse_sched(overrides, DERIVED_FIELDS)
        except ValueError as e:
            raise ValueError(f"{n!r}: {e}") from None
        c = BY_NAME[base]
        label = c.label + (f", chunk {size}" if size else "") + "".join(f", {k}={v}" for k, v in sched)
        out.append(BenchConfig(n, c.policy, c.speculate, label, int(size) if size else c.chunk_size, sched))
    return out
