"""The synchronous RL loop behind `seer-run --sync`.

Strictly on-policy: iteration i's rollout uses only weights of version i, every sample carries
that version, and the next rollout starts only after every instance serves the new weights.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from seer.config import RunConfig
from seer.metrics_log import MetricsLog, iteration_record, plot_iterations, summary_table
from seer.dgds.service import DGDSService
from seer.kvpool import KVPool
from seer.model import resolve_model
from seer.rollout.engine import RolloutEngine
from seer.fleet.instance import InstanceSpec
from seer.procs import cpu_sets, cuda_devices, free_port, gpu_sets
from seer.fleet.pool import InstancePool
from seer.types import PromptSpec, RolloutBatch, SamplingParams
from seer.fleet.weights import push_weights, require_version
from seer.tasks import RewardRunner, encode_prompts, iteration_prompts, load_task, max_context_of


class SyncLoop:
    def __init__(self, cfg: RunConfig, console: Console | None = None):
        self.cfg = cfg
        self.console = console or Console()
        self.run_dir = Path(cfg.run_dir)
        self.metrics = MetricsLog(self.run_dir)
        self.kv: KVPool | None = None

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

    def start_pool(self, kv: KVPool, dgds: DGDSService) -> InstancePool:
        cfg = self.cfg
        if cfg.instances.urls:
            return InstancePool.connect(list(cfg.instances.urls))
        # On a GPU machine each instance gets its share of the GPUs; on CPU, its share of the cores.
        gpus = cuda_devices()
        devices = ([(None, g) for g in gpu_sets(cfg.instances.count, gpus)] if gpus
                   else [(c, None) for c in cpu_sets(cfg.instances.count)])
        specs = [
            dgds.configure(kv.configure(InstanceSpec(
                name=f"inst{i}", model=str(self.model_dir), port=free_port(), cpus=cpus, gpus=gpus_i,
                dtype=cfg.model.dtype,
                max_model_len=self.max_model_len, kv_cache_bytes=cfg.instances.kv_cache_bytes,
                max_num_seqs=cfg.instances.max_num_seqs, seed=cfg.seed, extra_args=tuple(cfg.instances.extra_args),
                scheduling_policy="priority" if cfg.scheduler.engine_priority else "fcfs",
            )))
            for i, (cpus, gpus_i) in enumerate(devices)
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

    # ---- checkpoints ------------------------------------------------------------------------------
    def checkpoint_dir(self, iteration: int) -> Path:
        return self.run_dir / "checkpoints" / f"iter_{iteration:04d}"

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        """The newest complete checkpoint: its loop_state.json is written last, atomically."""
        found = sorted(self.run_dir.glob("checkpoints/iter_*/loop_state.json"))
        if not found:
            return None
        state = json.loads(found[-1].read_text())
        return int(state["iteration"]), found[-1].parent

    def save_checkpoint(self, trainer, iteration: int, version: int) -> None:
        d = self.checkpoint_dir(iteration)
        d.mkdir(parents=True, exist_ok=True)
        trainer.save_checkpoint(d)
        tmp = d / "loop_state.json.tmp"
        tmp.write_text(json.dumps({"iteration": iteration, "weight_version": version, "time": time.time()}))
        tmp.rename(d / "loop_state.json")
        done = sorted(p.parent for p in self.run_dir.glob("checkpoints/iter_*/loop_state.json"))
        for old in done[: -self.cfg.train.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    # ---- weights --------------------------------------------------------------------------------
    def sync_weights(self, pool: InstancePool, trainer, version: int, engine: RolloutEngine | None = None) -> float:
        """Export the trainer's weights and load them into every instance; returns seconds.

        An instance that died since the rollout (the push to it fails and it no longer answers
        /health) is dropped and the others are loaded; any other failure stops the run."""
        t0 = time.monotonic()
        self.revive_kv_master("before the weight update")
        out = self.run_dir / "weights" / f"v{version:05d}"
        trainer.export_hf(out)

        async def push():
            await push_weights(pool.clients, str(out), version, kv_pool=self.kv_pool_on)
            await require_version(pool.clients, version)

        self._on_live_instances(pool, engine, "during the weight update", push)
        for old in (self.run_dir / "weights").glob("v*"):
            if old != out:
                shutil.rmtree(old, ignore_errors=True)
        return time.monotonic() - t0

    def revive_kv_master(self, when: str) -> float | None:
        """A Mooncake master launched here that exited is started again on its own address; the
        store and the instances reconnect to it by themselves. Returns the seconds it took, or None."""
        if self.kv is None:
            return None
        took = self.kv.ensure_master()
        if took is not None:
            self.console.print(
                f"[yellow]the Mooncake master had exited ({when}): restarted on {self.kv.endpoints.master_address} "
                f"in {took:.1f} s; the pool starts empty and the instances reconnect[/]"
            )
        return took

    def drop_dead_instances(self, pool: InstancePool, engine: RolloutEngine | None, when: str) -> list[str]:
        """Drop the instances that no longer answer /health (between rollouts: during training or a
        weight update); the run goes on with the others. Returns the names dropped."""
        async def probe():
            try:
                return await asyncio.gather(*(c.healthy() for c in pool.clients))
            finally:
                await pool.aclose_clients()

        dead = [c.name for c, ok in zip(list(pool.clients), asyncio.run(probe())) if not ok]
        if dead and len(dead) == len(pool.clients):
            raise RuntimeError(f"every instance is down ({when}): {', '.join(dead)}")
        for name in dead:
            self.console.print(f"[yellow]instance {name} is not answering {when}: dropped[/]")
        self._remove_instances(pool, engine, dead)
        return dead

    def _remove_instances(self, pool: InstancePool, engine: RolloutEngine | None, names: list[str]) -> None:
        """Take lost instances out of the pool and the rollout engine; the run goes on with the rest."""
        if not names:
            return
        for name in names:
            pool.drop(name)
        if engine is not None:
            engine.remove(names)
        self.console.print(f"[yellow]continuing with {len(pool.clients)} instance(s): {', '.join(pool.names)}[/]")

    def check_versions(self, pool: InstancePool, version: int, engine: RolloutEngine | None = None) -> None:
        """Every instance serves `version`; a wrong version on a live instance stops the run."""
        self._on_live_instances(pool, engine, "before the rollout", lambda: require_version(pool.clients, version))

    def _on_live_instances(self, pool: InstancePool, engine: RolloutEngine | None, when: str, work) -> None:
        """Run `work()` (a coroutine over `pool.clients`); if it fails because instances died
        meanwhile (a push or a check to them fails, and they no longer answer /health), drop them
        and run it again on the others. Any other failure stops the run."""
        async def once():
            try:
                await work()
            finally:
                await pool.aclose_clients()

        try:
            asyncio.run(once())
        except Exception:
            if not self.drop_dead_instances(pool, engine, when):
                raise
            asyncio.run(once())

    # ---- the loop ---------------------------------------------------------------------------------
    def run(self, iterations: int | None = None, resume: bool = False) -> list[dict]:
        cfg = self.cfg
        iterations = iterations or cfg.iterations
        self.prepare()
        start_it, version = 0, 0
        ckpt = self.latest_checkpoint() if resume else None
        if resume and ckpt is None:
            self.console.print(f"[yellow]--resume: no checkpoint under {self.run_dir}; starting from iteration 0[/]")
        if ckpt is not None:
            start_it = ckpt[0] + 1
            self.metrics.truncate_after(ckpt[0])
        elif self.metrics.path.exists():
            self.metrics.path.unlink()
        trainer = None
        if cfg.train.enabled:
            with self.console.status("Loading the policy into the Megatron trainer"):
                from seer.trainer import Trainer

                trainer = Trainer(self.model_dir, replace(cfg.trainer, pad_token_id=self.tokenizer.pad_token_id or 0))
                if ckpt is not None:
                    trainer.load_checkpoint(ckpt[1])
                    version = trainer.iteration
        elif ckpt is not None:
            version = json.loads((ckpt[1] / "loop_state.json").read_text())["weight_version"]
        if ckpt is not None:
            self.console.print(f"resuming after iteration {ckpt[0]} from {ckpt[1]} (weight version {version})")
        records = self.metrics.records()
        if start_it >= iterations:
            self.console.print(f"nothing to do: {start_it} of {iterations} iterations already done")
            return records
        # Instances reached by URL bring their own KV configuration: no pool is launched for them.
        kv_cfg = replace(cfg.kvpool, enabled=cfg.kvpool.enabled and not cfg.instances.urls)
        dgds_cfg = replace(cfg.dgds, enabled=cfg.dgds.enabled and not cfg.instances.urls)
        with KVPool.start(kv_cfg, self.run_dir / "kvpool") as kv, DGDSService.start(dgds_cfg, self.run_dir / "dgds") as dgds:
            self.kv_pool_on = kv.enabled
            self.kv = kv
            pool = self.start_pool(kv, dgds)
            try:
                if trainer is not None and version > 0:
                    self.sync_weights(pool, trainer, version)  # resumed: serve the checkpoint's weights
                rewards = RewardRunner(
                    self.task.reward_spec, max_workers=cfg.rollout.reward_workers,
                    on_error=cfg.rollout.reward_error_policy,
                    decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
                )
                sampling = SamplingParams(
                    temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                    max_tokens=cfg.rollout.max_tokens, seed=cfg.rollout.sampling_seed,
                )
                # Without a KV pool a chunk that changes instance recomputes its prefix: placement keeps
                # chunks with their prefix (instances reached by URL are assumed to bring their own pool).
                sched_cfg = replace(cfg.scheduler, kv_pool=cfg.scheduler.kv_pool and (kv.enabled or bool(cfg.instances.urls)))
                engine = RolloutEngine(pool.clients, sched_cfg, rewards, group_size=cfg.rollout.group_size, sampling=sampling)
                with rewards:
                    for it in range(start_it, iterations):
                        self.drop_dead_instances(pool, engine, "before the rollout")
                        self.revive_kv_master("before the rollout")
                        if trainer is not None:
                            self.check_versions(pool, version, engine)  # strictly on-policy, or no rollout
                        batch = self.rollout(engine, it, weight_version=version)
                        self.drop_lost_instances(pool, engine, batch)
                        self.save_samples(batch, it)
                        extra = {"reward_error_total": rewards.stats.errors, "weight_version": version}
                        if trainer is not None:
                            with self.console.status(f"training on iteration {it}"):
                                tm = trainer.train_step(batch)
                                version = trainer.iteration
                            extra.update(train_s=tm.time_s, loss=tm.loss, pg_clipfrac=tm.pg_clipfrac, kl=tm.kl,
                                         entropy=tm.entropy, grad_norm=tm.grad_norm, zero_adv_fraction=tm.zero_adv_fraction,
                                         logprob_mismatch_mean=tm.logprob_mismatch_mean,
                                         logprob_mismatch_max=tm.logprob_mismatch_max)
                            with self.console.status(f"loading weight version {version} into the instances"):
                                extra["weight_sync_s"] = self.sync_weights(pool, trainer, version, engine)
                        # The record is written before the checkpoint that commits the iteration: a kill
                        # between the two leaves a record that --resume truncates, never a checkpoint
                        # whose iteration has no record.
                        rec = iteration_record(batch, extra)
                        self.metrics.append(rec)
                        records.append(rec)
                        if (it + 1) % cfg.train.checkpoint_every == 0 or it + 1 == iterations:
                            if trainer is not None:
                                self.save_checkpoint(trainer, it, version)
                            else:
                                self.save_loop_state(it, version)
                        self.console.print(summary_table([rec], title=f"iteration {it}"))
            finally:
                pool.close()
        if records:
            self.console.print(summary_table(records))
            plot = plot_iterations(records, self.run_dir / "iterations.png")
            self.console.print(f"metrics: {self.metrics.path}  plot: {plot}")
        return records

    def drop_lost_instances(self, pool: InstancePool, engine: RolloutEngine, batch: RolloutBatch) -> None:
        """Instances lost mid-rollout (their chunks already finished elsewhere) leave the pool."""
        dropped = batch.stats.extra.get("instances_dropped", [])
        for d in dropped:
            self.console.print(f"[yellow]instance {d['instance']} dropped at +{d['t']:.1f} s: {d['reason']}; "
                               f"its chunks continued on the others[/]")
        self._remove_instances(pool, engine, [d["instance"] for d in dropped])

    def save_loop_state(self, iteration: int, version: int) -> None:
        """Rollout-only runs: a checkpoint is just the loop position."""
        d = self.checkpoint_dir(iteration)
        d.mkdir(parents=True, exist_ok=True)
        (d / "loop_state.json").write_text(json.dumps({"iteration": iteration, "weight_version": version}))
