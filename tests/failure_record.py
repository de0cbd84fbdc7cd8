"""The recovery bounds the failure tests assert, and the files where they record what they measured.

Each bound is stated once, here (`RECORDS`): the failure test asserts it (`Bound.check`), writes it
next to its measurements into `bench/results/failures/<name>.json` (`record`, only when
SEER_RECORD=1, from a run of the failure tests under the vLLM lock by `python -m bench.failures`),
and tests/test_failure_table.py checks that docs/failures.md row states it in the
words `Bound.text` renders and that the recorded file holds it and the measurements named here.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAILURES = ROOT / "bench" / "results" / "failures"


@dataclass(frozen=True)
class Bound:
    """A recovery time must stay under `factor` x a base time (measured in the same test) + `offset_s`.

    `of` names the base in docs/failures.md's words and `base` the measured value it is (factor 0: none)."""

    offset_s: float
    factor: float = 0.0
    of: str = ""
    base: str = ""

    def limit(self, base_s: float = 0.0) -> float:
        return self.factor * base_s + self.offset_s

    def text(self) -> str:
        """The bound as docs/failures.md's row states it."""
        if not self.factor:
            return f"within {self.offset_s:g} s"
        return f"at most {self.factor:g}x {self.of} + {self.offset_s:g} s"

    def check(self, measured_s: float, base_s: float = 0.0, what: object = "") -> None:
        """Assert the measured time is under the bound (`what` goes into the failure message)."""
        limit = self.limit(base_s)
        assert measured_s < limit, (f"{measured_s:.2f} s, over the bound {self.text()} (= {limit:.2f} s"
                                    + (f" with the base at {base_s:.2f} s" if self.factor else "") + f") {what}")


@dataclass(frozen=True)
class Recorded:
    """One failure test's file: the test, its bounds (measured as `<key>_s`) and its other measurements."""

    test: str
    bounds: dict[str, Bound]
    measured: tuple[str, ...] = ()

    def keys(self) -> set[str]:
        return {f"{k}_s" for k in self.bounds} | set(self.measured)


RECORDS: dict[str, Recorded] = {
    "instance_loss": Recorded(
        "tests/fleet/test_instance_failure.py::test_killed_and_hung_instances_lose_no_sample",
        # the stopped one: the 5 s hang timeout, a telemetry interval and a probe, with room to spare
        {"killed_dropped_after_kill": Bound(10.0), "hung_dropped_after_stop": Bound(12.0)},
        ("rollout_with_faults_s", "rollout_fault_free_s", "chunks_rerun_elsewhere", "hang_timeout_s", "instances",
         "samples", "chunk_size", "max_tokens")),
    "all_instances_lost": Recorded(
        "tests/fleet/test_instance_failure.py::test_losing_every_instance_stops_the_rollout_naming_each",
        {"error_after_kill": Bound(15.0)}, ("instances_killed", "message")),
    "retries_exhausted": Recorded(
        "tests/fleet/test_rollout_faults_real.py::test_a_chunk_that_keeps_failing_fails_the_rollout_and_aborts_the_rest",
        {"instances_idle_after_error": Bound(10.0)}, ("tokens_generated", "tokens_asked", "error")),
    "rollout_cancelled": Recorded(
        "tests/fleet/test_rollout_faults_real.py::test_cancelling_a_rollout_aborts_its_chunks_on_the_instances",
        {"instances_idle_after_cancel": Bound(10.0)}, ("tokens_generated", "tokens_asked")),
    "run_instance_loss_rollout": Recorded(
        "tests/test_run_survives_instance_loss.py::test_run_drops_a_killed_instance_and_finishes[rollout]",
        {"dropped_after_kill": Bound(10.0)}, ("rollout_s", "rollout_before_s", "rollout_after_s")),
    "run_instance_loss_training": Recorded(
        "tests/test_run_survives_instance_loss.py::test_run_drops_a_killed_instance_and_finishes[training]",
        {"weight_update_with_dead_instance": Bound(15.0, factor=2, of="the previous update",
                                                  base="weight_update_before_s")},
        ("weight_update_before_s", "chunks_migrated", "moved_chunks_with_prefix_from_pool", "logprob_mismatch_mean",
         "logprob_mismatch_max")),
    "run_kv_master_loss": Recorded(
        "tests/test_run_survives_kv_master_loss.py::test_run_restarts_a_killed_kv_master_and_the_instances_use_it_again",
        {"master_restarted_in": Bound(15.0)},
        ("when", "last_iteration_chunks_migrated", "last_iteration_migrated_prefix_tokens",
         "last_iteration_migrated_prefix_tokens_cached")),
    "run_node_loss": Recorded(
        "tests/fleet/test_two_nodes.py::test_a_node_lost_mid_rollout_costs_no_sample_and_leaves_no_process",
        # processes: the guard's sentinel sends SIGTERM, then SIGKILL after its 10 s grace
        {"dropped_after_loss": Bound(10.0), "processes_gone_after_loss": Bound(20.0)},
        ("rollout_s", "rollout_before_s")),
    "kv_master_restart": Recorded(
        "tests/kvpool/test_master_restart.py::test_a_crashed_master_is_restarted_and_an_existing_client_reconnects",
        {"segment_remounted_after_restart_began": Bound(15.0), "client_put_again_after_that": Bound(5.0)}),
    "dgds_restart": Recorded(
        "tests/dgds/test_dgds_grpc.py::test_client_keeps_drafting_through_a_server_restart_and_resyncs",
        {"resynced_after_server_back": Bound(5.0)}),  # the client's retry backoff is capped at 1 s
}


def bound(name: str, key: str) -> Bound:
    """RECORDS[name]'s bound `key` (what the test asserts and records)."""
    return RECORDS[name].bounds[key]


def bounds_doc(spec: Recorded, measured: dict) -> dict[str, dict]:
    """The bounds as a recorded file holds them: each with its words and, measured, its limit."""
    out = {}
    for key, b in spec.bounds.items():
        d = {**asdict(b), "text": b.text()}
        if key + "_s" in measured and (not b.factor or b.base in measured):
            d["limit_s"] = round(b.limit(measured[b.base] if b.factor else 0.0), 2)
        out[key] = d
    return out


def recording() -> bool:
    return os.environ.get("SEER_RECORD") == "1"


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def record(name: str, measured: dict, notes: str = "") -> Path | None:
    """Write `bench/results/failures/<name>.json` when SEER_RECORD=1; returns its path (or None).

    `measured` holds `<bound>_s` for each of RECORDS[name]'s bounds and the measurements it names."""
    spec = RECORDS[name]
    assert set(measured) == spec.keys(), f"{name}: measured {sorted(measured)}, RECORDS says {sorted(spec.keys())}"
    print(f"\n{name}: measured {measured}; bounds {[b.text() for b in spec.bounds.values()]}")
    if not recording():
        return None
    FAILURES.mkdir(parents=True, exist_ok=True)
    path = FAILURES / f"{name}.json"
    doc = {
        "test": spec.test,
        "command": f"python -m bench.failures {spec.test}",  # under the vLLM lock; SEER_RECORD=1 pytest -s, in effect
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "commit": _commit(),
        "load_average_1m": round(os.getloadavg()[0], 1),
        "cpus": len(os.sched_getaffinity(0)),
        "bounds": bounds_doc(spec, measured),
        "measured": measured,
        "notes": notes,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path
