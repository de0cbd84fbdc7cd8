"""rollout.dynamic_sampling: the batch is the first N informative groups in dispatch order, on the
iteration's weights, and the prompt cursor moves past them; one real `seer-run --sync` checks it end to end.

The unit tests drive seer.rollout.dynamic with a round runner that finishes samples in a chosen
order and honours `stop_when` as the driver does; the run uses the session's vLLM instances."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from seer.rollout.base import DynamicSampling, RolloutRequest
from seer.rollout.dynamic import dynamic_rollout, enough_informative, extra_groups_for
from seer.scheduler.driver import RolloutResult
from seer.types import PromptSpec, Sample, SamplingParams

G = 2


def stream(kinds: str) -> list[PromptSpec]:
    """The data stream: 'i' an informative prompt (rewards 0, 1), 'e' an all-equal one (1, 1)."""
    return [PromptSpec(i, k, [1], {"kind": k}) for i, k in enumerate(kinds)]


class Rounds:
    """A round runner: samples finish longest-dispatched-last reversed (the last group first), each
    rewarded at once; `stop_when` is asked after every sample, as the driver asks it."""

    def __init__(self):
        self.rounds: list[list[int]] = []  # dataset indices dispatched per round

    async def __call__(self, prompts, round_index, stop_when):
        self.rounds.append([p.index for p in prompts])
        done: list[Sample] = []
        for g in reversed(range(len(prompts))):  # finish order: the opposite of dispatch order
            for i in range(G):
                reward = float(i) if prompts[g].reference["kind"] == "i" else 1.0
                done.append(Sample(g, i, f"r{round_index}-g{g}-s{i}", prompts[g], [5], [], "stop", 0.0, 0.0, [],
                                   weight_version=7, reward=reward))
                if stop_when(done):
                    return RolloutResult("test", sorted(done, key=lambda s: (s.group_id, s.sample_index)), [], [],
                                         0.0, 1.0)
        return RolloutResult("test", done, [], [], 0.0, 1.0)


def run(kinds: str, target: int, extra: int = 0, max_groups: int = 0):
    data = stream(kinds)
    req = RolloutRequest(0, data[:target], G, SamplingParams(), 7,
                         dynamic=DynamicSampling(lambda off, n: data[off:off + n], extra, max_groups))
    rounds = Rounds()
    out = asyncio.run(dynamic_rollout(req, rounds))
    return out, rounds.rounds


def test_kept_groups_are_the_first_informative_ones_in_dispatch_order_not_finish_order():
    # e i e i i i: with 6 groups at once the last ones finish first, yet the batch is groups 1 and 3
    out, rounds = run("eieiii", target=2, extra=4)
    kept = sorted({s.prompt.index for s in out.samples})
    assert kept == [1, 3] and rounds == [[0, 1, 2, 3, 4, 5]]
    assert out.counts["prompts_consumed"] == 4  # 4 and 5 return to the stream: the next iteration starts there
    assert out.counts["dynamic_all_equal_groups"] == 2 and out.counts["dynamic_refill_rounds"] == 0
    assert {s.weight_version for s in out.samples} == {7}


def test_a_refill_round_draws_the_next_prompts_when_the_first_falls_short():
    out, rounds = run("eeiie" + "iiii", target=3)
    assert rounds[0] == [0, 1, 2] and rounds[1][:2] == [3, 4]  # the second round continues the stream
    assert sorted({s.prompt.index for s in out.samples}) == [2, 3, 5]
    # group ids are dispatch positions over both rounds, so no two groups share one
    assert sorted({s.group_id for s in out.samples}) == [2, 3, 5]
    assert out.counts["dynamic_refill_rounds"] >= 1 and out.counts["dynamic_short_groups"] == 0
    assert out.counts["prompts_consumed"] == 6


def test_at_most_max_groups_then_the_batch_is_filled_with_all_equal_groups_in_order():
    out, rounds = run("eieeeeee", target=3, max_groups=4)
    assert sum(len(r) for r in rounds) == 4
    assert sorted({s.prompt.index for s in out.samples}) == [0, 1, 2]  # 1 informative + 2 all-equal fillers
    assert out.counts["dynamic_short_groups"] == 2 and out.counts["prompts_consumed"] == 4


def test_stop_waits_for_every_earlier_group_and_its_rewards():
    p = stream("ii")
    s = [Sample(g, i, "", p[g], [5], [], "stop", 0.0, 0.0, [], reward=float(i)) for g in (0, 1) for i in range(G)]
    stop = enough_informative(1, G, 2)
    assert not stop(s[2:])  # group 1 is complete, group 0 not yet: it comes first
    s[1].reward = None
    assert not stop(s)  # group 0 finished, a reward still being computed
    s[1].reward = 1.0
    assert stop(s)


def test_spare_groups_follow_the_observed_share_of_all_equal_groups():
    assert extra_groups_for(8, None) == 0
    assert extra_groups_for(8, 0.5) == 8  # 8 / (1 - .5) - 8
    assert extra_groups_for(4, 0.25) == 2  # ceil(5.33) - 4
    assert extra_groups_for(4, 1.0) == 36  # capped at a 0.9 share: 4 / .1 - 4


# ---- one real run ------------------------------------------------------------------------------

@pytest.mark.vllm
@pytest.mark.timeout(900)
def test_a_dynamic_sampling_run_trains_on_informative_on_policy_groups(vllm_pool, restore_base_weights, tmp_path):
    """Two iterations of `seer-run --sync` on the session's instances with a reward that makes
    every other prompt's group all-equal: each batch holds groups_per_iteration informative groups
    of the iteration's weight version, the all-equal ones were replaced, and the record says how."""
    run_dir = tmp_path / "run"
    sets = {
        "instances.urls": "[" + ",".join(c.base_url for c in vllm_pool.clients) + "]",
        "model.preset": "tiny", "task.loader": "tests.plugins_for_tests:numbered", "task.loader_args": "{n: 12}",
        "task.reward": "tests.plugins_for_tests:half_constant", "rollout.groups_per_iteration": 3,
        "rollout.group_size": 4, "rollout.max_tokens": 24, "rollout.dynamic_sampling": "true",
        "kvpool.enabled": "false", "trainer.mini_batches": 1, "train.keep_checkpoints": 2,
    }
    cmd = [sys.executable, "-m", "seer.cli", "--sync", "--iterations", "2", "--run-dir", str(run_dir)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["weight_version"] for x in recs] == [0, 1]
    consumed = replaced = 0
    for it, rec in enumerate(recs):
        samples = [json.loads(x) for x in (run_dir / "rollouts" / f"iter_{it:04d}.jsonl").read_text().splitlines()]
        groups: dict[int, list] = {}
        for s in samples:
            groups.setdefault(s["group_id"], []).append(s)
        seen = (rec, groups)  # shown if an assertion fails
        assert len(groups) == 3 and all(len(g) == 4 for g in groups.values()), seen
        assert {s["weight_version"] for s in samples} == {it}, seen  # strictly on-policy, refills included
        assert all(len({s["reward"] for s in g}) > 1 for g in groups.values()), seen  # informative only
        # even-numbered prompts score a constant: none is kept, each one judged was replaced
        assert all(g[0]["prompt_index"] % 2 == 1 for g in groups.values()), seen
        assert rec["dynamic_groups_judged"] == 3 + rec["dynamic_all_equal_groups"], seen
        assert rec["dynamic_short_groups"] == 0 and rec["zero_adv_fraction"] == 0.0, seen
        assert rec["dynamic_groups_dispatched"] == 3 + rec["dynamic_refill_groups"], seen
        consumed += rec["prompts_consumed"]
        replaced += rec["dynamic_all_equal_groups"]
    # the seeded stream puts an even-numbered prompt among iteration 0's first three: always one replaced
    assert replaced >= 1 and recs[0]["dynamic_refill_groups"] >= 1
    state = json.loads((run_dir / "checkpoints" / "iter_0001" / "loop_state.json").read_text())
    assert state["prompt_cursor"] == consumed  # what a resumed run continues from


