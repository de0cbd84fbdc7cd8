import pytest

from seer.config import ConfigError, build

from seer.scheduler import SchedulerConfig
from seer.scheduler.policies import ContextAware, GroupRoundRobin


def test_config_builds_the_named_policy_with_its_settings():
    cfg = build(SchedulerConfig, {"policy": "context", "chunk_size": 4096, "starvation_after": 7,
                                  "affinity_gap_tokens": 0, "kv_budget_fraction": 0.5}, "scheduler")
    p = cfg.build_policy()
    assert isinstance(p, ContextAware)
    assert (p.chunk_size, p.starvation_after) == (4096, 7)
    assert (p.placement.affinity_gap_tokens, p.placement.kv_budget_fraction) == (0, 0.5)
    rr = SchedulerConfig(policy="group_rr").build_policy()
    assert isinstance(rr, GroupRoundRobin) and rr.chunk_size is None


def test_default_is_full_seer_scheduling():
    assert SchedulerConfig().policy == "context" and SchedulerConfig().chunk_size == 8192


def test_unknown_setting_is_an_error():
    with pytest.raises(ConfigError, match="scheduler.chunk_sise"):
        build(SchedulerConfig, {"chunk_sise": 10}, "scheduler")
