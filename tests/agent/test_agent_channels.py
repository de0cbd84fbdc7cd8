"""The agent host's channels (seer.rollout.agent_host, seer.rollout.agents._Host), attacked by agents
on real processes: a session cannot reach the driver or another session's result, a bad frame ends
its host without stalling later sessions, a host that has threads forks no more, frames stay bounded."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from seer.rollout.agent_host import (MAX_ERROR_BYTES, MAX_RESULT_FRAME_BYTES, FrameError, FrameReader, check_reward,
                                     error_line, frame, json_size)
from seer.rollout.agents import AgentConfig, AgentRunner, AgentSession, AgentSpec

from tests.agent.test_agent_runner import alive, wait_gone

HOSTILE = "tests.agent.hostile_agents:agent"


def session(sid: str, **record) -> AgentSession:
    return AgentSession(sid, "http://127.0.0.1:9/v1", f"key-{sid}", record, "m")


def runner_for(target: str, tmp_path: Path, timeout_s: float = 30.0, max_concurrent: int = 16,
               inherit_env: tuple[str, ...] = ()) -> AgentRunner:
    cfg = AgentConfig(timeout_s=timeout_s, inherit_env=inherit_env)
    return AgentRunner(AgentSpec.parse(target, timeout_s, cfg=cfg), max_concurrent, log_dir=tmp_path / "logs")


def test_a_session_that_forges_frames_on_every_descriptor_runs_nothing_in_the_driver_and_fails_alone(tmp_path):
    """The forger writes a pickled frame (that would run `touch`) and JSON frames claiming the
    victim's result to every pipe and socket it can reach: its own descriptors, and its host's and
    the driver's through /proc. Nothing runs in the driver, the victim keeps its own reward, the
    forger's own result is malformed (its own failure), and the host carries on."""
    marker = tmp_path / "ran-in-the-driver"
    out = tmp_path / "forger.json"
    runner = runner_for(HOSTILE, tmp_path)

    async def go():
        victim = asyncio.ensure_future(runner.run(session("victim", do="sleep_then", sleep_s=1.5, reward=0.25)))
        others = [asyncio.ensure_future(runner.run(session(f"ok{i}", do="ok", reward=0.5))) for i in range(3)]
        await asyncio.sleep(0.5)  # the victim's process is running when the forger writes
        forger = await runner.run(session("forger", do="forge", victim="victim", marker=str(marker),
                                          driver_pid=os.getpid(), out=str(out)))
        host_pid = runner._host.proc.pid
        after = await runner.run(session("after", do="ok", reward=0.75))
        same_host = runner._host.proc.pid == host_pid
        try:
            return forger, await victim, await asyncio.gather(*others), after, same_host
        finally:
            await runner.close()

    forger, victim, others, after, same_host = asyncio.run(go())
    time.sleep(0.5)  # a command run by os.system would have touched the marker by now
    assert not marker.exists(), "a pickled frame from an agent ran a command in the driver"
    found = json.loads(out.read_text())
    assert found["wrote"], f"the forger reached no descriptor at all: {found}"
    # nothing the session holds is the host's: not the driver's socket, not another session's channel
    # (pipes and sockets are named by inode; "anon_inode:[eventpoll]" names every epoll alike)
    own = {t for fd, t in found["own"].items() if int(fd) >= 3 and t.startswith(("pipe:", "socket:"))}
    host = {t for fd, t in found["host"].items() if int(fd) >= 3 and t.startswith(("pipe:", "socket:"))}
    assert not own & host, f"the session holds the host's descriptors: {own & host}"
    assert (victim.reward, victim.error) == (0.25, None)
    assert forger.reward == 0.0 and "malformed result" in (forger.error or ""), forger
    assert [(o.reward, o.error) for o in others] == [(0.5, None)] * 3
    assert (after.reward, after.error) == (0.75, None) and same_host


