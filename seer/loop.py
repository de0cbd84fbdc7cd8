"""The synchronous RL loop behind `seer-run --sync`.

Strictly on-policy: iteration i's rollout uses only weights of version i, every sample carries
that version, and the next rollout starts only after every instance serves the new weights.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from seer.config import RunConfig
from seer.metrics_log import MetricsLog, iteration_record, plot_iterations, summary_table
from seer.model import resolve_model
from seer.rollout.engine import RolloutEngine
from seer.rollout.instance import InstanceSpec, cpu_sets, free_port
from seer.rollout.pool import InstancePool
from seer.rollout.types import PromptSpec, RolloutBatch, SamplingParams
from seer.tasks import RewardRunner, encode_prompts, iteration_prompts, load_task, max_context_of


class SyncLoop:
    def __init__(self, cfg: RunConfig, console: Console | None = None):
        self.cfg = cfg
        self.console = console or Console()
        self.run_dir = Path(cfg.run_dir)
        self.metrics = MetricsLog(self.run_dir)

    # ---- set-up ---------------------------------------------------------------------------
    def prepare(self) -> None:
        """Everything that can fail on bad input, before any instance starts."""
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        with self.console.status("Preparing the model (first use builds and warm-starts the embedded default)"):
            self.model_dir = resolve_model(cfg.model.path or cfg.model.preset, progress=False)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.max_model_len = cfg.model.max_model_len or max_context_of(self.model_dir)
        self.task = load_task(cfg.task)
        self.prompts: list[PromptSpec] = encode_prompts(
            self.task.records, self.tokenizer, self.max_model_len, min_new_tokens=cfg.rollout.max_tokens
        )
        self.console.print(
            f"model [bold]{self.model_dir}[/]  task [bold]{self.task.name}[/] ({len(self.prompts)} prompts)  "
            f"run dir [bold]{self.run_dir}[/]"
        )

    def start_pool(self) -> InstancePool:
        cfg = self.cfg
        if cfg.instances.urls:
            return InstancePool.connect(list(cfg.instances.urls))
        specs = [
            InstanceSpec(
                name=f"inst{i}", model=str(self.model_dir), port=free_port(), cpus=cpus, dtype=cfg.model.dtype,
                max_model_len=self.max_model_len, kv_cache_bytes=cfg.instances.kv_cache_bytes,
                max_num_seqs=cfg.instances.max_num_seqs, seed=cfg.seed, extra_args=tuple(cfg.instances.extra_args),
            )
            for i, cpus in enumerate(cpu_sets(cfg.instances.count))
        ]
        t0 = time.monotonic()
        with self.console.status(f"Starting {len(specs)} vLLM instances (logs in {self.run_dir / 'logs'})"):
            pool = InstancePool.launch(
                specs, self.run_dir / "logs", cfg.instances.startup_timeout_s,
                on_ready=lambda n, s: self.console.print(f"  {n} ready in {s:.0f} s"),
            )
        self.console.print(f"{len(specs)} instances ready in {time.monotonic() - t0:.0f} s")
        return pool

    # ---- one iteration -------------------------------------------------------------------------
    def rollout(self, engine: RolloutEngine, iteration: int, weight_version: int) -> RolloutBatch:
        prompts = iteration_prompts(self.prompts, iteration, self.cfg.rollout.groups_per_iteration, seed=self.cfg.seed)
        total = len(prompts) * self.cfg.rollout.group_size
        with Progress(
            TextColumn(f"rollout {iteration}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), console=self.console, transient=True,
        ) as bar:
            task = bar.add_task("rollout", total=total, info="")

            def on_progress(p):
                rate = p.output_tokens / p.elapsed_s if p.elapsed_s > 0 else 0.0
                bar.update(task, completed=p.finished, info=f"{p.output_tokens} tok, {rate:.0f} tok/s, {p.running_chunks} running")

            return asyncio.run(engine.run(prompts, iteration, weight_version=weight_version, on_progress=on_progress))

    def save_samples(self, batch: RolloutBatch, iteration: int) -> None:
        """Per-sample lengths and rewards (what benchmarks and the oracle read back), no token ids."""
        out = self.run_dir / "rollouts" / f"iter_{iteration:04d}.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as f:
            for s in batch.samples:
                f.write(json.dumps({
                    "group_id": s.group_id, "sample_index": s.sample_index, "prompt_index": s.prompt.index,
                    "request_id": s.request_id, "num_tokens": s.num_tokens, "finish_reason": s.finish_reason,
                    "reward": s.reward, "reward_error": s.reward_error, "weight_version": s.weight_version,
                    "instances": s.instances, "start_time": s.start_time, "finish_time": s.finish_time,
                }) + "\n")

    # ---- the loop ---------------------------------------------------------------------------------
    def run(self, iterations: int | None = None) -> list[dict]:
        cfg = self.cfg
        iterations = iterations or cfg.iterations
        self.prepare()
        if self.metrics.path.exists():
            self.metrics.path.unlink()
        records: list[dict] = []
        pool = self.start_pool()
        try:
            rewards = RewardRunner(
                self.task.reward_spec, max_workers=cfg.rollout.reward_workers,
                on_error=cfg.rollout.reward_error_policy,
                decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
            )
            sampling = SamplingParams(
                temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                max_tokens=cfg.rollout.max_tokens, seed=cfg.seed,
            )
            engine = RolloutEngine(pool.clients, cfg.scheduler, rewards, group_size=cfg.rollout.group_size, sampling=sampling)
            with rewards:
                for it in range(iterations):
                    batch = self.rollout(engine, it, weight_version=0)
                    self.save_samples(batch, it)
                    rec = iteration_record(batch, {"reward_error_total": rewards.stats.errors})
                    self.metrics.append(rec)
                    records.append(rec)
                    self.console.print(summary_table([rec], title=f"iteration {it}"))
        finally:
            pool.close()
        if records:
            self.console.print(summary_table(records))
            plot = plot_iterations(records, self.run_dir / "iterations.png")
            self.console.print(f"metrics: {self.metrics.path}  plot: {plot}")
        return records
