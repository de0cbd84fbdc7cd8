"""Experiment tracking: every number of an iteration's metrics.jsonl line, histograms and a few
decoded samples, into TensorBoard, W&B and MLflow, at step = iteration.

Each backend's library is imported only when the run turns it on. A resumed run writes into the
same logs (the same W&B and MLflow run, ids kept in <run_dir>/tracking.json) at the iteration it
resumes from; TensorBoard is told to drop what a killed run logged after its last checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import time
from collections.abc import Sequence
from pathlib import Path

from seer.rundir import atomic_write_text
from seer.types import Sample
from seer.watch.config import PACKAGES, LoggingConfig


class TrackingError(RuntimeError):
    """A tracking backend cannot start; the message says which one and what to do."""


def scalars(record: dict) -> dict[str, float]:
    """Every number of a metrics.jsonl record; nested keys joined by '/', instances by name.
    Lists (the KV timeline, weight versions) are histograms or nothing, not scalars."""
    out: dict[str, float] = {}

    def walk(key: str, v) -> None:
        if isinstance(v, bool):
            out[key] = float(v)
        elif isinstance(v, (int, float)):
            if math.isfinite(v):
                out[key] = float(v)
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(f"{key}/{k}", x)

    for k, v in record.items():
        if k == "iteration":
            continue  # it is the step
        if k == "instances" and isinstance(v, list):
            for inst in v:
                walk(f"instances/{inst.get('name')}", {kk: vv for kk, vv in inst.items() if kk != "name"})
        elif not isinstance(v, list):
            walk(k, v)
    return out


def histograms(record: dict, samples: Sequence[Sample]) -> dict[str, list[float]]:
    """Response lengths, rewards and each instance's sampled KV usage over the rollout."""
    out = {"response_length": [float(s.num_tokens) for s in samples],
           "reward": [float(s.reward) for s in samples if s.reward is not None]}
    for point in record.get("kv_timeline") or []:
        out.setdefault(f"kv_usage/{point['instance']}", []).append(float(point["kv_usage"]))
    return {k: v for k, v in out.items() if v}


def pick_samples(samples: Sequence[Sample], n: int) -> list[Sample]:
    """The first sample of the first `n` groups (one per prompt: different tasks, not G copies)."""
    firsts = [s for s in samples if s.sample_index == 0] or list(samples)
    return sorted(firsts, key=lambda s: s.group_id)[:n]


def sample_markdown(s: Sample) -> str:
    reward = "-" if s.reward is None else f"{s.reward:.3f}"
    return (f"**group {s.group_id}, sample {s.sample_index}**: reward {reward}, {s.num_tokens} tokens, "
            f"finish {s.finish_reason}\n\n```\n{s.prompt.text}\n```\n\n```\n{s.response_text}\n```")


class TensorBoard:
    """Event files under <run_dir>/tensorboard, written with tensorboard's own writer."""

    def __init__(self, logdir: Path, start_step: int):
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._pb = event_pb2
        self.writer = EventFileWriter(str(logdir), flush_secs=5)
        if start_step > 0:  # a resumed run: readers drop what a killed run logged at steps >= this
            self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=start_step,
                                                  session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)))

    def log(self, step: int, record: dict, samples: Sequence[Sample], shown: Sequence[Sample]) -> None:
        from tensorboard.compat.proto import summary_pb2

        values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in scalars(record).items()]
        values += [summary_pb2.Summary.Value(tag=k, histo=_histogram_proto(v))
                   for k, v in histograms(record, samples).items()]
        if shown:
            values.append(_text_value("samples", "\n\n---\n\n".join(sample_markdown(s) for s in shown)))
        self.writer.add_event(self._pb.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)))
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        self.writer.close()


def _histogram_proto(values: list[float], bins: int = 30):
    import numpy as np
    from tensorboard.compat.proto import summary_pb2

    a = np.asarray(values, dtype=float)
    counts, edges = np.histogram(a, bins=bins)
    return summary_pb2.HistogramProto(min=float(a.min()), max=float(a.max()), num=float(a.size), sum=float(a.sum()),
                                      sum_squares=float((a * a).sum()), bucket_limit=[float(e) for e in edges[1:]],
                                      bucket=[float(c) for c in counts])


def _text_value(tag: str, text: str):
    from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
    tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[text.encode()],
                                    tensor_shape=tensor_shape_pb2.TensorShapeProto())
    return summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=tensor)


