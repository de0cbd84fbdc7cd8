"""The run configuration: YAML file + `--set key=value` overrides → typed, validated sections.

Each subsystem owns its section's dataclass (SchedulerConfig, TaskConfig, TrainerConfig, …);
this module only composes them, converts YAML values to the declared types, and rejects bad
input before anything starts, naming the offending key.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from seer.dgds.server.config import DGDSConfig
from seer.fleet.config import ClusterConfig, InstancesConfig
from seer.kvpool.config import KVPoolConfig
from seer.rollout.agents import AgentConfig, AgentSpec, AgentSpecError
from seer.rollout.gateway.config import GatewayConfig
from seer.scheduler.config import SchedulerConfig
from seer.scheduler.policies import PolicyError
from seer.tasks.dataset import DatasetError, TaskConfig, chat_template_text, resolve_loader
from seer.tasks.env import EnvConfig, EnvSpecError, resolve_env
from seer.tasks.reward import RewardRunner, RewardSpecError, resolve_reward_fn
from seer.tasks.workers import BOUNDS
from seer.trainer.config import TrainerConfig
from seer.types import SamplingParams
from seer.watch.config import LoggingConfig


class ConfigError(ValueError):
    """A config key is unknown, mistyped or out of range; the message names the key."""


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = None  # a local HF checkpoint dir; None = the embedded default model
    preset: str = "default"  # embedded default preset (when path is None)
    dtype: str = "float32"  # fp32 on CPU: bf16 is several times slower on AVX2-only cores (docs/bench-log.md)
    max_model_len: int | None = None  # None = the checkpoint's max_position_embeddings


@dataclass(frozen=True)
class RolloutConfig:
    groups_per_iteration: int = 16  # prompts per iteration (GRPO groups)
    group_size: int = 16  # samples per prompt (G)
    temperature: float = SamplingParams.temperature  # sampling temperature of the rollout
    top_p: float = SamplingParams.top_p  # nucleus sampling (1: off)
    top_k: int = SamplingParams.top_k  # top-k sampling (-1: off)
    max_tokens: int = 2048  # longest response, in tokens
    # Per-request sampling seeds (derived from this, the request id and the chunk index). None on
    # CPU: vLLM 0.32's CPU runner crashes ("CPU Generator does not use offset") when a seeded
    # request's prefill is split across steps, which long chunked contexts under load do.
    sampling_seed: int | None = None
    reward_workers: int = 2  # rewards computed at once (threads, or processes with reward_mode: process)
    # One iteration's rollout (the contract: seer.rollout.base.RolloutFunction); a custom rollout
    # plugs in here by path. With task.env set (or the calculator task) the default becomes
    # multi-turn rollout (seer.rollout.multi_turn:multi_turn_rollout). Saved configs' older
    # "seer.rollout.divided:divided_rollout" names the same function.
    function: str = "seer.rollout.single_turn:single_turn_rollout"
    reward_error_policy: Literal["zero", "abort"] = "zero"  # a raising reward: score 0 and go on, or abort
    # Rewards run on threads (rollout.reward_workers at once) or, for CPU-heavy rewards that hold
    # the GIL, in as many spawned processes. A call past reward_timeout_s scores as a reward error
    # (0, or the iteration aborts, by reward_error_policy) instead of stalling the run.
    reward_mode: Literal["thread", "process"] = "thread"
    # Per reward call; past it the sample is a reward error. 300 s by default (UserCodeBounds):
    # generous, but a hung reward no longer stalls the run forever (null: no limit).
    reward_timeout_s: float | None = BOUNDS.reward_s
    # DAPO's dynamic sampling, on-policy: groups whose rewards are all equal are replaced by fresh
    # groups of the data stream within the iteration, on the same weights, until the batch holds
    # groups_per_iteration informative groups (seer.rollout.dynamic; docs/trainer.md "Dynamic sampling").
    dynamic_sampling: bool = False
    dynamic_sampling_max_groups: int | None = None  # the most groups an iteration dispatches; None: 4 x groups_per_iteration

    def reward_runner(self, reward: str, decode=None, log=None) -> RewardRunner:
        """The RewardRunner these `rollout.reward_*` settings describe, for `reward` ("module:function");
        `log` hears of worker processes that died (the run's run.log)."""
        return RewardRunner(reward, max_workers=self.reward_workers, on_error=self.reward_error_policy,
                            use_processes=self.reward_mode == "process", timeout_s=self.reward_timeout_s,
                            decode=decode, log=log)


@dataclass(frozen=True)
class TrainConfig:
    enabled: bool = True  # false: rollout and reward only (no trainer, no weight updates)
    checkpoint_every: int = 1  # iterations between checkpoints (what --resume continues from)
    keep_checkpoints: int = 2  # newest checkpoints kept; older ones are deleted


# GRPO step size for the embedded 3M-parameter model: an LLM's 1e-6 would leave it untouched, and
# a much larger one collapses its reward (README, "The default run, measured").
EMBEDDED_MODEL_TRAINER = {"lr": 2e-4, "mini_batches": 2}


@dataclass(frozen=True)
class RunConfig:
    # None: a new runs/<date>-<time> per run (runs/latest points at it); a directory that already
    # holds a run is refused unless the run resumes it or overwrites it (seer.rundir).
    run_dir: str | None = None
    seed: int = 0  # seeds the prompt order of user datasets and the instances' sampling
    iterations: int = 5  # rollout + training steps to run (a resumed run continues up to this many)
    model: ModelConfig = field(default_factory=ModelConfig)
    # The embedded default trains on a fixed 16-prompt set (every iteration, all of it), so that
    # iterations differ by the policy and the sampling, not by which prompts they drew. A user
    # dataset (task.dataset) is used whole, cycled in seeded epochs.
    task: TaskConfig = field(default_factory=lambda: TaskConfig(num_prompts=16))
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    instances: InstancesConfig = field(default_factory=InstancesConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  # where launched instances run (Ray)
    # Chunks of 1/8 of the maximum generation length, the paper's proportion (8192 of 64K).
    scheduler: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(chunk_size=256))
    kvpool: KVPoolConfig = field(default_factory=lambda: KVPoolConfig(capacity_bytes=1024 * 2**20))
    dgds: DGDSConfig = field(default_factory=DGDSConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # Tuned for the embedded default model; a user checkpoint (model.path) falls back to
    # TrainerConfig's own defaults, which suit LLMs, unless the config sets these keys.
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(**EMBEDDED_MODEL_TRAINER))
    logging: LoggingConfig = field(default_factory=LoggingConfig)  # trackers, timeline, /metrics, progress lines
    env: EnvConfig = field(default_factory=EnvConfig)  # multi-turn limits and workers (with task.env)
    agent: AgentConfig = field(default_factory=AgentConfig)  # timeouts, containment and concurrency (with task.agent)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)  # the OpenAI-compatible server (with task.agent)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---- loading ------------------------------------------------------------------------------

def load_config(path: str | os.PathLike | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Defaults ← YAML file ← `key.path=value` overrides, then type conversion and validation."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from e
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping of settings, not {type(loaded).__name__}")
        data = loaded or {}
    for item in overrides:
        apply_override(data, item)
    cfg = build(RunConfig, data, "")
    if cfg.model.path is not None:  # a user checkpoint: the embedded model's tuning does not apply
        given = data.get("trainer") or {}
        plain = TrainerConfig()
        cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(
            cfg.trainer, **{k: getattr(plain, k) for k in EMBEDDED_MODEL_TRAINER if k not in given}))
    if (cfg.task.name == "calculator" and not (cfg.task.dataset or cfg.task.loader) and cfg.model.path is None
            and "preset" not in (data.get("model") or {})):
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, preset="calc"))  # the task's own model
    validate(cfg)
    return cfg


