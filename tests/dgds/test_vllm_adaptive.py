"""Algorithm 1 with adaptive draft lengths inside a real vLLM instance (the default setting).

The other proposer tests pin ``SEER_DGDS_ADAPTIVE=0`` so that they compare drafts, not the
policy. Here the policy runs as deployed: its step-cost model and acceptance profile are fitted
online from the instance's own steps, and what the proposer believes it drafted and got accepted
(``SEER_DGDS_STATS_FILE``) must be what vLLM's own spec-decode counters say it verified.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from seer.procs.vllm_metrics import spec_decode_counters
from seer.request_ids import request_id
from seer.types import GenerateRequest, SamplingParams

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

GROUP_SIZE = 4


@pytest.fixture(scope="module")
def adaptive_vllm(tiny_model, tmp_path_factory):
    """One vLLM CPU instance with the DGDS proposer, adaptive lengths on, and a real DGDS server;
    the drafts reach the scheduler through ``seer.dgds.vllm.executor`` (no per-step RPC), so the
    counts below also check that path."""
    import secrets

    from transformers import AutoTokenizer

    from seer.dgds.server.grpc_server import DgdsServer
    from seer.dgds.vllm import EXECUTOR_ARGS, speculative_config
    from seer.fleet.instance import InstanceSpec
    from seer.fleet.pool import InstancePool
    from seer.procs import free_port
    from seer.tasks import TaskConfig, encode_prompts, load_task

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    prompts = encode_prompts(load_task(TaskConfig(num_prompts=6, seed=5)).records, tok, 1024)
    token = secrets.token_urlsafe(32)
    dgds = DgdsServer("127.0.0.1", 0, token=token).start()
    tmp = tmp_path_factory.mktemp("dgds-adaptive")
    stats = tmp / "proposer-stats.json"
    spec = InstanceSpec(
        "dgds-adaptive", str(tiny_model), free_port(), cpus="0", max_model_len=1024,
        kv_cache_bytes=96 * 2**20, max_num_seqs=64,
        extra_args=("--speculative-config", speculative_config(6), *EXECUTOR_ARGS),
        env={"SEER_DGDS_ADDRESS": dgds.address, "SEER_DGDS_TOKEN": token, "SEER_DGDS_ADAPTIVE": "1",
             "SEER_DGDS_UPDATE_TOKENS": "4", "SEER_DGDS_STATS_FILE": str(stats)},
    )
    try:
        pool = InstancePool.launch([spec], tmp / "logs", ready_timeout_s=600)
    except BaseException:
        dgds.stop(0)
        raise
    try:
        yield pool, dgds, prompts, stats, tmp / "logs" / "dgds-adaptive.log"
    finally:
        pool.close()
        dgds.stop(0)


def _reqs(prompts, prefix: str, samples: range, temperature: float, max_tokens: int) -> list[GenerateRequest]:
    return [GenerateRequest(request_id(p.index, k, prefix), p.prompt_ids, max_tokens,
                            SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=100 * p.index + k,
                                           ignore_eos=True), logprobs=False)
            for p in prompts for k in samples]


def test_adaptive_lengths_run_and_the_proposers_counts_match_vllms(adaptive_vllm):
    pool, dgds, prompts, stats_path, log_path = adaptive_vllm
    client = pool.clients[0]

    async def run():
        # greedy, probe first: siblings can copy their probe from the group tree (drafting pays)
        await asyncio.gather(*(client.generate(q) for q in _reqs(prompts, "ad-", range(1), 0.0, 96)))
        await asyncio.sleep(0.5)  # the probes' last tokens reach the server
        await asyncio.gather(*(client.generate(q) for q in _reqs(prompts, "ad-", range(1, GROUP_SIZE), 0.0, 96)))
        # then a sampled wave of fresh groups: little to copy
        await asyncio.gather(*(client.generate(q) for q in _reqs(prompts, "adt-", range(GROUP_SIZE), 1.0, 64)))
        text = await client.metrics_text()
        await client.close()
        return spec_decode_counters(text)

    vllm_counts = asyncio.run(run())
    deadline = time.monotonic() + 10
    while True:  # the file is rewritten after every step; the last step's may still be landing
        ours = json.loads(stats_path.read_text())
        mine = (ours["verified_drafts"], ours["verified_draft_tokens"], ours["accepted_tokens"])
        theirs = (vllm_counts.drafts, vllm_counts.draft_tokens, vllm_counts.accepted_tokens)
        if mine == theirs or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert theirs[0] > 0 and theirs[2] > 0, f"vLLM verified no accepted drafts: {vllm_counts}"
    assert mine == theirs, f"proposer (drafts, draft tokens, accepted) {mine} vs vLLM's counters {theirs}"

    # the policy ran adaptively: beyond its warm-up it chose from the fit, not always gamma_max
    plans = ours["lengths"]
    assert sum(plans.values()) == ours["steps"]
    assert len(plans) >= 2, f"one plan only: {plans}"
    assert sum(n for k, n in plans.items() if k != "6,6") > 0, plans
    m = ours["step_model"]
    assert m["fixed"] > 0 and m["per_token"] >= 0 and m["per_drafted_row"] > 0, m
    assert ours["beta"][0] == 1.0 and 0 < ours["beta"][1] <= 1.0
    assert "proposer step failed" not in log_path.read_text(errors="replace")

    # every generated token reached the draft server, though the proposer hands a row's tokens
    # over every few tokens (its last ones when vLLM drops the finished request from the batch)
    want = {(f"ad-g{p.index}", request_id(p.index, k, "ad-")): 96 for p in prompts for k in range(GROUP_SIZE)}
    want.update({(f"adt-g{p.index}", request_id(p.index, k, "adt-")): 64 for p in prompts for k in range(GROUP_SIZE)})
    deadline = time.monotonic() + 10
    while True:
        have = {key: dgds.store.sequence_length(*key) for key in want}
        short = {k: (have[k], n) for k, n in want.items() if have[k] < n}
        if not short or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    # (at least: a last step's accepted drafts can run past max_tokens in the runner's batch)
    assert not short, short