def test_long_non_ascii_errors_from_many_concurrent_sessions_arrive_whole_and_within_the_frame_bound(tmp_path):
    """Each error is 3000 characters of 1- to 4-byte UTF-8 and control characters (6 bytes as JSON):
    it arrives cut to its byte bound, exactly as the session's process cut it, whoever wrote at once."""
    runner = runner_for(HOSTILE, tmp_path, max_concurrent=24)
    texts = {f"s{i}": f"session s{i} " + "ü\x01€😀a" * 600 for i in range(24)}
    sessions = [session(sid, do="long_error", text=text) for sid, text in texts.items()]

    async def go():
        try:
            return await asyncio.gather(*map(runner.run, sessions))
        finally:
            await runner.close()

    outs = dict(zip(texts, asyncio.run(go())))
    for sid, text in texts.items():
        expected = error_line(RuntimeError(text))
        assert expected.startswith(f"RuntimeError: session {sid} ") and expected.endswith("…")
        assert outs[sid].reward == 0.0 and outs[sid].error == expected, sid
        assert json_size(expected) <= MAX_ERROR_BYTES
        assert len(frame({"result": None, "error": expected}, MAX_RESULT_FRAME_BYTES)) <= 4 + MAX_RESULT_FRAME_BYTES


def test_frames_are_bounded_in_bytes_and_json_only():
    with pytest.raises(FrameError, match="over the 4096-byte bound"):
        frame({"error": "ü" * 3000}, MAX_RESULT_FRAME_BYTES)
    with pytest.raises(FrameError, match="announced, over"):
        FrameReader(MAX_RESULT_FRAME_BYTES).feed(b"\xff\xff\xff\xff")
    with pytest.raises(FrameError, match="not a JSON frame"):
        FrameReader(100).feed(b"\x00\x00\x00\x03\x80\x04K")  # a pickle's first bytes
    with pytest.raises(FrameError, match="NaN"):
        FrameReader(100).feed(b"\x00\x00\x00\x0d{\"result\":NaN}")
    assert FrameReader(100).feed(frame({"result": 0.5, "error": None}, 100)) == [{"result": 0.5, "error": None}]


def test_a_garbage_frame_to_the_driver_ends_its_host_fails_its_sessions_at_once_and_later_sessions_run(
        tmp_path, monkeypatch, caplog):
    """The host's warm-up imports what a session imported late: here a module that writes garbage
    to every socket the host holds, the driver's included. The driver's reader takes the host for
    dead: the sessions running there fail at once, not at agent.timeout_s; a new host runs the next
    ones. A host killed outright does the same."""
    monkeypatch.setenv("SEER_TEST_DRIVER_PID", str(os.getpid()))
    timeout_s = 60.0
    runner = runner_for(HOSTILE, tmp_path, timeout_s=timeout_s, inherit_env=("SEER_TEST_DRIVER_PID",))

    async def started(sids: list[str]) -> None:
        deadline = time.monotonic() + 20
        while not (runner._host and all(runner._host.pending.get(s) and runner._host.pending[s].pid for s in sids)):
            assert time.monotonic() < deadline, f"{sids} never started"
            await asyncio.sleep(0.05)

    async def go():
        hang = [asyncio.ensure_future(runner.run(session(f"hang{i}", do="hang"))) for i in range(2)]
        await started(["hang0", "hang1"])
        first = runner._host.proc.pid
        t0 = time.monotonic()
        poison = await runner.run(session("poison", do="poison"))
        hung = await asyncio.gather(*hang)
        failed_in = time.monotonic() - t0
        t1 = time.monotonic()
        later = await asyncio.gather(*(runner.run(session(f"ok{i}", do="ok", reward=0.5)) for i in range(4)))
        later_in = time.monotonic() - t1
        second = runner._host.proc.pid
        # the new host killed outright: the session on it fails at once, the next runs on a third
        victim = asyncio.ensure_future(runner.run(session("killed", do="hang")))
        await started(["killed"])
        os.kill(second, signal.SIGKILL)
        killed = await victim
        last = await runner.run(session("last", do="ok", reward=0.25))
        third = runner._host.proc.pid
        await runner.close()
        return first, second, third, poison, hung, failed_in, later, later_in, killed, last

    with caplog.at_level(logging.WARNING, logger="seer.rollout.agents"):
        first, second, third, poison, hung, failed_in, later, later_in, killed, last = asyncio.run(go())
    for o in [poison, *hung]:
        assert o.reward == 0.0 and "malformed frame" in o.error and "session was ended" in o.error, o
    assert failed_in < timeout_s / 3, f"the host's sessions waited {failed_in:.1f} s for their timeout"
    assert [(o.reward, o.error) for o in later] == [(0.5, None)] * 4
    assert later_in < timeout_s / 3
    assert len({first, second, third}) == 3 and not wait_gone([first, second])
    assert killed.reward == 0.0 and "exited" in killed.error and killed.wall_s < timeout_s / 3, killed
    assert (last.reward, last.error) == (0.25, None)
    assert "malformed frame" in caplog.text


