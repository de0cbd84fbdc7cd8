"""The multi-turn comparison's pure parts (seer.sim.scripts, bench.multiturn_compare, seer.sim.multiturn):
scripts from samples, where a position falls in a script and what is left of it, the accounting, a
small simulated iteration under each policy."""

from __future__ import annotations

from types import SimpleNamespace as N

import pytest

from bench.multiturn_compare import Carried, MTSettings, Trajectory, off_policy, stream_size
from seer.sim.scripts import Script, continuation_prefix, idle_while_tools, script_from_sample, tool_latencies

S = Script((5, 3, 4), ((), (1, 2), (9,)), (0.0, 0.1, 0.2))  # turn 5, obs 2, turn 3, obs 1, turn 4


def test_a_sample_s_loss_mask_gives_its_turns_and_observations():
    sample = N(response_ids=[7] * 5 + [1, 2] + [7] * 3 + [9] + [7] * 4, loss_mask=[1] * 5 + [0, 0] + [1] * 3 + [0] + [1] * 4)
    assert script_from_sample(sample, [0.1, 0.2, 0.3]) == S
    assert S.model_tokens == 12 and S.response_tokens == 15


@pytest.mark.parametrize("position,left", [(0, 5), (4, 1), (7, 3), (9, 1), (11, 4), (14, 1), (15, 0)])
def test_turn_left_counts_to_the_end_of_the_turn_a_position_falls_in(position, left):
    assert S.turn_left(position) == left


def test_rebase_keeps_what_is_left_mid_turn_and_the_pending_observation_at_a_turn_s_end():
    assert S.rebase(0) == S
    assert S.rebase(2) == Script((3, 3, 4), ((), (1, 2), (9,)), (0.0, 0.1, 0.2))
    assert S.rebase(5) == Script((3, 4), ((1, 2), (9,)), (0.1, 0.2))  # its tool runs again
    assert S.rebase(7) == Script((3, 4), ((), (9,)), (0.0, 0.2))
    assert S.rebase(15) == Script((), (), ())
    for p in range(16):  # what is left is what the whole script has past p
        assert S.rebase(p).response_tokens == S.response_tokens - p


def test_tool_latencies_are_fixed_by_their_key():
    a = tool_latencies("0:1:2", 5, 0.08, 0.7)
    assert a == tool_latencies("0:1:2", 5, 0.08, 0.7) != tool_latencies("0:1:3", 5, 0.08, 0.7)
    assert all(x > 0 for x in a) and tool_latencies("k", 3, 0.0, 0.7) == [0.0] * 3


def test_idle_while_tools_and_the_continuation_prefix():
    chunks = [N(instance="a", dispatch_time=0, complete_time=1, request_id="r", turn=0, chunk_index=0,
                finish_reason="stop", prompt_tokens=10, cached_prefix_tokens=0, migrated=False),
              N(instance="a", dispatch_time=2, complete_time=3, request_id="r", turn=1, chunk_index=1,
                finish_reason="length", prompt_tokens=20, cached_prefix_tokens=16, migrated=False),
              N(instance="a", dispatch_time=3, complete_time=3.5, request_id="r", turn=1, chunk_index=2,
                finish_reason="stop", prompt_tokens=28, cached_prefix_tokens=27, migrated=True)]
    waits = [N(dispatch_time=0.5, complete_time=2.5)]
    assert idle_while_tools(chunks, waits, ["a", "b"], 0, 4) == {"a": 1.0, "b": 2.0}
    assert continuation_prefix(chunks) == {"turns": 1, "history_tokens": 20, "cached_tokens": 16,
                                           "recomputed_tokens": 4, "moved_turns": 0}


def test_off_policy_counts_the_kept_tokens_of_earlier_iterations():
    t = Trajectory(0, 0, (1,), S)
    kept = [Carried(t, tokens_by_iteration={0: 6, 2: 6}), Carried(t, tokens_by_iteration={2: 12}),
            Carried(t, tokens_by_iteration={1: 12})]
    got = off_policy(kept, 2)
    assert (got["kept_model_tokens"], got["off_policy_tokens"], got["trajectories_with_earlier_tokens"]) == (36, 18, 2)
    assert got["off_policy_share"] == 0.5 and got["max_age_iterations"] == 2


def test_the_stream_covers_april_s_over_issue():
    assert stream_size(MTSettings(groups=16, iterations=3, over_issue=0.5)) == 72
    with pytest.raises(ValueError):
        MTSettings(configs="sticky,nope")


def test_a_small_simulated_iteration_under_each_policy():
    from seer.sim.chunk_model import GPU_CLUSTER
    from seer.sim.multiturn import CONFIGS, AgentWorkload, simulate_multiturn
    from seer.sim.simulate import SimSettings
    from seer.sim.speculation import AcceptanceTable
    from seer.sim.step_model import load

    aw = AgentWorkload(instances=2, groups=4, group_size=2, median_turns=3, tool_latency_s=0.05, token_unit=64)
    scripts = aw.scripts(0)
    settings = SimSettings(step=load().model, acceptance=AcceptanceTable.paper(), roofline=True, chunk_cost=GPU_CLUSTER)
    rows = {c.name: simulate_multiturn(aw, c, scripts, settings) for c in CONFIGS}
    assert rows["sticky"]["moved_turns_share"] == 0 and rows["sticky"]["pool_tokens_per_turn"] == 0
    assert all(r["wall_s"] > 0 and r["tokens_per_s"] > 0 for r in rows.values())
    assert len({round(r["history_tokens_per_turn"]) for r in rows.values()}) == 1  # the same turns everywhere
