"""The `logging` section: bad values are rejected before anything starts, naming the key."""

from __future__ import annotations

import pytest

from seer.config import ConfigError, load_config


def test_defaults_write_tensorboard_and_the_trace_and_serve_nothing():
    cfg = load_config(None, [])
    assert cfg.logging.backends == ("tensorboard",) and cfg.logging.trace and cfg.logging.metrics_port is None
    both = load_config(None, ["logging.backends=[tensorboard, mlflow]", "logging.metrics_port=9400"])
    assert both.logging.backends == ("tensorboard", "mlflow") and both.logging.metrics_port == 9400
    assert load_config(None, ["logging.backends=[]"]).logging.backends == ()


@pytest.mark.parametrize("override, key, why", [
    ("logging.backends=[tensorboard, comet]", "logging.backends[1]", "is not one of"),
    ("logging.backends=tensorboard", "logging.backends", "expected a list"),
    ("logging.backends=[wandb, wandb]", "logging.backends", "twice"),
    ("logging.metrics_port=70000", "logging.metrics_port", "0..65535"),
    ("logging.progress_interval_s=0", "logging.progress_interval_s", "> 0"),
    ("logging.samples_per_iteration=-1", "logging.samples_per_iteration", ">= 0"),
    ("logging.wandb_key=abc", "logging.wandb_key", "unknown config key"),
])
def test_bad_logging_settings_name_the_key(override, key, why):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert key in str(e.value) and why in str(e.value)