def apply_override(data: dict, item: str) -> None:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value (for example scheduler.chunk_size=256)")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"--set {item!r}: empty key component")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {item!r}: {part!r} is not a section")
    node[parts[-1]] = value


def build(cls, data: Any, prefix: str, base: Any = None):
    """Instantiate dataclass `cls` from a mapping, converting each value to its declared type.

    Keys not given keep `base`'s values (when given), so a partial section such as
    `--set task.reward=…` keeps the defaults the enclosing config chose for that section
    (RunConfig's 16-prompt task), not the section class's own.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config key {prefix or '<root>'!r}: expected a mapping of settings, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            where = f"{prefix}.{key}" if prefix else str(key)
            raise ConfigError(f"unknown config key {where!r}; known keys here: {', '.join(sorted(known))}")
    kwargs = {}
    for name, value in data.items():
        where = f"{prefix}.{name}" if prefix else name
        if dataclasses.is_dataclass(hints[name]):
            kwargs[name] = build(hints[name], value, where, _field_default(known[name]) if base is None else getattr(base, name))
        else:
            kwargs[name] = _convert(hints[name], value, where)
    try:
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config section {prefix or '<root>'!r}: {e}") from e


def _field_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _convert(tp, value: Any, key: str):
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(a, value, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"config key {key!r}: {value!r} fits none of {tp}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"config key {key!r}: {value!r} is not one of {list(args)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {key!r}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ConfigError(f"config key {key!r}: expected {len(args)} values, got {len(value)}")
            return tuple(_convert(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        inner = args[0] if args else Any
        items = [_convert(inner, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key {key!r}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"config key {key!r}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"config key {key!r}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"config key {key!r}: expected a string, got {value!r}")
    return value


# ---- validation -----------------------------------------------------------------------------

def _require(ok: bool, key: str, why: str) -> None:
    if not ok:
        raise ConfigError(f"config key {key!r}: {why}")


def validate(cfg: RunConfig) -> None:
    """Range and cross-field checks: everything that would otherwise fail minutes into a run."""
    _require(cfg.iterations >= 1, "iterations", f"must be >= 1, got {cfg.iterations}")
    if cfg.model.max_model_len is not None:
        _require(cfg.model.max_model_len >= 16, "model.max_model_len", f"must be >= 16, got {cfg.model.max_model_len}")
    _require(cfg.model.dtype in ("float32", "bfloat16", "float16", "auto"), "model.dtype",
             f"must be float32, bfloat16, float16 or auto, got {cfg.model.dtype!r}")
    if cfg.model.path is not None:
        _require(Path(cfg.model.path).is_dir(), "model.path", f"{cfg.model.path} is not a directory")
    r = cfg.rollout
    _require(r.group_size >= 2, "rollout.group_size", f"GRPO needs at least 2 samples per group, got {r.group_size}")
    _require(r.groups_per_iteration >= 1, "rollout.groups_per_iteration", f"must be >= 1, got {r.groups_per_iteration}")
    _require(r.max_tokens >= 1, "rollout.max_tokens", f"must be >= 1, got {r.max_tokens}")
    if cfg.model.max_model_len is not None:
        _require(r.max_tokens < cfg.model.max_model_len, "rollout.max_tokens",
                 f"{r.max_tokens} leaves no room for a prompt within model.max_model_len={cfg.model.max_model_len}")
    _require(r.temperature >= 0, "rollout.temperature", f"must be >= 0, got {r.temperature}")
    _require(0 < r.top_p <= 1, "rollout.top_p", f"must be in (0, 1], got {r.top_p}")
    if r.dynamic_sampling_max_groups is not None:
        _require(r.dynamic_sampling_max_groups >= r.groups_per_iteration, "rollout.dynamic_sampling_max_groups",
                 f"must be >= rollout.groups_per_iteration ({r.groups_per_iteration}), got {r.dynamic_sampling_max_groups}")
    _require(r.reward_workers >= 1, "rollout.reward_workers", f"must be >= 1, got {r.reward_workers}")
    if r.reward_timeout_s is not None:
        _require(r.reward_timeout_s > 0, "rollout.reward_timeout_s", f"must be > 0 (or null: no limit), got {r.reward_timeout_s}")
    i = cfg.instances
    if not i.urls and not (cfg.cluster.address or os.environ.get("RAY_ADDRESS")):  # a one-node Ray here
        cores = len(os.sched_getaffinity(0))
        _require(i.count >= 1, "instances.count", f"must be >= 1, got {i.count}")
        _require(i.count <= cores, "instances.count",
                 f"{i.count} instances need at least one CPU core each, but this machine allows {cores}")
    for n, u in enumerate(i.urls):
        _require(u.startswith(("http://", "https://")), f"instances.urls[{n}]", f"{u!r} is not an http(s) URL")
    if i.kv_cache_bytes is not None:
        _require(i.kv_cache_bytes > 0, "instances.kv_cache_bytes", f"must be > 0, got {i.kv_cache_bytes}")
    _require(i.max_num_seqs >= 1, "instances.max_num_seqs", f"must be >= 1, got {i.max_num_seqs}")
    s = cfg.scheduler
    try:
        policy = s.check_policy()  # a built-in or a Policy subclass by path, taking policy_args
    except PolicyError as e:
        raise ConfigError(str(e)) from None
    _require(s.chunk_size > 0, "scheduler.chunk_size", f"must be > 0, got {s.chunk_size}")
    _require(0 < s.kv_budget_fraction <= 1, "scheduler.kv_budget_fraction", f"must be in (0, 1], got {s.kv_budget_fraction}")
    _require(not policy.reads_true_lengths, "scheduler.policy",
             f"{s.policy} needs true lengths from a previous run and is for benchmarks only (seer-bench)")
    from seer.trainer.algorithms import AlgorithmError, check_config  # torch-free: names and arguments only

    try:
        check_config(cfg.trainer, r.max_tokens)
    except AlgorithmError as e:
        raise ConfigError(str(e)) from None
    _require(cfg.train.checkpoint_every >= 1, "train.checkpoint_every", f"must be >= 1, got {cfg.train.checkpoint_every}")
    t = cfg.task
    _require(t.dataset is None or t.loader is None, "task.loader",
             "set task.dataset (a JSONL file) or task.loader (a function returning records), not both")
    _require(t.loader is not None or not t.loader_args, "task.loader_args", "given without task.loader")
    if t.dataset is not None:
        _require(Path(t.dataset).is_file(), "task.dataset", f"{t.dataset} does not exist")
        _require(bool(t.reward) or bool(t.env), "task.reward",
                 "a JSONL dataset needs a reward function 'module:function' (or an environment, task.env)")
    _require(t.env is not None or not t.env_args, "task.env_args", "given without task.env")
    _require(t.agent is not None or not t.agent_args, "task.agent_args", "given without task.agent")
    _require(t.agent is None or t.env is None, "task.agent",
             "an agent plays the task through the gateway instead of an environment: set task.agent or task.env, not both")
    try:  # plug-ins resolve now, not minutes into the run
        if t.loader is not None:
            _require(bool(t.reward) or bool(t.env), "task.reward",
                     "a task.loader dataset needs a reward function 'module:function' (or an environment, task.env)")
            resolve_loader(t.loader, t.loader_args)
        if t.reward:
            resolve_reward_fn(t.reward)
        if t.env:
            resolve_env(t.env, t.env_args)
        chat_template_text(t.chat_template)
    except (DatasetError, RewardSpecError, EnvSpecError) as e:
        raise ConfigError(str(e)) from None
    for key, why in [*cfg.env.problems(), *cfg.agent.problems(), *cfg.gateway.problems()]:
        raise ConfigError(f"config key {key!r}: {why}")
    if t.agent is not None:
        # Not implemented for agents (docs/agents-gateway.md, "What agents cannot use"): refused, not ignored.
        _require(not r.dynamic_sampling or r.function not in (RolloutConfig.function, "seer.rollout.divided:divided_rollout"),
                 "rollout.dynamic_sampling",
                 "true is not supported with task.agent: the gateway rollout runs each iteration's sessions in "
                 "one round and cannot replace all-equal groups; set rollout.dynamic_sampling: false")
        _require(cfg.trainer.reward_shaping == "none", "trainer.reward_shaping",
                 f"{cfg.trainer.reward_shaping!r} is not supported with task.agent: shaping measures a sample's "
                 "response tokens against rollout.max_tokens, but an agent sample's response holds tool results "
                 "and user turns between its calls, and rollout.max_tokens bounds each call, not the session; "
                 "set trainer.reward_shaping: none")
        try:
            AgentSpec.parse(t.agent, cfg.agent.timeout_s, args=t.agent_args, cfg=cfg.agent)
        except AgentSpecError as e:
            raise ConfigError(str(e)) from None
    _require(t.num_prompts >= 1, "task.num_prompts", f"must be >= 1, got {t.num_prompts}")
    for key, why in cfg.logging.problems():
        raise ConfigError(f"config key {key!r}: {why}")
