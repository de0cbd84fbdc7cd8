"""Plug points through `seer-run --sync`: each one given by its config key, one run each.

A scheduling policy by `module:Class` path (with policy_args), a dataset from a `task.loader`
function (with loader_args), and a chat dataset (`messages` records) rendered with a
`task.chat_template`. Each run is rollout only (`--train off --iterations 1`) on the session's
instances, with tiny settings; the assertions read the run directory (metrics.jsonl and
rollouts/) for proof that the plug-in, not a default, did the work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[1]
PLUG = "tests.plugins_for_tests"
GROUPS, SIZE, MAX_TOKENS, CHUNK = 2, 2, 32, 8
TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


def seer_run(vllm_pool, run_dir: Path, *sets: str) -> subprocess.CompletedProcess:
    urls = "[" + ",".join(c.base_url for c in vllm_pool.clients) + "]"
    cmd = [sys.executable, "-m", "seer.cli", "--sync", "--train", "off", "--iterations", "1", "--run-dir", str(run_dir)]
    for kv in ("model.preset=tiny", f"instances.urls={urls}", f"rollout.groups_per_iteration={GROUPS}",
               f"rollout.group_size={SIZE}", f"rollout.max_tokens={MAX_TOKENS}", f"scheduler.chunk_size={CHUNK}", *sets):
        cmd += ["--set", kv]
    # the plug-ins live in tests/: importable from the repository root
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)


def outputs(r: subprocess.CompletedProcess, run_dir: Path) -> tuple[dict, list[dict]]:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (rec,) = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(x) for x in (run_dir / "rollouts" / "iter_0000.jsonl").read_text().splitlines()]
    assert rec["num_samples"] == len(samples) == GROUPS * SIZE
    return rec, samples


def test_policy_by_path_schedules_the_run(vllm_pool, tmp_path):
    run_dir = tmp_path / "run"
    r = seer_run(vllm_pool, run_dir, f"scheduler.policy={PLUG}:NewestFirst", "scheduler.policy_args.reason=e2e")
    rec, samples = outputs(r, run_dir)
    assert rec["policy"] == "newest_first"
    # its summary, with the policy_args value it was built with: every chunk was its decision
    assert rec["policy_summary"] == {"dispatched": sum(len(s["instances"]) for s in samples), "reason": "e2e"}


def test_move_every_chunk_moves_every_continuation(vllm_pool, tmp_path):
    run_dir = tmp_path / "run"
    r = seer_run(vllm_pool, run_dir, "scheduler.policy=seer.scheduler.policies.moving:MoveEveryChunk")
    rec, samples = outputs(r, run_dir)
    assert rec["policy"] == "move_every_chunk"
    chunked = [s["instances"] for s in samples if len(s["instances"]) > 1]
    assert chunked, "no sample ran more than one chunk"
    assert all(a != b for inst in chunked for a, b in zip(inst, inst[1:])), chunked
    assert rec["policy_summary"]["moves"] == sum(len(i) - 1 for i in chunked)


def test_loader_by_path_supplies_the_prompts(vllm_pool, tmp_path):
    run_dir = tmp_path / "run"
    r = seer_run(vllm_pool, run_dir, f"task.loader={PLUG}:tagged", "task.loader_args={n: 3, tag: e2e}",
                 f"task.reward={PLUG}:tag_reward")
    rec, samples = outputs(r, run_dir)
    assert {s["prompt_index"] for s in samples} <= {0, 1, 2}  # the loader's 3 records
    # tag_reward scores 1 only for a record carrying the loader_args' tag
    assert [s["reward"] for s in samples] == [1.0] * len(samples) and rec["reward_errors"] == 0


def test_chat_dataset_is_rendered_with_the_chat_template_key(vllm_pool, tmp_path):
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "system", "content": "Count."},
                                                     {"role": "user", "content": f"to {i + 2}"}], "tag": "e2e"}) + "\n"
                            for i in range(3)))
    common = (f"task.dataset={data}", f"task.reward={PLUG}:tag_reward")
    # the tiny model's tokenizer has no chat template: without the key the run stops before any rollout
    r = seer_run(vllm_pool, tmp_path / "no-template", *common)
    assert r.returncode != 0 and "task.chat_template" in (r.stdout + r.stderr).replace("\n", "")
    assert not (tmp_path / "no-template" / "rollouts").exists()
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    run_dir = tmp_path / "run"
    rec, samples = outputs(seer_run(vllm_pool, run_dir, *common, f"task.chat_template={template}"), run_dir)
    assert {s["prompt_index"] for s in samples} <= {0, 1, 2}
    assert [s["reward"] for s in samples] == [1.0] * len(samples)


def test_reward_timeout_scores_zero_without_stalling_the_run(vllm_pool, tmp_path):
    """rollout.reward_mode / reward_timeout_s reach the runner: a reward that never returns in time
    (120 s) costs each sample its reward, counted as an error, not the run."""
    run_dir = tmp_path / "run"
    r = seer_run(vllm_pool, run_dir, "task.reward=tests.tasks.rewards_for_tests:hang", "rollout.reward_mode=process",
                 "rollout.reward_timeout_s=1", "rollout.reward_workers=2")
    rec, samples = outputs(r, run_dir)
    assert [s["reward"] for s in samples] == [0.0] * len(samples)
    assert all("TimeoutError" in s["reward_error"] for s in samples)
    assert rec["reward_errors"] == len(samples)
