"""Plug points named by `module:object` paths: `task.reward` (a function), `task.loader` (a
function), `task.env` (an Environment class), `task.agent` (an async agent function or a command line,
served by the gateway: seer.rollout.agents), `scheduler.policy` (a Policy class) and `rollout.function`
(a RolloutFunction, seer.rollout.base); and the trainer's algorithm registry
(seer.trainer.algorithms), whose keys take a built-in name or a path: `trainer.advantage_estimator`,
`trainer.policy_loss`, `trainer.rollout_correction` and `trainer.reward_shaping` (functions).

One resolver for every plug point, so that each failure reads the same way and names its
config key: a path of the wrong form, a module that does not import, an attribute it lacks,
an object of the wrong kind, or arguments its constructor or function does not take.

Ground layer: imports nothing of seer's, so any subsystem may use it.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any


class PluginError(ValueError):
    """A `module:object` path that does not name a usable object; the message names the key."""


def is_path(value: str) -> bool:
    """Whether `value` is meant as a `module:object` path (rather than a built-in name)."""
    return isinstance(value, str) and ":" in value


def resolve(path: str, *, key: str, kind: Callable[[Any], bool] = callable, kind_name: str = "function",
            error: type[PluginError] = PluginError) -> Any:
    """Import `package.module:attr[.attr…]` and check it with `kind`.

    `key` names the plug point in every error (`task.reward`, `scheduler.policy`, …);
    `kind_name` says what `kind` accepts, for the wrong-kind error; `error` is the PluginError
    subclass raised (a subsystem's own, such as RewardSpecError).
    """
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.split(":")):
        raise error(f"{key} {path!r} must look like 'package.module:{_placeholder(kind_name)}'")
    module_name, attr = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise error(
            f"{key} {path!r}: cannot import module {module_name!r} ({e}); is its package installed, "
            "or its directory on PYTHONPATH?") from None
    except Exception as e:  # the module imports but its own code fails
        raise error(f"{key} {path!r}: importing module {module_name!r} failed: {type(e).__name__}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise error(f"{key} {path!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not kind(obj):
        what = obj.__name__ if isinstance(obj, type) else type(obj).__name__
        raise error(f"{key} {path!r}: {attr!r} is a {what}, not a {kind_name}")
    return obj


def check_arguments(fn: Callable, args: Mapping[str, Any], *, key: str, given: Mapping[str, Any] = {},
                    fn_key: str | None = None) -> None:
    """Raise PluginError unless `fn(**given, **args)` binds: nothing unknown, nothing missing.

    `args` are the user's (the `…_args` key, `key`); `given` the keywords seer always passes (a
    policy's chunk_size, …): a plug-in that does not take those is the fault of the path, which
    `fn_key` names (the plug point's key).
    """
    clash = sorted(set(args) & set(given))
    if clash:
        raise PluginError(f"{key}: {', '.join(clash)} {'is' if len(clash) == 1 else 'are'} set by seer, not here")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        sig.bind_partial(**given)
    except TypeError as e:
        raise PluginError(f"{fn_key or key}: {name} must take {', '.join(given)} as keyword arguments ({e})") from None
    try:
        sig.bind(**given, **args)
    except TypeError as e:
        params = [p for p in sig.parameters if p not in given]
        raise PluginError(f"{key}: {name} does not take these arguments ({e}); it takes: "
                          f"{', '.join(params) or 'none'}") from None


def _placeholder(kind_name: str) -> str:
    return "Class" if "class" in kind_name.lower() else "function"
