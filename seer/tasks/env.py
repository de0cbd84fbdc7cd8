"""Environments of multi-turn tasks, named by `task.env` (`module:Class`, or a built-in name).

One environment object per trajectory, made from its dataset record (`Class(prompt, reference,
**task.env_args)`). `reset` may add a first observation after the prompt; then each model turn
(its decoded text and token ids) goes to `step`, which returns the next observation, whether the
trajectory is done, and its reward when it is. Both may be `async`.

Steps run in workers that a timeout can kill (seer.tasks.workers, as rewards do), so a tool that
blocks or hangs never stalls the rollout. In process mode (the default) the environment object
travels to the worker with every call and back with its new state, so it must pickle; a step that
times out loses only that step (the worker is killed; the state before the step is kept). A step
that raises (anything: SystemExit and KeyboardInterrupt too), times out or kills its worker becomes
an error observation (`env.on_error: observe`) or ends the trajectory with reward 0 and the error
recorded (`end`); either way it is counted, and it never ends the run. The constructor and
`error_observation` run in the same workers, each within its own bound.

Observations are token ids: give `Observation.token_ids` to append exactly those, or `text` and
Seer tokenizes it once with the model's tokenizer. Nothing is ever re-tokenized from text.

What an environment returns is checked in the driver before anything uses it (a stranger's output
ends nothing but its own trajectory): an observation must be None, a str or an `Observation` whose
`token_ids` are ints within the tokenizer's vocabulary (`EnvRunner(vocab_size=...)`); a done step's
reward a finite real number (seer.tasks.reward.as_reward: NumPy scalars too, bool and 10**400 not).
A reply that breaks this is an error of that call, as a raise is; a done step with a bad reward ends
its trajectory with reward 0 and the error, whatever env.on_error says, as there is no turn to continue.
"""

from __future__ import annotations

import asyncio
import inspect
import numbers
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from seer.plugins import PluginError, check_arguments, is_path, resolve
from seer.tasks.reward import as_reward
from seer.tasks.workers import BOUNDS, Workers, run_cancelled

BUILTIN_ENVS = {"calculator": "seer.tasks.calculator:CalculatorEnv"}


class EnvSpecError(PluginError):
    """A `task.env` that does not name a usable environment class; the message names the key."""


@dataclass(frozen=True)
class Observation:
    """What the environment shows the model next: exact `token_ids`, or `text` to tokenize once."""

    text: str = ""
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Turn:
    """One model turn as the environment receives it."""

    index: int  # 1 for the first turn
    text: str  # decoded (special tokens skipped)
    token_ids: tuple[int, ...]
    reason: str  # why it ended: "stop_sequence", "eos", "turn_length"


@dataclass(frozen=True)
class StepResult:
    observation: Observation | str | None = None  # appended before the next turn (ignored when done)
    done: bool = False
    reward: float | None = None  # when done: the trajectory's reward


class Environment(ABC):
    """Base class of environments (subclassing it is optional; the methods are the interface; a
    subclass must implement `step`, which `task.env` checks at config load).

    `stop`: strings that end a model turn besides EOS (a tool-call end tag); the turn's text
    includes the stop string. `__init__`, `reset`, `step` and `error_observation` run in workers,
    each bounded (env.init_timeout_s, env.timeout_s).
    """

    stop: ClassVar[tuple[str, ...]] = ()

    def __init__(self, prompt: str, reference: dict) -> None:
        self.prompt, self.reference = prompt, reference

    async def reset(self) -> Observation | str | None:
        """The first observation after the prompt (None: the prompt alone)."""
        return None

    @abstractmethod
    async def step(self, turn: Turn) -> StepResult:
        """The environment's answer to one model turn: the next observation, or done and the reward."""

    def error_observation(self, error: str) -> Observation | str:
        """What the model sees after a step that raised or timed out (env.on_error: observe)."""
        return f"\n[error: {error}]\n"


