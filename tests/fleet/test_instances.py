"""Real vLLM instances: token-in/token-out, concurrency, telemetry, and no orphan processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from seer.types import GenerateRequest, SamplingParams

pytestmark = pytest.mark.vllm


def _prompt(tiny_model) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)("sum 12 7 30 =")["input_ids"]


def test_token_ids_and_logprobs_for_a_token_id_prompt(vllm_pool, tiny_model):
    client = vllm_pool.clients[0]
    prompt = _prompt(tiny_model)

    async def go():
        try:
            return await client.generate(GenerateRequest("t-basic", prompt, 24, SamplingParams(temperature=1.0, seed=7)))
        finally:
            await client.close()

    r = asyncio.run(go())
    assert 1 <= len(r.token_ids) <= 24
    assert len(r.logprobs) == len(r.token_ids)
    assert all(lp <= 0.0 for lp in r.logprobs) and any(lp < 0.0 for lp in r.logprobs)
    assert r.prompt_tokens == len(prompt)
    assert r.finish_reason in ("stop", "length")
    assert r.instance == "inst0" and r.finish_time >= r.start_time
    # same seed, same tokens: the sampler is reproducible per request
    r2 = asyncio.run(go())
    assert r2.token_ids == r.token_ids

    async def ranked():  # an engine priority (scheduler.engine_priority) reaches the engine and changes no token
        try:
            return await client.generate(GenerateRequest("t-prio", prompt, 24, SamplingParams(temperature=1.0, seed=7),
                                                         priority=-40))
        finally:
            await client.close()

    assert asyncio.run(ranked()).token_ids == r.token_ids


def test_two_instances_serve_concurrently_and_telemetry_moves(vllm_pool, tiny_model):
    prompt = _prompt(tiny_model)
    sp = SamplingParams(temperature=1.0, seed=1, ignore_eos=True)

    async def go():
        idle = await vllm_pool.telemetry()
        reqs = [
            c.generate(GenerateRequest(f"t-conc-{c.name}-{k}", prompt, 1200, sp))
            for c in vllm_pool.clients for k in range(8)
        ]
        tasks = [asyncio.ensure_future(r) for r in reqs]
        busy = []
        while not all(t.done() for t in tasks):
            busy.append(await vllm_pool.telemetry())
            await asyncio.sleep(0.1)
        results = await asyncio.gather(*tasks)
        after = await vllm_pool.telemetry()
        for c in vllm_pool.clients:
            await c.close()
        return idle, busy, results, after

    idle, busy, results, after = asyncio.run(go())
    assert all(len(r.token_ids) == 1200 for r in results)
    assert all(t.num_running == 0 and t.kv_usage == 0.0 for t in idle)
    assert all(t.kv_capacity_tokens > 0 for t in idle)
    # at some moment both instances were running our requests at the same time
    assert any(all(t.num_running > 0 for t in snap) for snap in busy), [[(t.instance, t.num_running) for t in s] for s in busy]
    assert any(all(t.kv_usage > 0 for t in snap) for snap in busy)
    by_inst = {name: [r for r in results if r.instance == name] for name in vllm_pool.names}
    spans = {n: (min(r.start_time for r in rs), max(r.finish_time for r in rs)) for n, rs in by_inst.items()}
    (a0, a1), (b0, b1) = spans.values()
    assert min(a1, b1) - max(a0, b0) > 0.5 * min(a1 - a0, b1 - b0)  # mostly overlapping
    assert all(t.num_running == 0 for t in after)


def test_killing_the_parent_leaves_no_vllm_process(tiny_model, tmp_path):
    """SIGKILL the process that launched an instance: its guard must take vLLM down."""
    from seer.procs import free_port

    port = free_port()
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from seer.fleet.instance import InstanceSpec
        from seer.fleet.pool import InstancePool
        if __name__ == "__main__":
            spec = InstanceSpec(name="orphan-check", model={str(tiny_model)!r}, port={port}, cpus="0",
                                kv_cache_bytes=32 * 2**20, max_num_seqs=8)
            pool = InstancePool.launch([spec], Path({str(tmp_path)!r}))
            print("READY", flush=True)
            time.sleep(600)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        assert line.strip() == "READY", f"parent did not start the instance: {line!r}"
        assert _procs_with(f"--port {port}"), "the vLLM server should be running"
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 60
        while _procs_with(f"--port {port}") and time.monotonic() < deadline:
            time.sleep(0.5)
        left = _procs_with(f"--port {port}")
        assert not left, f"vLLM processes survived their parent: {left}"
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in _procs_with(f"--port {port}"):
            os.kill(pid, signal.SIGKILL)


def _procs_with(marker: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and "pytest" not in cmd:
            out.append(int(d))
    return out


def _descendants(pid: int) -> list[int]:
    from seer.procs.process import _children

    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def test_every_thread_of_an_instance_stays_on_its_cores(vllm_pool):
    """Not only vLLM's OpenMP threads: the API server, the engine core and all their threads run on
    the instance's own cores, so an idle instance cannot lend its core to a busy one."""
    from seer.procs.guard import parse_cpus

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one usable core: both instances share it")
    checked = 0
    for server in vllm_pool.servers:
        want = parse_cpus(server.spec.cpus)
        pids = _descendants(server.proc.pid)
        assert pids, f"{server.name}: no server process under its guard"
        for pid in pids:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    got = os.sched_getaffinity(int(tid))
                except (ProcessLookupError, OSError):
                    continue  # a thread that ended meanwhile
                assert got <= want, f"{server.name}: thread {tid} of pid {pid} may run on {sorted(got)}, not only {sorted(want)}"
                checked += 1
    assert checked >= 4 * len(vllm_pool.servers)


def test_guard_rejects_a_bad_cpu_list():
    r = subprocess.run([sys.executable, "-m", "seer.procs.guard", str(os.getpid()), "--cpus", "zero", "--", "true"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "bad CPU list 'zero'" in r.stderr