def test_the_prompt_cursor_is_committed_with_a_checkpoint_and_read_back(tmp_path):
    """What --resume continues from; a checkpoint from before the cursor was kept reads as None
    (the loop then uses iteration x groups, which is what such a run drew)."""
    import json as _json

    from seer.rundir import RunDir

    run = RunDir(tmp_path)
    run.commit_checkpoint(0, 1, keep=3)
    assert run.latest_checkpoint().prompt_cursor is None
    run.commit_checkpoint(1, 2, keep=3, prompt_cursor=13)
    assert run.latest_checkpoint().prompt_cursor == 13
    assert _json.loads((run.checkpoint_dir(1) / "loop_state.json").read_text())["prompt_cursor"] == 13


def test_max_groups_below_the_batch_is_a_config_error():
    from seer.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"rollout\.dynamic_sampling_max_groups"):
        load_config(None, ["rollout.groups_per_iteration=4", "rollout.dynamic_sampling_max_groups=3"])


@pytest.mark.timeout(60)
def test_the_multi_turn_rollout_runs_dynamic_sampling_rounds_up_to_max_groups():
    """On the scripted engines (no vLLM): every trajectory scores 1, so every group is all-equal;
    the rounds go on to max_groups and the batch is filled in dispatch order, on the request's weights."""
    from seer.rollout.base import RolloutContext
    from seer.rollout.multi_turn import multi_turn_rollout
    from seer.scheduler import SchedulerConfig
    from seer.tasks.env import EnvConfig, EnvRunner
    from seer.tasks.reward import RewardRunner
    from tests.multiturn.test_turns import ScriptedEngine, decode, prompts

    env = EnvRunner("tests.multiturn.envs_for_tests:ScriptEnv", EnvConfig(mode="thread", stop=("</c>",)),
                    {"obs": (61,), "turns": 2})
    ctx = RolloutContext([ScriptedEngine("i0"), ScriptedEngine("i1")],
                         SchedulerConfig(policy="context", chunk_size=4, kv_capacity_tokens=10_000, block_size=1,
                                         telemetry_interval_s=0.01),
                         RewardRunner("seer.tasks.env:zero_reward"), env=env, decode=decode,
                         encode=lambda text: [ord(c) for c in text])
    data = prompts(8)
    req = RolloutRequest(0, data[:2], 2, SamplingParams(max_tokens=60), 3,
                         dynamic=DynamicSampling(lambda off, n: data[off:off + n], extra_groups=1, max_groups=5))
    try:
        batch = asyncio.run(multi_turn_rollout(ctx, req))
    finally:
        env.close()
    x = batch.stats.extra
    assert x["dynamic_groups_dispatched"] == 5 and x["dynamic_refill_rounds"] >= 1
    assert x["dynamic_all_equal_groups"] == 5 and x["dynamic_short_groups"] == 2 and x["prompts_consumed"] == 5
    assert sorted({s.prompt.index for s in batch.samples}) == [0, 1]  # the fill: the first two, in dispatch order
    assert {s.weight_version for s in batch.samples} == {3} and len(batch.samples) == 4
    from seer.metrics_log import iteration_record
    from tests.test_metrics_fields import undocumented

    rec = iteration_record(batch)
    assert undocumented(rec) == []  # docs/watching.md names every field, the dynamic ones too
    # the record's samples are the kept batch; num_generated every trajectory of every round
    assert rec["num_samples"] == rec["num_sessions"] == rec["num_trained_samples"] == 4 and rec["num_generated"] == 10
