"""The `logging` section: which trackers a run writes, its timeline, its live endpoint, progress lines."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Literal

Backend = Literal["tensorboard", "wandb", "mlflow"]
# The module and pip package each backend needs (W&B and MLflow are the `watch` extra).
PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
            "mlflow": ("mlflow", "mlflow-skinny")}


@dataclass(frozen=True)
class LoggingConfig:
    # Experiment trackers fed once per iteration: TensorBoard event files in <run_dir>/tensorboard,
    # W&B (offline with WANDB_MODE=offline; its key only from WANDB_API_KEY), MLflow.
    backends: tuple[Backend, ...] = ("tensorboard",)
    samples_per_iteration: int = 4  # decoded responses shown per iteration (TensorBoard text, W&B table)
    wandb_project: str = "seer"  # the W&B project runs are logged to
    wandb_run_name: str | None = None  # None: the run directory's name
    # None: a local file store in <run_dir>/mlruns; else any MLflow tracking URI (file:, http://…).
    mlflow_tracking_uri: str | None = None
    mlflow_experiment: str = "seer"  # the MLflow experiment runs are logged to
    trace: bool = True  # rollouts/iter_N.trace.json per iteration: the chunk timeline for Perfetto
    # Prometheus /metrics served by the driver on metrics_host; None: off, 0: any free port (printed).
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"  # where /metrics binds (loopback: only this machine can scrape it)
    # /metrics stays up this long after the run ends, so that a last scrape (Prometheus: every
    # scrape_interval) sees the final iteration's numbers; 0: it stops with the run.
    metrics_linger_s: float = 0.0
    # When stdout is not a terminal (a log file), long steps print a line this often instead of a spinner.
    progress_interval_s: float = 15.0

    def problems(self) -> list[tuple[str, str]]:
        """(key, why) for every setting that cannot work; the config loader reports them."""
        out = []
        if len(set(self.backends)) != len(self.backends):
            out.append(("logging.backends", f"lists a backend twice: {list(self.backends)}"))
        for b in self.backends:
            module, package = PACKAGES[b]
            if importlib.util.find_spec(module) is None:
                out.append(("logging.backends", f"{b} needs the {package} package, which is not installed: "
                                                f"pip install {package} (or pip install 'seer[watch]'), or drop {b}"))
        if self.samples_per_iteration < 0:
            out.append(("logging.samples_per_iteration", f"must be >= 0, got {self.samples_per_iteration}"))
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            out.append(("logging.metrics_port", f"must be a port in 0..65535 (0: any free one) or null, got {self.metrics_port}"))
        if self.metrics_linger_s < 0:
            out.append(("logging.metrics_linger_s", f"must be >= 0, got {self.metrics_linger_s}"))
        if self.progress_interval_s <= 0:
            out.append(("logging.progress_interval_s", f"must be > 0, got {self.progress_interval_s}"))
        if not self.wandb_project:
            out.append(("logging.wandb_project", "must not be empty"))
        return out