def thread_reports(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_agent_module_that_starts_a_thread_at_import_is_never_forked_with_it(tmp_path, caplog):
    """The agent's own module starts a thread: the host that imported it forks nothing; sessions run
    from a host that does not import the agent, which has one thread at every fork."""
    out = tmp_path / "threads.jsonl"
    runner = runner_for("tests.agent.threaded_agent:agent", tmp_path, max_concurrent=3)
    sessions = [session(f"s{i}", do="parent_threads", out=str(out)) for i in range(3)]

    async def go():
        try:
            return await asyncio.gather(*map(runner.run, sessions))
        finally:
            await runner.close()

    with caplog.at_level(logging.WARNING, logger="seer.rollout.agents"):
        outs = asyncio.run(go())
    assert [(o.reward, o.error) for o in outs] == [(1.0, None)] * 3
    reports = thread_reports(out)
    assert len(reports) == 3 and all(r["threads"] == 1 for r in reports), reports
    assert "threads after importing" in caplog.text
    assert "threads after importing" in (tmp_path / "logs" / "agent-host.log").read_text()
    assert not wait_gone([r["ppid"] for r in reports])


def test_a_module_the_first_sessions_import_late_that_starts_a_thread_retires_the_warm_host(tmp_path, caplog):
    """The warm-up imports into the host what the first session imported late; that module starts a
    thread, so the host forks no more: the next sessions come from a new host, one thread at each fork."""
    out = tmp_path / "threads.jsonl"
    runner = runner_for(HOSTILE, tmp_path, max_concurrent=1)
    sessions = [session("s0", do="parent_threads", out=str(out), **{"import": "tests.agent.thread_on_import"}),
                *(session(f"s{i}", do="parent_threads", out=str(out)) for i in (1, 2, 3))]

    async def go():
        try:
            return [await runner.run(s) for s in sessions]
        finally:
            await runner.close()

    with caplog.at_level(logging.WARNING, logger="seer.rollout.agents"):
        outs = asyncio.run(go())
    assert [(o.reward, o.error) for o in outs] == [(1.0, None)] * 4
    reports = thread_reports(out)
    assert [r["threads"] for r in reports] == [1] * 4, reports
    first = reports[0]["ppid"]
    assert all(r["ppid"] != first for r in reports[1:]), "a session forked from the host that has a thread"
    assert "late" in caplog.text and "threads" in caplog.text
    assert not wait_gone([r["ppid"] for r in reports])


NUMBERS = {"f32": ("float32", 0.5, 0.5), "i64": ("int64", 1, 1.0), "f16": ("float16", 0.25, 0.25),
           "u8": ("uint8", 3, 3.0), "zero_d": ("array", 0.75, 0.75)}
NOT_REWARDS = {"nan": ("float64", "nan", "expected a finite"), "inf": ("float32", "inf", "expected a finite"),
               "big": ("big_int", 0, "too large for a float"), "bool": ("bool_", True, "expected a finite"),
               "complex": ("complex64", 1, "expected a finite"), "vector": ("array", [1.0], "expected a finite")}


def test_numpy_scalar_rewards_score_as_numbers_and_non_finite_or_non_real_ones_as_the_agents_error(tmp_path):
    """Through a session's own process and its channel (JSON), as the agent returned them."""
    runner = runner_for(HOSTILE, tmp_path)
    cases = {**{k: (t, v) for k, (t, v, _) in NUMBERS.items()}, **{k: (t, v) for k, (t, v, _) in NOT_REWARDS.items()}}
    sessions = [session(k, do="number", type=t, value=float(v) if v == "nan" or v == "inf" else v)
                for k, (t, v) in cases.items()]

    async def go():
        try:
            return await asyncio.gather(*map(runner.run, sessions))
        finally:
            await runner.close()

    outs = dict(zip(cases, asyncio.run(go())))
    for k, (_, _, reward) in NUMBERS.items():
        assert (outs[k].reward, outs[k].error) == (reward, None), (k, outs[k])
    for k, (_, _, words) in NOT_REWARDS.items():
        assert outs[k].reward == 0.0 and words in (outs[k].error or ""), (k, outs[k])


def test_check_reward_takes_any_real_number_and_names_what_it_refuses():
    for value, expected in [(np.float32(0.5), 0.5), (np.int64(-2), -2.0), (Fraction(1, 4), 0.25), (3, 3.0),
                            (np.float64(1e300), 1e300), (None, None)]:
        assert check_reward(value) == expected and (expected is None or type(check_reward(value)) is float)
    for value, words in [(True, "expected a finite"), (np.bool_(False), "expected a finite"), ("1", "expected a finite"),
                         (float("nan"), "returned nan"), (np.float32("inf"), "inf"),
                         (10 ** 400, "too large for a float"), (1j, "expected a finite"), (np.array([1.0]), "expected"),
                         (object(), "expected a finite")]:
        with pytest.raises(TypeError, match=words):
            check_reward(value)


def test_a_served_command_agent_starts_once_and_its_failure_fails_its_sessions_at_once_not_later_ones(tmp_path):
    """agent.serve: one process serves every session (the same pid); a session's exception is its own
    error; the process dying, or writing a frame that is not one, fails the sessions it held at once
    and the next session gets a new process."""
    timeout_s = 60.0
    cfg = AgentConfig(timeout_s=timeout_s, serve=True)
    spec = AgentSpec.parse(f"{sys.executable} {Path(__file__).parent / 'command_for_tests.py'} --serve", timeout_s,
                           cfg=cfg)
    assert spec.serve and spec.kind == "command"
    runner = AgentRunner(spec, 8, log_dir=tmp_path / "logs")

    async def go():
        first = await asyncio.gather(*(runner.run(session(f"p{i}", do="pid")) for i in range(4)),
                                     runner.run(session("ok", do="ok", reward=0.5)),
                                     runner.run(session("crash", do="crash")))
        outs = {}
        for fault in ("die", "garbage"):
            held = asyncio.ensure_future(runner.run(session(f"held-{fault}", do="hang")))
            await asyncio.sleep(0.3)
            t0 = time.monotonic()
            outs[fault] = await runner.run(session(fault, do=fault))
            outs[f"held-{fault}"] = await held
            outs[f"{fault}_s"] = time.monotonic() - t0
            outs[f"after-{fault}"] = await runner.run(session(f"after-{fault}", do="pid"))
        await runner.close()
        return first, outs

    first, outs = asyncio.run(go())
    pids = {o.reward for o in first[:4]}
    assert len(pids) == 1 and all(o.error is None for o in first[:4]), first
    assert (first[4].reward, first[4].error) == (0.5, None)
    assert first[5].reward == 0.0 and first[5].error == "RuntimeError: the served agent broke"
    assert "exited with status 3" in outs["die"].error and "exited with status 3" in outs["held-die"].error
    assert "malformed frame" in outs["garbage"].error and "malformed frame" in outs["held-garbage"].error
    assert outs["die_s"] < timeout_s / 3 and outs["garbage_s"] < timeout_s / 3
    served_by = [pids.pop(), outs["after-die"].reward, outs["after-garbage"].reward]
    assert len(set(served_by)) == 3 and all(outs[f"after-{f}"].error is None for f in ("die", "garbage"))
    assert not wait_gone([int(p) for p in served_by])