class WandB:
    """A W&B run in <run_dir>/wandb (offline with WANDB_MODE=offline); the API key only from the
    environment (WANDB_API_KEY), never from the config."""

    def __init__(self, cfg: LoggingConfig, run_path: Path, ids: dict, config: dict, name: str):
        import wandb

        self.wandb = wandb
        ids.setdefault("wandb_run_id", secrets.token_hex(4))
        try:
            self.run = wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or name, id=ids["wandb_run_id"],
                                  resume="allow", dir=str(run_path), config=config, reinit="create_new",
                                  settings=wandb.Settings(console="off", silent=True))
        except Exception as e:
            raise TrackingError(f"W&B could not start ({e}); set WANDB_MODE=offline to log locally, or give "
                                f"WANDB_API_KEY in the environment, or remove wandb from logging.backends") from e

    def log(self, step: int, record: dict, samples: Sequence[Sample], shown: Sequence[Sample]) -> None:
        data: dict = dict(scalars(record))
        data.update({k: self.wandb.Histogram(v) for k, v in histograms(record, samples).items()})
        if shown:
            data["samples"] = self.wandb.Table(
                columns=["group", "sample", "reward", "tokens", "prompt", "response"],
                data=[[s.group_id, s.sample_index, s.reward, s.num_tokens, s.prompt.text, s.response_text] for s in shown])
        self.run.log(data, step=step)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


_MLFLOW_KEY = re.compile(r"[^A-Za-z0-9_\-./ ]")


class MLflow:
    """An MLflow run (a local file store in <run_dir>/mlruns unless logging.mlflow_tracking_uri)."""

    def __init__(self, cfg: LoggingConfig, run_path: Path, ids: dict, config: dict, name: str):
        from mlflow.tracking import MlflowClient

        self.uri = cfg.mlflow_tracking_uri or (run_path / "mlruns").resolve().as_uri()
        if self.uri.startswith("file:"):  # MLflow 3 refuses its file store unless asked: this run asks
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=self.uri)
        if "mlflow_run_id" in ids:
            self.run_id = ids["mlflow_run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            exp = self.client.get_experiment_by_name(cfg.mlflow_experiment)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(cfg.mlflow_experiment)
            self.run_id = self.client.create_run(exp_id, run_name=name, tags={"seer.run_dir": str(run_path)}).info.run_id
            ids["mlflow_run_id"] = self.run_id
            self._log_params(config)

    def _log_params(self, config: dict) -> None:
        from mlflow.entities import Param

        flat: dict[str, str] = {}

        def walk(key: str, v) -> None:
            if isinstance(v, dict):
                for k, x in v.items():
                    walk(f"{key}.{k}" if key else k, x)
            else:
                flat[_MLFLOW_KEY.sub("_", key)] = str(v)[:500]

        walk("", config)
        items = [Param(k, v) for k, v in flat.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log(self, step: int, record: dict, samples: Sequence[Sample], shown: Sequence[Sample]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_MLFLOW_KEY.sub("_", k), v, now, step) for k, v in scalars(record).items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])
        if shown:
            self.client.log_text(self.run_id, "\n\n---\n\n".join(sample_markdown(s) for s in shown),
                                 f"samples/iter_{step:04d}.md")

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


class Trackers:
    """The backends `logging.backends` names, fed together once per iteration."""

    def __init__(self, cfg: LoggingConfig, run_path: Path, *, config: dict, start_step: int):
        self.cfg = cfg
        self.backends: list = []
        ids_file = run_path / "tracking.json"
        ids = json.loads(ids_file.read_text()) if ids_file.exists() else {}
        name = run_path.resolve().name
        try:
            for b in cfg.backends:
                try:
                    if b == "tensorboard":
                        self.backends.append(TensorBoard(run_path / "tensorboard", start_step))
                    elif b == "wandb":
                        self.backends.append(WandB(cfg, run_path, ids, config, name))
                    elif b == "mlflow":
                        self.backends.append(MLflow(cfg, run_path, ids, config, name))
                except ImportError as e:
                    raise TrackingError(f"logging.backends lists {b}, but its package is not installed ({e}): "
                                        f"pip install {PACKAGES[b][1]}, or remove {b} from logging.backends") from e
        except BaseException:
            self.close(failed=True)
            raise
        if ids:
            atomic_write_text(ids_file, json.dumps(ids))

    def log_iteration(self, step: int, record: dict, samples: Sequence[Sample]) -> None:
        shown = pick_samples(samples, self.cfg.samples_per_iteration)
        for b in self.backends:
            b.log(step, record, samples, shown)

    def close(self, failed: bool = False) -> None:
        """`failed`: the run stopped on an error or an interrupt (W&B and MLflow mark it so)."""
        for b in self.backends:
            b.close(failed)
        self.backends = []
