"""The DGDS proposer inside a real vLLM instance, against a real DGDS server on 127.0.0.1.

Acceptance is read from vLLM's own /metrics counters. The workload is Seer's probe-first order:
each group's sample 0 runs alone, then its siblings run together. Decoding is greedy, so the
siblings of a group reproduce the probe's response: with group drafts they can draft it from the
group's tree, with per-request drafts (ids prefixed ``solo-``) only from their own history. Greedy
also makes speculative decoding lossless, so both modes must return the very same tokens.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from seer.dgds.server.group_store import UnknownGroups
from seer.procs.vllm_metrics import spec_decode_counters
from seer.request_ids import parse, parse_request_id, request_id
from seer.types import GenerateRequest, SamplingParams, SpecDecodeCounters

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

GROUP_SIZE = 4
MAX_TOKENS = 96


def _requests(prompts, prefix: str, samples: range) -> list[GenerateRequest]:
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return [GenerateRequest(request_id(p.index, k, prefix), p.prompt_ids, MAX_TOKENS, sp, logprobs=False)
            for p in prompts for k in samples]


async def _wait_for_probes_on_server(dgds, out: dict[str, list[int]], solo: bool, timeout_s: float = 60.0) -> None:
    """Block until the DGDS server holds every probe's whole response.

    The proposer registers groups and ships tokens from a background thread; a sibling wave that
    starts before its group is registered drafts nothing. Waiting here turns a slow start into a
    named failure instead of a silent zero-draft measurement.
    """
    want = {}
    for rid, toks in out.items():
        ref = parse_request_id(rid)  # the proposer's own mapping
        assert ref.grouped != solo
        want[(ref.group_id, ref.sequence_id)] = len(toks)
    deadline = time.monotonic() + timeout_s
    missing = dict(want)
    while missing and time.monotonic() < deadline:
        for (group, seq), n in list(missing.items()):
            try:
                if dgds.store.sequence_length(group, seq) >= n:
                    missing.pop((group, seq))
            except UnknownGroups:  # not registered yet
                pass
        if missing:
            await asyncio.sleep(0.1)
    assert not missing, f"DGDS server lacks probe tokens after {timeout_s:.0f}s: {sorted(missing)}; {dgds.store.stats()}"


async def _probe_then_siblings(client, dgds, prompts, prefix: str) -> tuple[dict[str, list[int]], SpecDecodeCounters]:
    """Run the probes, then the siblings; counters of the sibling wave only."""
    out = {}
    for r in await asyncio.gather(*(client.generate(q) for q in _requests(prompts, prefix, range(1)))):
        out[r.request_id] = r.token_ids
    await _wait_for_probes_on_server(dgds, out, solo=prefix.startswith("solo-"))
    before = spec_decode_counters(await client.metrics_text())
    for r in await asyncio.gather(*(client.generate(q) for q in _requests(prompts, prefix, range(1, GROUP_SIZE)))):
        out[r.request_id] = r.token_ids
    after = spec_decode_counters(await client.metrics_text())
    await client.close()
    return out, after - before


def _strip(prefix: str, outputs: dict[str, list[int]]) -> dict[str, list[int]]:
    return {k[len(prefix):]: v for k, v in outputs.items()}


@pytest.fixture(scope="module")
def modes(dgds_vllm):
    """Per-request drafting first (so the group run cannot profit from a warmer engine), then group."""
    solo, solo_c = asyncio.run(_probe_then_siblings(dgds_vllm.client, dgds_vllm.dgds, dgds_vllm.prompts, "solo-t-"))
    group, group_c = asyncio.run(_probe_then_siblings(dgds_vllm.client, dgds_vllm.dgds, dgds_vllm.prompts, "t-"))
    return {"solo": (_strip("solo-t-", solo), solo_c), "group": (_strip("t-", group), group_c)}


def test_proposer_drafts_are_accepted_by_vllm(modes, dgds_vllm):
    for name, (_, c) in modes.items():
        assert c.drafts > 0 and c.draft_tokens > 0, f"{name}: vLLM verified no drafts"
        assert c.accepted_tokens > 0, f"{name}: no draft token accepted ({c})"
    log = dgds_vllm.log_path.read_text(errors="replace")
    assert "Seer DGDS proposer: mode=group" in log
    assert "proposer step failed" not in log


def test_the_instance_keeps_the_draft_servers_secret_out_of_proc(dgds_vllm):
    """The instance got SEER_DGDS_TOKEN on a pipe (seer.procs.secret_launch; its proposer uses it:
    test_proposer_drafts_are_accepted_by_vllm): no process of its tree (guard, launcher, engine core,
    workers, multiprocessing's resource tracker) has it in its exec environment or command line, read
    as root, and an agent's process reads neither the environment nor the memory of any of them."""
    from tests.agent.proc_probe import as_an_agent, holders, read_all
    from tests.sockets import process_tree

    pids = process_tree(dgds_vllm.pool.servers[0].proc.pid)
    assert len(pids) >= 4, pids  # the guard, its sentinel, the API server and its engine core at least
    token = dgds_vllm.token
    answers, got = read_all(pids, ("environ", "cmdline"))  # as root, with every capability
    assert all(a["environ"] == a["cmdline"] == "read" for a in answers.values()), answers
    assert not [t for t in got if token in t], "the draft server's secret is in a process's exec environment or cmdline"
    answers, got = as_an_agent(pids)
    assert not [t for t in got if token in t]
    secret_holders = holders(pids)  # the API server, its engine core and worker
    assert len(secret_holders) >= 3, secret_holders
    assert all(answers[str(p)]["environ"] in ("EACCES", "EPERM") and answers[str(p)]["mem"] in ("EACCES", "EPERM")
               for p in secret_holders), answers


def test_group_drafts_beat_per_request_drafts(modes):
    solo = modes["solo"][1].mean_acceptance_length
    group = modes["group"][1].mean_acceptance_length
    assert group is not None and solo is not None
    # siblings can copy the probe's finished response from the group tree: far more per step
    assert group > solo + 0.5, f"group {group:.2f} vs per-request {solo:.2f}"
    assert group > 3.0


def test_speculation_is_lossless_under_greedy_decoding(modes):
    solo, group = modes["solo"][0], modes["group"][0]
    assert solo.keys() == group.keys()
    assert all(len(v) > 0 for v in group.values())
    assert solo == group  # drafts differ between the modes; verified outputs must not
    samples: dict[str, dict[int, list[int]]] = {}
    for rid, toks in group.items():
        sid = parse(rid)
        samples.setdefault(sid.group, {})[sid.sample] = toks
    for outputs in samples.values():  # greedy: every sibling reproduces its probe
        assert sorted(outputs) == list(range(GROUP_SIZE))
        assert all(v == outputs[0] for v in outputs.values())


async def _sample_with_top_logprobs(client, prompts, samples: int, max_tokens: int) -> list[dict]:
    """Temperature-1.0 completions with the top-20 target logprobs of every position, by token id."""
    import aiohttp

    model = await client.served_model()
    async with aiohttp.ClientSession() as http:
        async def one(p, k):
            body = {"model": model, "prompt": list(p.prompt_ids), "max_tokens": max_tokens, "temperature": 1.0,
                    "ignore_eos": True, "return_token_ids": True, "skip_special_tokens": False,
                    "logprobs": 20, "return_tokens_as_token_ids": True}
            async with http.post(f"{client.base_url}/v1/completions", json=body,
                                 headers={"X-Request-Id": request_id(p.index, k, "temp1-")}) as r:
                assert r.status == 200, await r.text()
                return (await r.json())["choices"][0]
        return await asyncio.gather(*(one(p, k) for p in prompts for k in range(samples)))


def test_speculation_is_lossless_when_sampling(dgds_vllm):
    """At temperature 1.0 with drafts verified, every sampled token must follow the target
    distribution. vLLM reports that distribution's top 20 with each token, so the rank of the
    sampled token is a calibration check: P(rank r) must match the mean reported p_r within
    sampling noise, and never-trained padding ids (beyond the tokenizer) must not appear. Before
    seer.compat.vllm_cpu_fixes, vLLM 0.32's CPU backend sampled drafted positions from a garbage
    temperature: rank 1 came out 16% of the time against 56% expected, padding ids 4.7%."""
    import math

    from transformers import AutoTokenizer

    n_real = len(AutoTokenizer.from_pretrained(dgds_vllm.pool.servers[0].spec.model))
    client = dgds_vllm.client
    before = spec_decode_counters(asyncio.run(client.metrics_text()))
    choices = asyncio.run(_sample_with_top_logprobs(client, dgds_vllm.prompts, samples=8, max_tokens=128))
    after = spec_decode_counters(asyncio.run(client.metrics_text()))
    asyncio.run(client.close())
    c = after - before
    tokens = sum(len(ch["token_ids"]) for ch in choices)
    assert c.draft_tokens > tokens // 4, f"too few drafted positions to test anything: {c}"

    buckets = [(1, 1), (2, 2), (3, 5), (6, 20)]  # ranks; the rest is "beyond the top 20"
    observed = [0] * 5
    mean = [0.0] * 5
    var = [0.0] * 5
    padding = 0
    for ch in choices:
        for tok, top in zip(ch["token_ids"], ch["logprobs"]["top_logprobs"]):
            padding += tok >= n_real
            ranked = sorted(((lp, int(k.split(":")[1])) for k, lp in top.items()), reverse=True)[:20]
            ids = [t for _, t in ranked]
            rank = ids.index(tok) + 1 if tok in ids else 21
            probs = [math.exp(lp) for lp, _ in ranked]
            ps = [sum(probs[lo - 1:hi]) for lo, hi in buckets] + [max(0.0, 1.0 - sum(probs))]
            for b, p in enumerate(ps):
                mean[b] += p
                var[b] += p * (1 - p)
                observed[b] += (buckets[b][0] <= rank <= buckets[b][1]) if b < 4 else rank == 21
    report = ", ".join(f"{o / tokens:.3f} vs {m / tokens:.3f}" for o, m in zip(observed, mean))
    for o, m, v in zip(observed, mean, var):
        assert abs(o - m) <= 5 * math.sqrt(v) + 2, f"rank buckets observed vs expected: {report} ({c})"
    assert padding <= max(3, 0.005 * tokens), f"{padding} padding ids in {tokens} tokens"


def test_multi_turn_chunks_feed_the_group_tree_with_the_model_tokens_only(dgds_vllm, tiny_model):
    """A multi-turn rollout on the speculating instance (observations between turns, 8-token
    chunks): every chunk's sequence in its group's tree on the server is exactly the model tokens
    that chunk produced, so a trajectory's sequences, in order, are its loss-masked tokens and no
    observation token is in the tree (they reach the engine inside the next turn's prompt); nor
    is any token a verification step accepted past the chunk's max_tokens (vLLM drops those).
    (Before the tests below, which stop the fixture's draft server.)"""
    from transformers import AutoTokenizer

    from seer.tasks.env import EnvConfig
    from tests.multiturn.test_multi_turn_vllm import rollout

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    obs = (11, 12, 13)
    batch = rollout(dgds_vllm.pool, tok, dgds_vllm.prompts[:2], EnvConfig(workers=2, max_turn_tokens=12),
                    {"obs": obs, "turns": 3}, group_size=2, chunk=8, max_tokens=60)
    assert len(batch.samples) == 4 and all(s.turns >= 2 for s in batch.samples)
    deadline = time.monotonic() + 60
    for s in batch.samples:
        chunks = sorted((c for c in batch.chunks if c.request_id == s.request_id and c.new_tokens > 0),
                        key=lambda c: c.chunk_index)
        held: list[int] = []
        for c in chunks:
            ref = parse_request_id(c.chunk_id)
            while dgds_vllm.dgds.store.sequence_length(ref.group_id, ref.sequence_id) < c.new_tokens:
                assert time.monotonic() < deadline, f"the server lacks {c.chunk_id}'s tokens"
                time.sleep(0.1)
            tokens = dgds_vllm.dgds.store.sequence_tokens(ref.group_id, ref.sequence_id)
            assert len(tokens) == c.new_tokens, (c.chunk_id, tokens, c.new_tokens)
            held += tokens
        model_tokens = [t for t, m in zip(s.response_ids, s.loss_mask) if m]
        assert held == model_tokens, s.request_id


def test_decoding_goes_on_when_the_draft_server_is_gone(dgds_vllm):
    dgds_vllm.dgds.stop(0)

    async def run():
        reqs = _requests(dgds_vllm.prompts[:2], "after-stop-", range(2))
        res = await asyncio.gather(*(dgds_vllm.client.generate(q) for q in reqs))
        await dgds_vllm.client.close()
        return res

    res = asyncio.run(run())
    assert all(r.finish_reason in ("stop", "length") and r.token_ids for r in res)
    assert "proposer step failed" not in dgds_vllm.log_path.read_text(errors="replace")


def test_draft_server_restart_mid_rollout_is_harmless(modes, dgds_vllm):
    """Runs last in this module: the draft server dies, vLLM keeps decoding (no drafts for groups
    it never registered, no error), then a new server on the same port brings drafts back."""
    from seer.dgds.server.grpc_server import DgdsServer

    client = dgds_vllm.client
    dgds_vllm.dgds.stop(0)

    async def wave(prefix: str):
        outs = await asyncio.gather(*(client.generate(q) for q in _requests(dgds_vllm.prompts, prefix, range(GROUP_SIZE))))
        await client.close()
        return {r.request_id[len(prefix):]: r.token_ids for r in outs}

    down = asyncio.run(wave("down-t-"))
    assert down == modes["group"][0]  # greedy: the same tokens as with drafts, decoding never stalled
    new = DgdsServer("127.0.0.1", dgds_vllm.dgds.port, token=dgds_vllm.token).start()
    try:
        back, c = asyncio.run(_probe_then_siblings(client, new, dgds_vllm.prompts, "back-t-"))
        assert _strip("back-t-", back) == modes["group"][0]
        assert c.drafts > 0 and c.accepted_tokens > 0, f"drafts did not resume: {c}"
    finally:
        new.stop(0)
    assert "proposer step failed" not in dgds_vllm.log_path.read_text(errors="replace")

