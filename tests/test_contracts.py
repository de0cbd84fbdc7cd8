"""Plug-in contracts: the rollout contract (seer.rollout.base) and what travels with a batch (saved
configs that name the default rollout's old path still resolve to it; dropped instances reach the
fleet and the iteration's record as a typed field), and the plug points seer.plugins documents."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import yaml

from seer.config import load_config
from seer.fleet import Fleet
from seer.job import MULTI_TURN_ROLLOUT, rollout_function
from seer.metrics_log import iteration_record
import seer.plugins
from seer.plugins import resolve
from seer.rollout.single_turn import single_turn_rollout
from seer.types import InstanceDrop, IterationStats, RolloutBatch

OLD_PATH = "seer.rollout.divided:divided_rollout"


def test_a_saved_config_naming_the_old_default_path_resolves_to_the_default_rollout(tmp_path):
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump({"rollout": {"function": OLD_PATH}}))
    cfg = load_config(saved)
    assert cfg.rollout.function == OLD_PATH
    assert resolve(rollout_function(cfg), key="rollout.function") is single_turn_rollout
    assert resolve(rollout_function(load_config()), key="rollout.function") is single_turn_rollout
    # Still "none chosen": a task with an environment switches it to multi-turn rollout, as before.
    assert rollout_function(load_config(saved, overrides=["task.name=calculator"])) == MULTI_TURN_ROLLOUT


def test_dropped_instances_travel_typed_to_the_record_and_the_fleet():
    stats = IterationStats(iteration=0, policy="context", wall_s=1.0, output_tokens=0, tokens_per_s=0.0,
                           tail_s=0.0, num_samples=0, preemptions=0)
    batch = RolloutBatch(samples=[], stats=stats, dropped=[InstanceDrop("inst1", "hung", 2.5)])
    assert iteration_record(batch)["instances_dropped"] == [{"instance": "inst1", "reason": "hung", "t": 2.5}]
    assert iteration_record(RolloutBatch(samples=[], stats=stats))["instances_dropped"] == []

    seen: list[str] = []
    fleet = Fleet.attach(["http://127.0.0.1:9", "http://127.0.0.1:10"], notify=seen.append)
    try:
        fleet.absorb_rollout_drops(batch.dropped)
        assert fleet.names == ["inst0"]
        assert [(d.instance, d.reason, d.when) for d in fleet.dropped] == [("inst1", "hung", "at +2.5 s of the rollout")]
        assert "inst1 dropped" in seen[0]
    finally:
        asyncio.run(fleet.aclose())


def test_seer_plugins_lists_every_plug_point_that_resolves_a_path():
    """Every `resolve(…, key="x.y")` in seer/ is a plug point; the module's docstring names them all."""
    keys = set()
    for path in Path(seer.plugins.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "resolve":
                keys |= {k.value.value for k in node.keywords if k.arg == "key" and isinstance(k.value, ast.Constant)}
    assert keys >= {"task.reward", "task.loader", "task.env", "scheduler.policy", "rollout.function"}
    assert not [k for k in keys if f"`{k}`" not in seer.plugins.__doc__]
