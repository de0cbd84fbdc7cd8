import math

import pytest

from sched_helpers import loads
from seer.scheduler.placement import (
    InstanceLoad, PlacementConfig, admits, choose_instance, free_tokens, kv_reservation, reservation_block_size,
)

CFG = PlacementConfig(kv_budget_fraction=1.0, block_size=1, affinity_gap_tokens=512, affinity_gap_fraction=0.0)


def test_reservation_covers_context_plus_chunk_in_whole_blocks():
    # a chunk from context 100 sampling 29 tokens computes KV for 128 positions (not its last token)
    assert kv_reservation(100, 29, PlacementConfig(block_size=16)) == 128
    assert kv_reservation(100, 30, PlacementConfig(block_size=16)) == 144


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
    cfg0 = PlacementConfig(kv_budget_fraction=1.0, block_size=1, affinity_gap_tokens=0, affinity_gap_fraction=0.0)
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


def test_reservations_round_to_the_block_size_the_instances_report():
    """vLLM's CPU backend allocates KV in 128-token blocks: a 16-token rounding undercounts every
    request by up to 112 tokens, and a full instance then preempts (seen in bench.compare)."""
    cfg = PlacementConfig(block_size=16)
    ls = loads(10_000, 10_000)
    assert reservation_block_size(ls, cfg) == 16  # nothing reported: the config's
    for load in ls:
        load.block_size = 128
    assert reservation_block_size(ls, cfg) == 128
    assert kv_reservation(60, 256, cfg, 128) == 384 and kv_reservation(60, 256, cfg) == 320
    assert kv_reservation(60, 197, cfg, 128) == 256  # a block-aligned chunk (chunks.chunk_max_tokens)
    ls[1].block_size = 256  # mixed instances: round to the coarsest, so no instance is undercounted
    assert reservation_block_size(ls, cfg) == 256


def test_affinity_gap_scales_with_capacity():
    """On a 16K-token instance a 512-token gap is noise that new requests even out; a chunk leaves
    its prefix (a re-prefill without the pool) only for a gap of a quarter of the capacity."""
    cfg = PlacementConfig(kv_budget_fraction=1.0, block_size=1)  # defaults: 512 tokens or 25%
    ls = loads(16_384, 16_384, reserved=(12_000, 8_000))  # i1 freer by 4000 < 4096
    assert choose_instance(ls, 100, "i0", cfg).name == "i0"
    ls = loads(16_384, 16_384, reserved=(12_000, 7_800))  # 4200 > 4096: move
    assert choose_instance(ls, 100, "i0", cfg).name == "i1"
    ls = loads(1000, 1000, reserved=(900, 100))  # small instances: the token floor applies
    assert choose_instance(ls, 10, "i0", cfg).name == "i1"
    with pytest.raises(ValueError):
        PlacementConfig(affinity_gap_fraction=1.5)


def test_an_idle_instance_takes_a_chunk_from_a_busy_prefix_instance():
    cfg = PlacementConfig(kv_budget_fraction=1.0, block_size=1)
    ls = loads(16_384, 16_384, reserved=(1000, 0))  # i0 runs another chunk, i1 runs nothing
    assert choose_instance(ls, 100, "i0", cfg).name == "i1"
    ls[0].reserved_tokens, ls[0].running = 0, 0  # both idle: stay with the prefix
    assert choose_instance(ls, 100, "i0", cfg).name == "i0"


def test_without_a_kv_pool_a_chunk_stays_with_its_prefix_or_waits_for_it():
    """Moving without a pool recomputes the whole prefix: stay whatever the gap, and wait for the
    prefix instance when it is full, unless another instance is idle or the prefix one is down."""
    nopool = PlacementConfig(kv_budget_fraction=1.0, block_size=1, affinity_gap_tokens=512,
                             affinity_gap_fraction=0.0, kv_pool=False)
    ls = loads(10_000, 10_000, reserved=(2000, 100))  # i1 has 1900 more free: the pool config moves
    assert choose_instance(ls, 100, "i0", CFG).name == "i1"
    assert choose_instance(ls, 100, "i0", nopool).name == "i0"
    full = loads(10_000, 10_000, reserved=(9_950, 9_900))  # i0 cannot take 90 more, i1 can
    assert choose_instance(full, 90, "i0", CFG).name == "i1"
    assert choose_instance(full, 90, "i0", nopool) is None  # wait for i0
    assert choose_instance(full, 90, None, nopool).name == "i1"  # a new request has no prefix to wait for
    full[0].down = "dead"
    assert choose_instance(full, 90, "i0", nopool).name == "i1"
    idle = loads(10_000, 10_000, reserved=(9_950, 0))
    assert choose_instance(idle, 90, "i0", nopool).name == "i1"  # an idle instance still takes it
    busy_home = loads(10_000, 10_000, reserved=(5_000, 0))
    assert choose_instance(busy_home, 90, "i0", nopool).name == "i1"