@dataclass(frozen=True)
class EnvConfig:
    """Multi-turn limits and how environment steps run (used when `task.env` is set)."""

    max_turns: int = 32  # model turns per trajectory; the last ends it (reward 0) unless the environment is done
    # Tokens one model turn may generate (None: only the trajectory's budget, rollout.max_tokens,
    # which in multi-turn rollout covers every turn and observation)
    max_turn_tokens: int | None = None
    # Per environment call (reset, step, error_observation); past it the call is an error (null: no limit)
    timeout_s: float | None = BOUNDS.env_call_s
    # The constructor, once per trajectory (it may start a sandbox); past it the trajectory ends with an error
    init_timeout_s: float | None = BOUNDS.env_init_s
    on_error: Literal["observe", "end"] = "observe"  # a step that raised or timed out: error observation, or end with reward 0
    mode: Literal["process", "thread"] = "process"  # where steps run: killable worker processes, or threads
    workers: int = 8  # environment calls at once
    stop: tuple[str, ...] = ()  # stop sequences that end a turn besides the environment's own (its `stop`)

    def problems(self) -> list[tuple[str, str]]:
        out = []
        if self.max_turns < 1:
            out.append(("env.max_turns", f"must be >= 1, got {self.max_turns}"))
        if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
            out.append(("env.max_turn_tokens", f"must be >= 1 (or null), got {self.max_turn_tokens}"))
        if self.timeout_s is not None and not self.timeout_s > 0:
            out.append(("env.timeout_s", f"must be > 0 (or null: no limit), got {self.timeout_s}"))
        if self.init_timeout_s is not None and not self.init_timeout_s > 0:
            out.append(("env.init_timeout_s", f"must be > 0 (or null: no limit), got {self.init_timeout_s}"))
        if self.workers < 1:
            out.append(("env.workers", f"must be >= 1, got {self.workers}"))
        if any(not s for s in self.stop):
            out.append(("env.stop", "stop sequences must be non-empty strings"))
        return out


def env_path(spec: str) -> str:
    """A built-in name's `module:Class` path; a path as is."""
    if is_path(spec):
        return spec
    if spec not in BUILTIN_ENVS:
        raise EnvSpecError(f"task.env {spec!r}: not a built-in environment ({', '.join(BUILTIN_ENVS)}) "
                           "nor a 'package.module:Class' path")
    return BUILTIN_ENVS[spec]


def resolve_env(spec: str, args: dict | None = None) -> type:
    """The `task.env` class, checked to take (prompt, reference, **task.env_args) and to have a `step`."""
    cls = resolve(env_path(spec), key="task.env", kind=inspect.isclass, kind_name="class", error=EnvSpecError)
    if not callable(getattr(cls, "step", None)) or inspect.isabstract(cls):
        raise EnvSpecError(f"task.env {spec!r}: {cls.__name__} has no step(turn) method")
    stop = getattr(cls, "stop", ())
    if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop):
        raise EnvSpecError(f"task.env {spec!r}: {cls.__name__}.stop must be a tuple of non-empty strings, got {stop!r}")
    try:
        check_arguments(cls, args or {}, key="task.env_args", given={"prompt": "", "reference": {}}, fn_key="task.env")
    except PluginError as e:
        raise EnvSpecError(str(e)) from None
    return cls


def zero_reward(response_text: str, reference: dict) -> float:
    """task.reward of an environment task that sets none: an environment that ends without a reward scores 0."""
    return 0.0


# ---- running calls in workers ----------------------------------------------------------------

_imported: set[str] = set()


def _warm(path: str) -> None:
    """Runs once per fresh worker process: importing the environment's module is start-up."""
    if path not in _imported:
        resolve(path, key="task.env", kind=inspect.isclass, kind_name="class")
        _imported.add(path)


def _make(cls: type, prompt: str, reference: dict, args: dict) -> tuple[Any, None]:
    """Runs in a worker: the trajectory's environment, made as `_call` returns it."""
    return cls(prompt, reference, **args), None


