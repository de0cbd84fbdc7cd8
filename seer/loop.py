"""The synchronous RL loop behind `seer-run --sync`: a short driver over fleet, rollout, rewards
and trainer.

Strictly on-policy: iteration i's rollout uses only weights of version i, every sample carries
that version, and the next rollout starts only after every live instance serves the new weights.
Faults are the fleet's business (seer.fleet), bad input the job's (seer.job), numbers the
metrics log's (seer.metrics_log).
"""

from __future__ import annotations

import asyncio

from rich.console import Console

from seer.config import RunConfig
from seer.job import Job
from seer.metrics_log import SUMMARY_KEYS, iteration_record, plot_iterations, summary_table
from seer.rollout.base import DynamicSampling, RolloutRequest
from seer.rollout.dynamic import extra_groups_for
from seer.tasks import draw_prompts
from seer.watch.run import RunWatch


def run(cfg: RunConfig, console: Console | None = None, *, resume: bool = False, overwrite: bool = False) -> list[dict]:
    """Run `cfg.iterations` iterations (after the last checkpoint with `resume`); the records."""
    console = console or Console()
    job = Job.prepare(cfg, console, resume=resume, overwrite=overwrite)
    records = asyncio.run(_iterate(job))
    if records:
        console.print(summary_table(records))
        plot = plot_iterations(records, job.run.path / "iterations.png")
        console.print(f"metrics: {job.metrics.path}  plot: {plot}")
    return records


async def _iterate(job: Job) -> list[dict]:
    cfg, console = job.cfg, job.console
    start, version, ckpt = job.resume_point()
    # The prompt stream's next draw position: iteration * groups unless dynamic sampling moved it
    # (then the checkpoint holds it).
    cursor = ckpt.prompt_cursor if ckpt is not None and ckpt.prompt_cursor is not None \
        else start * cfg.rollout.groups_per_iteration
    records = job.metrics.records()
    if start >= cfg.iterations:
        console.print(f"nothing to do: {start} of {cfg.iterations} iterations already done")
        return records
    with RunWatch(cfg.logging, job.run.path, console, config=cfg.to_dict(), start_step=start, log=job.run.log) as watch, \
            job.cluster() as ray_cluster, job.trainer(ckpt) as trainer:
        async with await job.start_fleet(ray_cluster) as fleet:
            if trainer is not None:  # serve the weights this run starts from (a checkpoint's, or the base model's)
                if version > 0:
                    await job.push_weights(fleet, trainer, version, if_stale=True)
                else:
                    await fleet.weights.ensure(job.base_weights())
            with job.reward_runner() as rewards, job.env_runner() as env:
                async with job.agent_gateway(ray_cluster) as gateway:
                    for it in range(start, cfg.iterations):
                        record, version, cursor = await _one_iteration(job, fleet, rewards, env, trainer, it, version,
                                                                       cursor, watch, records[-1] if records else None,
                                                                       gateway)
                        records.append(record)
    return records


async def _one_iteration(job: Job, fleet, rewards, env, trainer, it: int, version: int, cursor: int, watch: RunWatch,
                         last: dict | None, gateway=None) -> tuple[dict, int, int]:
    cfg, console = job.cfg, job.console
    await fleet.prepare_rollout(version if trainer is not None else None)  # strictly on-policy, or no rollout
    n = cfg.rollout.groups_per_iteration
    prompts = draw_prompts(job.prompts, cursor, n, seed=cfg.seed)
    request = RolloutRequest(it, prompts, cfg.rollout.group_size, job.sampling(), version,
                             dynamic=_dynamic_sampling(job, cursor, last))
    watch.begin_iteration(it, len(prompts) * cfg.rollout.group_size)
    with watch.phase("rollout"), job.progress(it, len(prompts) * cfg.rollout.group_size,
                                               also=watch.rollout_progress) as on_progress:
        context = job.rollout_context(fleet, rewards, env, on_progress, gateway)
        batch = await job.rollout_fn(context, request)
    fleet.absorb_rollout_drops(batch.dropped)
    cursor += int(batch.stats.extra.get("prompts_consumed", n))
    job.write_rollouts(batch, it)
    extra = {"reward_error_total": rewards.stats.errors, "reward_pools_broken_total": rewards.stats.pools_broken,
             "weight_version": version}
    if trainer is not None and not any(s.response_ids for g in batch.train_groups() for s in g):
        # every sample failed for the system's reasons (Sample.failure): nothing of the policy's to
        # learn from, so the weights stay as they are (and the record says why)
        extra["train_skipped"] = "no sample to train on: every group lost its samples to system failures"
        job.run.log(f"iteration {it}: training skipped: {extra['train_skipped']}")
    elif trainer is not None:
        with watch.phase("training", f"training on iteration {it}"):
            tm = await asyncio.to_thread(trainer.train_step, batch)
        version = trainer.iteration
        extra.update(tm.record(), train_ranks=tm.extra.get("ranks"))
        with watch.phase("weight push", f"loading weight version {version} into the instances"):
            extra["weight_sync_s"] = await job.push_weights(fleet, trainer, version)
    # The record is written before the checkpoint that commits the iteration: a kill between the
    # two leaves a record that --resume truncates, never a checkpoint whose iteration has no record.
    if nodes := fleet.nodes():  # where each instance ran: the trace's tracks name their nodes
        extra["instance_nodes"] = nodes
    record = iteration_record(batch, extra)
    job.metrics.append(record)
    watch.end_iteration(it, record, batch, version, job.run.rollout_file(it))
    if (it + 1) % cfg.train.checkpoint_every == 0 or it + 1 == cfg.iterations:
        job.run.commit_checkpoint(it, version, cfg.train.keep_checkpoints,
                                  trainer.save_checkpoint if trainer is not None else None, prompt_cursor=cursor)
    console.print(summary_table([record], title=f"iteration {it}"))
    job.run.log(f"iteration {it}: " + ", ".join(f"{k} {record[k]}" for k in SUMMARY_KEYS if record.get(k) is not None))
    return record, version, cursor


def _dynamic_sampling(job: Job, cursor: int, last: dict | None) -> DynamicSampling | None:
    """rollout.dynamic_sampling's request: the stream from `cursor` on, and spare groups for the
    share of all-equal groups the previous iteration saw (none before the first)."""
    r, seed = job.cfg.rollout, job.cfg.seed
    if not r.dynamic_sampling:
        return None
    share = None
    if last and last.get("dynamic_groups_judged"):
        share = last["dynamic_all_equal_groups"] / last["dynamic_groups_judged"]
    return DynamicSampling(more_prompts=lambda offset, count: draw_prompts(job.prompts, cursor + offset, count, seed=seed),
                           extra_groups=extra_groups_for(r.groups_per_iteration, share),
                           max_groups=r.dynamic_sampling_max_groups or 0)
