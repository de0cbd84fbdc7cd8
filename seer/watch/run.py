"""What shows a run while it goes, in one place for the loop: progress lines of long steps, the
iteration's phases (for its timeline and the live endpoint), the trackers and the trace file."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from rich.console import Console

from seer.scheduler.events import Progress
from seer.types import RolloutBatch
from seer.watch.config import LoggingConfig
from seer.watch.progress import step
from seer.watch.trace import build_trace, write_trace
from seer.watch.tracking import Trackers


def trace_path(rollout_file: Path) -> Path:
    """rollouts/iter_0003.jsonl -> rollouts/iter_0003.trace.json"""
    return rollout_file.with_name(rollout_file.stem + ".trace.json")


class RunWatch:
    def __init__(self, cfg: LoggingConfig, run_path: Path, console: Console, *, config: dict, start_step: int,
                 log=None):
        self.cfg, self.run_path, self.console = cfg, Path(run_path), console
        self._log = log or (lambda line: None)
        self.phases: list[tuple[str, float, float]] = []
        self.live = None
        self.trackers = Trackers(cfg, self.run_path, config=config, start_step=start_step)
        try:
            if cfg.metrics_port is not None:
                from seer.watch.live import LiveMetrics

                self.live = LiveMetrics(cfg.metrics_host, cfg.metrics_port)
                console.print(f"live metrics: {self.live.url}", markup=False, highlight=False)
                self._log(f"live metrics on {self.live.url}")
        except BaseException:
            self.trackers.close()
            raise

    def __enter__(self) -> RunWatch:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(failed=exc_type is not None)

    def close(self, failed: bool = False) -> None:
        self.trackers.close(failed)
        if self.live is not None:
            if self.cfg.metrics_linger_s > 0 and not failed:
                self._log(f"live metrics stay up {self.cfg.metrics_linger_s:g} s more (logging.metrics_linger_s)")
                time.sleep(self.cfg.metrics_linger_s)
            self.live.close()
            self.live = None

    # ---- one iteration ----------------------------------------------------------------------
    def begin_iteration(self, iteration: int, requests: int) -> None:
        self.phases = []
        if self.live is not None:
            self.live.start_rollout(iteration, requests)

    @contextlib.contextmanager
    def phase(self, name: str, text: str | None = None):
        """A phase of the iteration (a slice on the timeline's driver track); with `text`, a
        long step that shows progress (spinner, or lines in a log file)."""
        if self.live is not None:
            self.live.set_phase(name)
        t0 = time.monotonic()
        try:
            if text is None:
                yield
            else:
                with step(self.console, text, self.cfg.progress_interval_s):
                    yield
        finally:
            self.phases.append((name, t0, time.monotonic()))
            if self.live is not None:
                self.live.set_phase(None)

    def rollout_progress(self, p: Progress) -> None:
        if self.live is not None:
            self.live.rollout_progress(p)

    def _rank_slices(self, record: dict) -> list[tuple[str, float, float]]:
        """Each trainer rank's train step, from the start of the training phase (ranks start together)."""
        start = next((a for name, a, _ in reversed(self.phases) if name == "training"), None)
        if start is None:
            return []
        return [(f"rank {r['rank']} on {r['node']}", start, start + r["train_s"]) for r in record.get("train_ranks") or []]

    def end_iteration(self, iteration: int, record: dict, batch: RolloutBatch, version: int,
                      rollout_file: Path) -> None:
        """The iteration's trace file and tracker step; the live endpoint's last reward and version."""
        if self.cfg.trace:
            dropped = [(d.instance, d.reason, d.at_s + batch.phases[0][1])
                       for d in batch.dropped] if batch.phases else []
            trace = build_trace(batch.chunks, batch.telemetry, [*self.phases, *batch.phases],
                                instances=[i["name"] for i in record.get("instances") or []], dropped=dropped,
                                nodes=record.get("instance_nodes"), ranks=self._rank_slices(record),
                                waits=batch.env_waits,
                                metadata={"iteration": iteration, "policy": record.get("policy"),
                                          "weight_version": record.get("weight_version")})
            write_trace(trace_path(rollout_file), trace)
        self.trackers.log_iteration(iteration, record, batch.samples)
        if self.live is not None:
            self.live.iteration_done(record, version)