def _call(env: Any, method: str, args: tuple) -> tuple[Any, Any]:
    """Runs in a worker: one method call (awaited on a fresh loop if async); the object comes back with its new state."""
    out = getattr(env, method)(*args)
    if inspect.isawaitable(out):
        async def wait():
            return await out
        out = asyncio.run(wait())
    return env, out


@dataclass
class EnvStats:
    calls: int = 0  # resets and steps
    errors: int = 0  # calls that raised, returned junk or timed out
    timeouts: int = 0
    pools_broken: int = 0  # process pools replaced because an environment's worker process died
    busy_s: float = 0.0  # summed wall time of calls
    error_samples: list[str] = field(default_factory=list)  # the first few error messages

    def as_dict(self) -> dict:
        return {"env_calls": self.calls, "env_errors": self.errors, "env_timeouts": self.timeouts,
                "env_pools_broken": self.pools_broken,
                "env_busy_s": round(self.busy_s, 3), "env_error_messages": list(self.error_samples)}


@dataclass(frozen=True)
class EnvReply:
    """One environment call's outcome, errors included (never raised)."""

    observation: Observation | None
    done: bool
    reward: float | None = None
    error: str | None = None


class EnvRunner:
    """Makes one environment per trajectory and runs its calls in `Workers` with the timeout.

    `vocab_size`: the tokenizer's, which every `Observation.token_ids` id must be below (None: only
    non-negative ids are checked)."""

    def __init__(self, spec: str, cfg: EnvConfig, args: dict | None = None,
                 log: Callable[[str], None] | None = None, vocab_size: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.path = env_path(spec)
        self.cls = resolve_env(spec, args)
        self.args = dict(args or {})
        self.cfg = cfg
        self.stop: tuple[str, ...] = tuple(dict.fromkeys([*getattr(self.cls, "stop", ()), *cfg.stop]))
        self._workers = Workers(cfg.workers, use_processes=cfg.mode == "process", timeout_s=cfg.timeout_s,
                                warm=_warm if cfg.mode == "process" else None, warm_args=(self.path,),
                                name="environment workers", log=log)
        self._envs: dict[str, Any] = {}
        self.stats = EnvStats()

    async def start(self, key: str, prompt: str, reference: dict) -> EnvReply:
        """Create trajectory `key`'s environment (in a worker, within env.init_timeout_s) and reset it."""
        name = f"{self.cls.__name__}()"
        env, _, error = await self._guarded(name, self.cfg.init_timeout_s, _make, self.cls, prompt, dict(reference),
                                            self.args)
        if error is not None:
            return await self._error(key, error)
        self._envs[key] = env
        return await self._run(key, "reset", ())

    async def step(self, key: str, turn: Turn) -> EnvReply:
        return await self._run(key, "step", (turn,))

    def discard(self, key: str) -> None:
        self._envs.pop(key, None)

    async def _guarded(self, what: str, timeout_s: float | None, fn, *args, count: bool = False) -> tuple[Any, Any, str | None]:
        """One call into user code in a worker: (env, out, None), or (None, None, the error). Whatever
        it raises is its error, except the run's own cancellation. `count`: a reset or a step (EnvStats)."""
        async with self._workers.slots():
            t0 = time.monotonic()
            try:
                env, out = await self._workers.run(fn, *args, timeout_s=timeout_s)
                return env, out, None
            except asyncio.TimeoutError:
                self.stats.timeouts += count
                return None, None, f"TimeoutError: {what} took longer than {timeout_s} s"
            except BaseException as e:  # the user's code may raise anything, SystemExit included
                if run_cancelled(e):
                    raise
                return None, None, f"{type(e).__name__}" + (f" in {what}" if what.endswith("()") else "") + f": {e}"
            finally:
                if count:
                    self.stats.calls += 1
                    self.stats.busy_s += time.monotonic() - t0
                self.stats.pools_broken = self._workers.pools_broken

    async def _run(self, key: str, method: str, args: tuple) -> EnvReply:
        env, out, error = await self._guarded(method, self.cfg.timeout_s, _call, self._envs[key], method, args,
                                              count=True)
        if error is not None:
            return await self._error(key, error)
        self._envs[key] = env
        try:
            return _reply(method, out, self.vocab_size)
        except _BadReward as e:  # the environment said done: there is no turn to continue
            return await self._error(key, str(e), end=True)
        except Exception as e:  # whatever a stranger's object does when looked at (a raising __bool__)
            return await self._error(key, _contract_error(e))

    async def _error(self, key: str, error: str, *, end: bool = False) -> EnvReply:
        self.stats.errors += 1
        if len(self.stats.error_samples) < 5:
            self.stats.error_samples.append(error)
        env = self._envs.get(key)
        if end or self.cfg.on_error == "end" or env is None:
            return EnvReply(None, True, 0.0, error)
        if callable(getattr(env, "error_observation", None)):  # user code: in a worker, bounded, guarded
            _, value, failed = await self._guarded("error_observation", self.cfg.timeout_s, _call, env,
                                                   "error_observation", (error,))
            if failed is None:
                try:
                    return EnvReply(_observation(value, self.vocab_size), False, None, error)
                except Exception:
                    pass
        # It raised, hung or returned junk too: the default observation.
        return EnvReply(_observation(Environment.error_observation(env, error)), False, None, error)

    def close(self) -> None:
        self._workers.close()


class _BadReward(TypeError):
    """A done step whose reward is not a finite real number."""


def _contract_error(e: Exception) -> str:
    return str(e) if isinstance(e, (TypeError, ValueError)) else f"{type(e).__name__} reading the reply: {e}"


def _observation(value: Any, vocab_size: int | None = None) -> Observation | None:
    """An environment's observation checked against the contract: token ids become a tuple of ints."""
    if value is None:
        return None
    if isinstance(value, str):
        return Observation(text=value)
    if not isinstance(value, Observation):
        raise TypeError(f"an observation must be an Observation, a str or None, got {type(value).__name__}")
    if value.token_ids is None:
        if not isinstance(value.text, str):
            raise TypeError(f"Observation.text must be a str, got {type(value.text).__name__}")
        return Observation(text=value.text)
    ids = value.token_ids
    if isinstance(ids, (str, bytes, bytearray)) or not (hasattr(ids, "__len__") and hasattr(ids, "__iter__")):
        raise TypeError(f"Observation.token_ids must be a sequence of int token ids, got {type(ids).__name__}")
    out = []
    for n, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"Observation.token_ids[{n}] is {type(t).__name__} {str(t)[:40]}; expected an int token id")
        t = int(t)
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            top = "" if vocab_size is None else f" (the tokenizer's ids are 0..{vocab_size - 1})"
            raise ValueError(f"Observation.token_ids[{n}] is {t}, not a token id{top}")
        out.append(t)
    return Observation(text=value.text if isinstance(value.text, str) else "", token_ids=tuple(out))


def _reply(method: str, out: Any, vocab_size: int | None = None) -> EnvReply:
    if method == "reset":
        return EnvReply(_observation(out, vocab_size), False)
    if not isinstance(out, StepResult):
        raise TypeError(f"step returned {type(out).__name__}; expected a StepResult")
    done = out.done
    if not (isinstance(done, numbers.Integral) or type(done).__name__ in ("bool", "bool_")):  # NumPy's too
        raise TypeError(f"StepResult.done is {type(done).__name__}; expected a bool")
    if done:
        reward = None
        if out.reward is not None:
            try:
                reward = as_reward(out.reward, "step (done)")
            except TypeError as e:
                raise _BadReward(f"StepResult.reward: {e}") from None
        return EnvReply(None, True, reward)
    return EnvReply(_observation(out.observation, vocab_size), False, None)
