"""What a run needs before its first rollout, and the run-wide pieces the loop strings together.

Everything that can fail on bad input (the run directory, the model, the dataset, prompts that do
not fit, the reward and rollout functions) fails in `Job.prepare`, before any process starts.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from seer.config import ConfigError, RolloutConfig, RunConfig
from seer.fleet import Fleet, LaunchSettings
from seer.metrics_log import MetricsLog
from seer.plugins import resolve
from seer.rollout.base import RolloutContext, RolloutFunction
from seer.rundir import RunDir, atomic_write_text, resolve_run_dir
from seer.scheduler import SchedulerConfig
from seer.tasks import RewardRunner, Task, encode_prompts, load_task, max_context_of
from seer.types import PromptSpec, RolloutBatch, SamplingParams, WeightsRef
from seer.watch.progress import step


@dataclass
class Job:
    cfg: RunConfig
    console: Console
    run: RunDir
    metrics: MetricsLog
    model_dir: Path
    tokenizer: object
    task: Task
    prompts: list[PromptSpec]
    max_model_len: int
    rollout_fn: RolloutFunction
    resume: bool = False  # continue after the run directory's last checkpoint

    @classmethod
    def prepare(cls, cfg: RunConfig, console: Console, *, resume: bool = False, overwrite: bool = False) -> Job:
        from transformers import AutoTokenizer

        from seer.model import resolve_model

        rollout_fn = resolve(rollout_function(cfg), key="rollout.function")
        run = RunDir(resolve_run_dir(cfg.run_dir, resume=resume, overwrite=overwrite))
        with step(console, "Preparing the model (first use builds and warm-starts the embedded default)",
                  cfg.logging.progress_interval_s):
            model_dir = resolve_model(cfg.model.path or cfg.model.preset, progress=False)
        if cfg.train.enabled:
            _check_trainable(Path(model_dir))
            _check_parallel_sizes(cfg, Path(model_dir))
        if cfg.trainer.captures_routing:
            _check_routing_replay(Path(model_dir), "routing_replay" if cfg.trainer.routing_replay else "routing_capture")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        max_model_len = cfg.model.max_model_len or max_context_of(model_dir)
        task = load_task(cfg.task)
        prompts = encode_prompts(task.records, tokenizer, max_model_len, min_new_tokens=cfg.rollout.max_tokens)
        atomic_write_text(run.path / "config.yaml", yaml.safe_dump({**cfg.to_dict(), "run_dir": str(run.path)},
                                                                   sort_keys=False))
        console.print(f"model [bold]{model_dir}[/]  task [bold]{task.name}[/] ({len(prompts)} prompts)  "
                      f"run dir [bold]{run.path}[/]")
        run.log(f"run started: model {model_dir}, task {task.name} ({len(prompts)} prompts), "
                f"{cfg.iterations} iterations, resume={resume}")
        return cls(cfg, console, run, MetricsLog(run.path), Path(model_dir), tokenizer, task, prompts,
                   max_model_len, rollout_fn, resume)

    # ---- where to start -------------------------------------------------------------------
    def resume_point(self):
        """(first iteration, weight version, checkpoint or None) after the last committed checkpoint."""
        ckpt = self.run.latest_checkpoint() if self.resume else None
        if self.resume and ckpt is None:
            self.console.print(f"[yellow]--resume: no checkpoint under {self.run.path}; starting from iteration 0[/]")
        if ckpt is not None:
            self.metrics.truncate_after(ckpt.iteration)
            self.console.print(f"resuming after iteration {ckpt.iteration} from {ckpt.path} "
                               f"(weight version {ckpt.weight_version})")
        elif self.metrics.path.exists():
            self.metrics.path.unlink()
        return (ckpt.iteration + 1 if ckpt else 0), (ckpt.weight_version if ckpt else 0), ckpt

    @contextlib.contextmanager
    def cluster(self):
        """The run's Ray: joined (cluster.address / RAY_ADDRESS) or started here for the run; it
        places the instances and the trainer's ranks. Attached instances without training need none."""
        cfg = self.cfg
        if cfg.instances.urls and not cfg.train.enabled:
            yield None
            return
        from seer.fleet.ray_cluster import RayCluster

        ray_cluster = RayCluster.connect(cfg.cluster, self.run.path / "logs")
        if ray_cluster.started_here:
            msg = f"a one-node Ray on {ray_cluster.node_ip} in {ray_cluster.startup_s:.1f} s"
            self.console.print(msg)
            self.run.log(msg)
        try:
            yield ray_cluster
        finally:
            ray_cluster.close()

    @contextlib.contextmanager
    def trainer(self, ckpt):
        """The trainer's ranks (a Ray worker group; world size 1 is one rank), loaded from the model
        or from `ckpt`; None when training is off."""
        if not self.cfg.train.enabled:
            yield None
            return
        t = self.cfg.trainer
        with step(self.console, f"Loading the policy into the Megatron trainer ({t.world_size} rank(s))",
                  self.cfg.logging.progress_interval_s):
            from seer.trainer.group import TrainerGroup

            pad = self.tokenizer.pad_token_id or 0
            group = TrainerGroup.start(self.model_dir, replace(t, pad_token_id=pad,
                                                                  max_response_tokens=self.cfg.rollout.max_tokens))
        try:
            self.run.log(group.describe())
            self.console.print(group.describe())
            if ckpt is not None:
                group.load_checkpoint(ckpt.path)
                if group.iteration != ckpt.weight_version:
                    raise RuntimeError(f"{ckpt.path} holds trainer iteration {group.iteration}, but the run "
                                       f"committed weight version {ckpt.weight_version} with it")
            yield group
        finally:
            group.close()

    # ---- run-wide pieces -------------------------------------------------------------------
    async def start_fleet(self, ray_cluster=None) -> Fleet:
        """The run's instances: attached (instances.urls), or launched on `ray_cluster` (the job's
        Ray, from `cluster()`), with the KV pool and DGDS."""
        cfg = self.cfg
        def notify(msg: str) -> None:
            self.run.log(msg)
            self.console.print(f"[yellow]{msg}[/]" if "dropped" in msg or "exited" in msg else msg)

        if cfg.instances.urls:
            fleet = Fleet.attach(list(cfg.instances.urls), notify)
            if cfg.trainer.captures_routing:
                await fleet.enable_routing()
            return fleet
        n = cfg.instances.count
        instances = cfg.instances
        if cfg.trainer.captures_routing and "--enforce-eager" not in instances.extra_args:
            # the capture hooks run in Python inside the forward pass: a compiled model skips them
            instances = replace(instances, extra_args=[*instances.extra_args, "--enforce-eager"])
        with step(self.console, f"Starting {n} vLLM instances (logs in {self.run.path / 'logs'})",
                  cfg.logging.progress_interval_s):
            fleet = await Fleet.launch(
                instances, cfg.kvpool, cfg.dgds,
                LaunchSettings(str(self.model_dir), self.max_model_len, cfg.model.dtype, cfg.seed,
                               "priority" if cfg.scheduler.engine_priority else "fcfs"),
                self.run.path, notify, cfg.cluster, ray=ray_cluster)
            if cfg.trainer.captures_routing:
                await fleet.enable_routing()
        self.console.print(f"{n} instances ready")
        self.run.log(f"{n} instances ready: {', '.join(fleet.names)}")
        return fleet

    def scheduler_config(self, fleet: Fleet) -> SchedulerConfig:
        # Without a KV pool a chunk that changes instance recomputes its prefix, so placement keeps
        # chunks with their prefix; attached instances are assumed to bring their own pool.
        s = self.cfg.scheduler
        return replace(s, kv_pool=s.kv_pool and (fleet.kv_pool_on or not fleet.launched))

    def sampling(self) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_tokens=r.max_tokens,
                              seed=r.sampling_seed)

    def reward_runner(self) -> RewardRunner:
        """rollout.reward_workers / reward_mode / reward_timeout_s / reward_error_policy (RolloutConfig.reward_runner)."""
        return self.cfg.rollout.reward_runner(
            self.task.reward_spec, decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
            log=self.run.log)

    @contextlib.contextmanager
    def env_runner(self):
        """The run's environments and their workers (task.env), or None for a single-turn task."""
        if self.task.env is None or self.cfg.task.agent is not None:  # agents replace the environment
            yield None
            return
        from seer.tasks.env import EnvRunner

        runner = EnvRunner(self.task.env, self.cfg.env, self.task.env_args, log=self.run.log,
                           vocab_size=len(self.tokenizer))  # an observation's token ids are checked against it
        try:
            yield runner
        finally:
            runner.close()

    def rollout_context(self, fleet: Fleet, rewards: RewardRunner, env, on_progress, gateway=None) -> RolloutContext:
        tok = self.tokenizer
        gw, agents = gateway if gateway is not None else (None, None)
        return RolloutContext(fleet.backends, self.scheduler_config(fleet), rewards, on_progress, env=env,
                              decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
                              encode=lambda text: list(tok(text, add_special_tokens=False)["input_ids"]),
                              gateway=gw, agents=agents)

    @contextlib.asynccontextmanager
    async def agent_gateway(self, ray_cluster=None):
        """The run's OpenAI-compatible gateway and its agents (task.agent), or (None, None): the server
        binds the driver's cluster address (gateway.host overrides) and lives as long as the run."""
        if self.cfg.task.agent is None:
            yield None
            return
        from seer.model.chat import chat_format, max_token_chars
        from seer.rollout.agents import AgentRunner, AgentSpec
        from seer.rollout.gateway import Gateway, GatewayLimits, GatewayServer

        cfg, tok = self.cfg, self.tokenizer
        model_type = json.loads((self.model_dir / "config.json").read_text()).get("model_type", "")
        fmt = chat_format(tok, model_type)
        g = cfg.gateway
        limits = GatewayLimits(max_request_bytes=g.max_request_bytes, max_call_tokens=cfg.rollout.max_tokens,
                               max_context_tokens=self.max_model_len, max_token_chars=max_token_chars(tok))
        gw = Gateway(fmt, lambda text: list(tok(text, add_special_tokens=False)["input_ids"]),
                     lambda ids: tok.decode(ids, skip_special_tokens=False),
                     lambda ids: tok.decode(ids, skip_special_tokens=True), tok.eos_token or "", g.model_name, limits)
        host = g.host or (ray_cluster.node_ip if ray_cluster is not None else "127.0.0.1")
        server = GatewayServer(gw, host, g.port)
        base_url = await server.start()
        agents = AgentRunner(AgentSpec.parse(cfg.task.agent, cfg.agent.timeout_s, args=cfg.task.agent_args, cfg=cfg.agent),
                             cfg.agent.max_concurrent, log_dir=self.run.path / "logs" / "agents")
        self.run.log(f"gateway: {base_url} serving {g.model_name!r} ({fmt.name} chat format), agent {cfg.task.agent}")
        self.console.print(f"gateway on {base_url} (agent {cfg.task.agent})")
        try:
            yield gw, agents
        finally:
            await agents.close()
            await server.close()

    async def push_weights(self, fleet: Fleet, trainer, version: int, *, if_stale: bool = False) -> float | None:
        """The trainer's `version` into every live instance (seer.fleet.push chooses the transport:
        an HF directory in the run, older exports removed, or Ray objects). Seconds, export included;
        `if_stale`: only where some instance serves another version (None if none does)."""
        return await fleet.weights.push_trained(trainer, version, self.run.weights_dir(version),
                                                exported=self.run.prune_weights, if_stale=if_stale)

    def base_weights(self) -> WeightsRef:
        return WeightsRef(0, str(self.model_dir))

    def write_rollouts(self, batch: RolloutBatch, iteration: int) -> None:
        """Per-sample lengths and rewards (what benchmarks and the oracle read back), no token ids."""
        atomic_write_text(self.run.rollout_file(iteration), "".join(json.dumps({
            "group_id": s.group_id, "sample_index": s.sample_index, "prompt_index": s.prompt.index,
            "request_id": s.request_id, "num_tokens": s.num_tokens, "finish_reason": s.finish_reason,
            "reward": s.reward, "reward_error": s.reward_error, "failure": s.failure, "weight_version": s.weight_version,
            "instances": s.instances, "start_time": s.start_time, "finish_time": s.finish_time,
            "turns": s.turns,
        }) + "\n" for s in batch.samples))

    @contextlib.contextmanager
    def progress(self, iteration: int, total: int, log_every_s: float = 10.0, also=None):
        """A progress bar for one rollout (plain lines every logging.progress_interval_s when
        stdout is not a terminal), a line in run.log every `log_every_s`; yields the callback the
        scheduler calls (which also calls `also`, e.g. the live metrics)."""
        last, shown = [0.0], [f"0/{total} samples"]

        def report(p) -> str:
            rate = p.output_tokens / p.elapsed_s if p.elapsed_s > 0 else 0.0
            info = f"{p.output_tokens} tok, {rate:.0f} tok/s, {p.running_chunks} running"
            shown[0] = f"{p.finished}/{total} samples, {info}"
            if time.monotonic() - last[0] >= log_every_s or p.finished == total:
                last[0] = time.monotonic()
                self.run.log(f"rollout {iteration}: {shown[0]}")
            if also is not None:
                also(p)
            return info

        if not self.console.is_terminal:
            with step(self.console, f"rollout {iteration}", self.cfg.logging.progress_interval_s, lambda: shown[0]):
                yield report
            return
        with Progress(TextColumn(f"rollout {iteration}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=self.console,
                      transient=True) as bar:
            task = bar.add_task("rollout", total=total, info="")

            def on_progress(p):
                bar.update(task, completed=p.finished, info=report(p))

            yield on_progress


DEFAULT_ROLLOUT = RolloutConfig.function
# The default's path in run directories saved before it moved (seer.rollout.divided aliases it):
# such a config still counts as "none chosen".
OLD_DEFAULT_ROLLOUT = "seer.rollout.divided:divided_rollout"
MULTI_TURN_ROLLOUT = "seer.rollout.multi_turn:multi_turn_rollout"
GATEWAY_ROLLOUT = "seer.rollout.gateway:gateway_rollout"


def rollout_function(cfg: RunConfig) -> str:
    """rollout.function, or multi-turn rollout when the task has an environment and none was chosen."""
    multi_turn = cfg.task.env is not None or (cfg.task.name == "calculator" and not (cfg.task.dataset or cfg.task.loader))
    chosen = cfg.rollout.function not in (DEFAULT_ROLLOUT, OLD_DEFAULT_ROLLOUT)
    if cfg.task.agent is not None and not chosen:
        return GATEWAY_ROLLOUT
    return MULTI_TURN_ROLLOUT if multi_turn and not chosen else cfg.rollout.function


def _check_trainable(model_dir: Path) -> None:
    """Refuse a checkpoint the Megatron trainer cannot reproduce now, not after Ray, the instances
    and the pool have started: the trainer's own reading of config.json (HFArch) is the one list."""
    from seer.trainer.hf_mapping import HFArch, supported_summary

    try:
        HFArch.from_config(json.loads((model_dir / "config.json").read_text()))
    except (NotImplementedError, KeyError, TypeError, ValueError) as e:
        what = f"config.json lacks {e}" if isinstance(e, KeyError) else str(e)
        raise ConfigError(f"the trainer cannot train {model_dir}: {what}. Supported: {supported_summary()} "
                          f"(docs/models.md); --train off rolls it out without training") from None


def _check_routing_replay(model_dir: Path, key: str = "routing_replay") -> None:
    """Routing replay needs routers: refuse a dense checkpoint before anything starts."""
    arch = json.loads((model_dir / "config.json").read_text())
    experts = max(int(arch.get(k) or 0) for k in ("num_experts", "num_local_experts", "n_routed_experts"))
    if experts <= 0:
        raise ConfigError(f"trainer.{key}: true needs a mixture-of-experts model, but {model_dir} is a "
                          f"dense {arch.get('model_type', 'model')} (no num_experts in its config.json); "
                          f"leave {key} off for dense models")


def _check_parallel_sizes(cfg: RunConfig, model_dir: Path) -> None:
    """Tensor parallelism splits attention by KV group and MLP columns: refuse sizes that do not divide."""
    tp = cfg.trainer.tensor_parallel
    if tp == 1:
        return
    arch = json.loads((model_dir / "config.json").read_text())
    heads = int(arch["num_attention_heads"])
    kv = int(arch.get("num_key_value_heads") or heads)
    bad = [f"{name} {n}" for name, n in (("num_key_value_heads", kv), ("num_attention_heads", heads),
                                          ("intermediate_size", int(arch["intermediate_size"]))) if n % tp]
    if bad:
        raise ConfigError(f"trainer.tensor_parallel={tp} does not divide the model's {', '.join(bad)} ({model_dir})")
