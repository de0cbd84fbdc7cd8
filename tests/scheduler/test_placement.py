import math

import pytest

from sched_helpers import loads
from seer.scheduler.placement import (
    InstanceLoad, PlacementConfig, admits, choose_instance, free_tokens, kv_reservation,
)

CFG = PlacementConfig(kv_budget_fraction=1.0, block_size=1, affinity_gap_tokens=512)


def test_reservation_covers_context_plus_chunk_in_whole_blocks():
    assert kv_reservation(100, 28, PlacementConfig(block_size=16)) == 128
    assert kv_reservation(100, 29, PlacementConfig(block_size=16)) == 144


def test_most_free_kv_wins():
    ls = loads(10_000, 10_000, 10_000, reserved=(5000, 1000, 3000))
    assert choose_instance(ls, 100, None, CFG).name == "i1"


def test_budget_is_a_fraction_of_capacity_and_is_respected():
    cfg = PlacementConfig(kv_budget_fraction=0.5, block_size=1)
    ls = loads(10_000, reserved=(4000,))
    assert free_tokens(ls[0], cfg) == 1000
    assert admits(ls[0], 1000, cfg) and not admits(ls[0], 1001, cfg)
    assert choose_instance(ls, 1001, None, cfg) is None


def test_idle_instance_takes_a_chunk_larger_than_its_budget():
    ls = loads(1000)
    assert choose_instance(ls, 5000, None, CFG).name == "i0"


def test_prefix_instance_kept_within_affinity_gap_and_left_beyond_it():
    ls = loads(10_000, 10_000, reserved=(2000, 1500))  # i1 has 500 more free
    assert choose_instance(ls, 100, "i0", CFG).name == "i0"
    ls = loads(10_000, 10_000, reserved=(2000, 1400))  # 600 more free: past the 512 gap
    assert choose_instance(ls, 100, "i0", CFG).name == "i1"
    cfg0 = PlacementConfig(kv_budget_fraction=1.0, block_size=1, affinity_gap_tokens=0)
    ls = loads(10_000, 10_000, reserved=(2000, 1999))
    assert choose_instance(ls, 100, "i0", cfg0).name == "i1"


def test_prefix_instance_not_kept_when_it_cannot_admit():
    ls = loads(10_000, 10_000, reserved=(9_950, 9_900))
    assert choose_instance(ls, 90, "i0", CFG).name == "i1"


def test_unknown_capacity_is_unbounded_unless_max_running():
    ls = [InstanceLoad("a", 0, running=3), InstanceLoad("b", 1, running=1)]
    assert math.isinf(free_tokens(ls[0], CFG))
    assert choose_instance(ls, 10**9, None, CFG).name == "b"  # least running breaks the tie
    assert choose_instance(ls, 10, "a", CFG).name == "a"  # no evidence of a gap: stay
    capped = PlacementConfig(max_running=3)
    assert choose_instance(ls[:1], 10, None, capped) is None


def test_config_validation():
    with pytest.raises(ValueError):
        PlacementConfig(kv_budget_fraction=0)
    with pytest.raises(ValueError):
        PlacementConfig(max_running=0)
