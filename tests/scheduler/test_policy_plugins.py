"""`scheduler.policy` by `module:Class` path, `scheduler.policy_args`, and the MoveEveryChunk test policy."""

import asyncio

import pytest

from sched_helpers import fake_cluster, prompts
from seer.config import ConfigError, load_config
from seer.scheduler import RolloutDriver, SchedulerConfig
from seer.scheduler.policies import BUILTIN, POLICIES, ContextAware, MoveEveryChunk, PolicyError, check_policy
from seer.types import SamplingParams

PLUG = "tests.plugins_for_tests"
MOVE = "seer.scheduler.policies.moving:MoveEveryChunk"


def test_a_policy_by_path_is_built_with_its_args():
    cfg = SchedulerConfig(policy=f"{PLUG}:NewestFirst", policy_args={"reason": "lifo"}, chunk_size=64)
    p = cfg.build_policy()
    assert type(p).__name__ == "NewestFirst" and p.name == "newest_first"
    assert (p.chunk_size, p.reason) == (64, "lifo")
    assert SchedulerConfig(policy=f"{PLUG}:Unnamed").build_policy().name == "Unnamed"  # default: the class name


def test_built_in_settings_keep_their_keys_and_policy_args_reach_the_rest():
    cfg = load_config(overrides=["scheduler.starvation_after=7", "scheduler.continuations_first=true",
                                 "scheduler.policy_args.probe_index=1"])
    p = cfg.scheduler.build_policy()
    assert isinstance(p, ContextAware)
    assert (p.starvation_after, p.continuations_first, p.probe_index) == (7, True, 1)
    # a policy ignores the scheduler.* keys it does not declare (bench.sim sets them for every configuration)
    assert SchedulerConfig(policy="divided", starvation_after=3, early_packing=True).build_policy().continuations_first is False


def test_every_builtin_declares_real_scheduler_keys():
    assert set(POLICIES) == {"group_rr", "divided", "context", "oracle_lfs"}
    for cls in BUILTIN:
        SchedulerConfig(policy=cls.name).check_policy()


@pytest.mark.parametrize("overrides, key, says", [
    (["scheduler.policy=lottery"], "scheduler.policy", "group_rr, divided, context, oracle_lfs"),
    (["scheduler.policy=nopkg.sched:P"], "scheduler.policy", "cannot import module 'nopkg.sched'"),
    ([f"scheduler.policy={PLUG}:Missing"], "scheduler.policy", "has no attribute 'Missing'"),
    ([f"scheduler.policy={PLUG}:NOT_A_POLICY"], "scheduler.policy", "not a subclass of"),
    ([f"scheduler.policy={PLUG}:sums"], "scheduler.policy", "not a subclass of"),
    (["scheduler.policy=a:b:c"], "scheduler.policy", "must look like 'package.module:Class'"),
    ([f"scheduler.policy={PLUG}:NoKeywords"], "scheduler.policy", "must take chunk_size, placement"),
    ([f"scheduler.policy={PLUG}:NewestFirst", "scheduler.policy_args.colour=red"], "scheduler.policy_args",
     "unexpected keyword argument 'colour'"),
    (["scheduler.policy_args.starvation_after=3"], "scheduler.policy_args", "set scheduler.starvation_after instead"),
    (["scheduler.policy_args.chunk_size=3"], "scheduler.policy_args", "set scheduler.chunk_size instead"),
    (["scheduler.policy=divided", "scheduler.policy_args.early_packing=true"], "scheduler.policy_args",
     "unexpected keyword argument 'early_packing'"),
    (["scheduler.policy=oracle_lfs"], "scheduler.policy", "benchmarks only"),
    (["scheduler.policy_args=7"], "scheduler.policy_args", "expected a mapping"),
])
def test_bad_policy_is_rejected_at_load_naming_the_key(overrides, key, says):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
        load_config(overrides=overrides)
    assert says in str(e.value)


def test_check_policy_returns_the_class_without_building_it():
    assert check_policy(MOVE) is MoveEveryChunk
    with pytest.raises(PolicyError):
        check_policy("divided", {"reason": "x"})


# -- MoveEveryChunk on the in-process fake engine ------------------------------------------------------

def _run(n_inst, capacity=10_000):
    ps = prompts(3, prompt_len=4)
    lengths = {(g, k): 40 + 7 * g + 5 * k for g in range(3) for k in range(2)}  # 3..5 chunks of 12
    fakes = fake_cluster(n_inst, ps, lengths, step_s=0.0002)
    cfg = SchedulerConfig(policy=MOVE, chunk_size=12, kv_capacity_tokens=capacity, block_size=1,
                          telemetry_interval_s=0.01)
    result = asyncio.run(RolloutDriver(fakes, cfg).run(ps, group_size=2, sampling=SamplingParams(max_tokens=64)))
    return result, lengths


@pytest.mark.timeout(30)
@pytest.mark.parametrize("n_inst", [2, 3])
def test_move_every_chunk_puts_consecutive_chunks_on_different_instances(n_inst):
    result, lengths = _run(n_inst)
    assert result.policy == "move_every_chunk"
    assert len(result.samples) == len(lengths)
    moves = 0
    for s in result.samples:
        assert len(s.instances) == -(-lengths[(s.group_id, s.sample_index)] // 12) >= 3
        for a, b in zip(s.instances, s.instances[1:]):
            assert a != b, s.instances
            moves += 1
    migrated = [e for e in result.chunks if e.chunk_index > 0]
    assert migrated and all(e.migrated for e in migrated)
    # a second chunk never finds its prefix where it runs (the fake caches per request it has seen)
    assert all(e.cached_prefix_tokens == 0 for e in migrated if e.chunk_index == 1)
    assert result.policy_summary["moves"] == moves == len(migrated)


@pytest.mark.timeout(30)
def test_move_every_chunk_with_one_instance_stays():
    result, _ = _run(1)
    assert all(set(s.instances) == {"i0"} for s in result.samples)
