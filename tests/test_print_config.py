"""`seer-run --print-config`: every key, its value and what it does, generated from the dataclasses."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import yaml

from seer.config import RunConfig, load_config
from seer.config_help import config_keys


def _leaves(obj, prefix=""):
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        yield from _leaves(v, f"{prefix}{f.name}.") if dataclasses.is_dataclass(v) else [prefix + f.name]


def test_every_key_of_every_section_has_a_description():
    keys = config_keys()
    assert [k.key for k in keys] == list(_leaves(RunConfig()))
    assert [k.key for k in keys if not k.description] == []  # a new field needs its comment


def test_the_printed_config_is_yaml_that_loads_back_to_the_same_config(tmp_path):
    r = subprocess.run([sys.executable, "-m", "seer.cli", "--print-config", "--set", "rollout.group_size=8",
                        "--set", "logging.backends=[tensorboard, mlflow]"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "  group_size: 8  # int: samples per prompt (G)\n" in r.stdout
    data = yaml.safe_load(r.stdout)
    assert data["rollout"]["group_size"] == 8 and data["logging"]["backends"] == ["tensorboard", "mlflow"]
    (tmp_path / "c.yaml").write_text(r.stdout)
    again = load_config(tmp_path / "c.yaml")
    assert again == load_config(None, ["rollout.group_size=8", "logging.backends=[tensorboard, mlflow]"])
