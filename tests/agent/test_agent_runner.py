"""The agent plug point (seer.rollout.agents): an agent's faults cost only its own session.

Real processes throughout: the agent host, its forked sessions, command agents and the process trees
they start. No vLLM: the agents here either need no gateway or talk to bench/harness/openai_standin.py (the
real gateway's own tests run these agents against real instances).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest

from seer.config import ConfigError, load_config
from seer.rollout.agents import AgentConfig, AgentRunner, AgentSession, AgentSpec, AgentSpecError
from seer.tasks.calculator import CalcTaskConfig, generate_problems, score

from bench.harness.openai_standin import MODEL, Server, StandIn

HERE = Path(__file__).resolve().parent
TEST_AGENT = "tests.agent.agents_for_tests:agent"
SECRETS = {"WANDB_API_KEY": "wandb-secret-0451", "VLLM_API_KEY": "instances-secret-0451",
           "SEER_DGDS_TOKEN": "dgds-secret-0451", "HF_TOKEN": "hf-secret-0451"}
TIMEOUT_S = 3.0


def session(sid: str, **record) -> AgentSession:
    return AgentSession(sid, "http://127.0.0.1:9/v1", f"key-{sid}", record, MODEL)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie nobody reaped yet is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: list[int], within_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(map(alive, pids)):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def pids_in(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


async def run_all(runner: AgentRunner, sessions: list[AgentSession]) -> dict:
    try:
        outs = await asyncio.gather(*map(runner.run, sessions))
    finally:
        await runner.close()
    return {s.session_id: o for s, o in zip(sessions, outs)}


def test_a_function_agent_that_crashes_hangs_exits_or_dies_costs_only_its_own_session(tmp_path, monkeypatch):
    """Process mode: every fault at once next to good sessions; the host and every process the
    sessions started are gone at the end, and no run secret reached an agent."""
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    spec = AgentSpec.parse(TEST_AGENT, TIMEOUT_S)
    assert (spec.kind, spec.mode) == ("function", "process")
    runner = AgentRunner(spec, max_concurrent=16, log_dir=tmp_path / "logs")
    trees = {d: tmp_path / f"{d}.pids" for d in ("tree", "leave_tree")}
    sessions = [session("ok1", do="ok", reward=0.75), session("ok2", do="ok", reward=1), session("none", do="none"),
                session("crash", do="crash"), session("exit", do="exit"), session("interrupt", do="interrupt"),
                session("hang", do="hang"), session("block", do="block"), session("die", do="die"),
                session("junk", do="junk"), session("tree", do="tree", pid_file=str(trees["tree"])),
                session("leave_tree", do="leave_tree", pid_file=str(trees["leave_tree"])),
                session("environ", do="environ", out=str(tmp_path / "environ.json"))]
    cancelled_tree = tmp_path / "cancelled.pids"

    async def with_one_cancelled() -> dict:
        """A session whose caller gives up (the gateway's rollout at an iteration's end): its run()
        raises CancelledError and its processes are killed."""
        victim = asyncio.ensure_future(runner.run(session("cancelled", do="tree", pid_file=str(cancelled_tree))))
        out = asyncio.ensure_future(run_all(runner, sessions))
        while len(pids_in(cancelled_tree)) < 3 and not victim.done():
            await asyncio.sleep(0.05)
        victim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await victim
        return await out

    t0 = time.monotonic()
    out = asyncio.run(with_one_cancelled())
    took = time.monotonic() - t0

    assert (out["ok1"].reward, out["ok1"].error) == (0.75, None)
    assert (out["ok2"].reward, out["ok2"].error) == (1.0, None)
    assert (out["none"].reward, out["none"].error) == (None, None)
    assert (out["environ"].reward, out["environ"].error) == (1.0, None)
    assert (out["leave_tree"].reward, out["leave_tree"].error) == (1.0, None)
    expected = {"crash": "RuntimeError: the agent broke", "exit": "SystemExit: 3", "interrupt": "KeyboardInterrupt",
                "hang": "agent.timeout_s (3 s)", "block": "agent.timeout_s (3 s)", "tree": "agent.timeout_s (3 s)",
                "die": "exited with status 9", "junk": "expected a finite real number"}
    for sid, words in expected.items():
        assert out[sid].reward == 0.0 and words in (out[sid].error or ""), (sid, out[sid])
    for sid in ("hang", "block", "tree"):
        assert out[sid].wall_s >= TIMEOUT_S - 0.05
    assert took < TIMEOUT_S + 30, f"the faulty sessions held the others up: {took:.1f} s"
    assert runner.peak_running == len(sessions) + 1

    # the killed sessions' process trees, and what a finished session left behind, are gone
    for name, path in {**trees, "cancelled": cancelled_tree}.items():
        pids = pids_in(path)
        assert len(pids) == 3, (name, pids)  # the session's process, its child, its grandchild
        assert not wait_gone(pids), f"{name}: processes left behind"
    # the host is gone after close()
    assert runner._host is None

    env = json.loads((tmp_path / "environ.json").read_text())
    for name, value in SECRETS.items():
        assert value not in env["proc"] and value not in env["os"], f"{name} reached the agent"
    assert "PATH=" in env["proc"] and "OPENAI_AGENTS_DISABLE_TRACING=1" in env["proc"]


def test_in_loop_mode_a_raising_exiting_or_hanging_agent_costs_only_its_own_session():
    spec = AgentSpec.parse(TEST_AGENT, 1.0, cfg=AgentConfig(mode="loop"))
    runner = AgentRunner(spec, max_concurrent=8)
    sessions = [session("ok", do="ok", reward=0.5), session("crash", do="crash"), session("exit", do="exit"),
                session("interrupt", do="interrupt"), session("hang", do="hang"), session("junk", do="junk")]
    out = asyncio.run(run_all(runner, sessions))
    assert (out["ok"].reward, out["ok"].error) == (0.5, None)
    for sid, words in {"crash": "RuntimeError", "exit": "SystemExit", "interrupt": "KeyboardInterrupt",
                       "hang": "agent.timeout_s (1 s)", "junk": "expected a finite real number"}.items():
        assert out[sid].reward == 0.0 and words in out[sid].error, (sid, out[sid])


def test_a_command_agent_gets_its_session_not_the_runs_secrets_and_its_tree_dies_with_it(tmp_path, monkeypatch):
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    spec = AgentSpec.parse(f"{sys.executable} {HERE / 'command_for_tests.py'}", TIMEOUT_S)
    assert spec.kind == "command"
    runner = AgentRunner(spec, max_concurrent=8, log_dir=tmp_path / "logs")
    pid_file = tmp_path / "tree.pids"
    sessions = [session("ok", do="ok", reward=0.25), session("none", do="none"), session("crash", do="crash"),
                session("junk", do="junk"), session("tree", do="tree", pid_file=str(pid_file)),
                session("environ", do="environ", out=str(tmp_path / "environ.json"))]
    out = asyncio.run(run_all(runner, sessions))

    assert (out["ok"].reward, out["ok"].error) == (0.25, None)
    assert (out["none"].reward, out["none"].error) == (None, None)
    assert out["crash"].reward == 0.0
    assert "status 4" in out["crash"].error and "something went wrong in the agent" in out["crash"].error
    assert out["junk"].reward == 0.0 and "'high'" in out["junk"].error
    assert out["tree"].reward == 0.0 and "agent.timeout_s" in out["tree"].error
    pids = pids_in(pid_file)
    assert len(pids) == 3 and not wait_gone(pids), f"the command's process tree outlived its timeout: {pids}"

    env = dict(kv.split("=", 1) for kv in json.loads((tmp_path / "environ.json").read_text())["proc"].split("\0") if kv)
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1" and env["OPENAI_API_KEY"] == "key-environ"
    assert env["SEER_SESSION_ID"] == "environ" and env["SEER_MODEL"] == MODEL
    assert json.loads(env["SEER_RECORD"]) == sessions[-1].record
    leaked = [k for k, v in SECRETS.items() if any(v in x for x in env.values())]
    assert not leaked, f"run secrets reached the agent: {leaked}"


def test_task_agent_and_the_agent_keys_are_checked_when_the_config_loads():
    cfg = load_config(overrides=[f"task.agent={TEST_AGENT}", "agent.timeout_s=5", "agent.max_concurrent=3"])
    assert (cfg.task.agent, cfg.agent.timeout_s, cfg.agent.max_concurrent) == (TEST_AGENT, 5.0, 3)
    bad = {"task.agent=tests.agent.agents_for_tests:not_async": "coroutine function",
           "task.agent=no-such-program --flag": "not an executable on PATH",
           "agent.timeout_s=0": "agent.timeout_s", "agent.max_concurrent=0": "agent.max_concurrent"}
    for override, words in bad.items():
        with pytest.raises(ConfigError, match=words):
            load_config(overrides=[f"task.agent={TEST_AGENT}", override])
    with pytest.raises(ConfigError, match="task.agent_args"):
        load_config(overrides=[f"task.agent={TEST_AGENT}", "task.agent_args={extra: 1}"])
    with pytest.raises(ConfigError, match="not both"):
        load_config(overrides=[f"task.agent={TEST_AGENT}", "task.env=calculator"])
    served = load_config(overrides=[f"task.agent={sys.executable} -m seer.tasks.agents.calculator_command --serve",
                                     "agent.serve=true"])
    assert served.agent.serve is True
    with pytest.raises(ConfigError, match="agent.serve: only a command-line agent"):
        load_config(overrides=[f"task.agent={TEST_AGENT}", "agent.serve=true"])
    with pytest.raises(AgentSpecError, match="no keyword arguments"):
        AgentSpec.parse(f"{sys.executable} -c pass", 5, args={"x": 1})


# ---- the calculator agents (seer.tasks.agents), against a stand-in for the gateway ----------------

@pytest.fixture(scope="module")
def standin():
    st = StandIn()
    server = Server(st)
    yield st, server
    server.close()


def calc_sessions(st: StandIn, server: Server, tag: str, n: int) -> list[AgentSession]:
    problems = generate_problems(CalcTaskConfig(num_prompts=n, seed=3))
    out = []
    for i, p in enumerate(problems):
        sid = f"{tag}{i}"
        # the last session is not told the model's name: the agent asks /v1/models
        out.append(AgentSession(sid, server.base_url, st.key_for(sid), {"prompt": p.text, "reference": p.reference},
                                MODEL if i < n - 1 else ""))
    return out


def transcript(st: StandIn, sid: str) -> str:
    """The session's whole conversation as the embedded chat format renders it (calls and answers)."""
    last = st.conversation(sid)[-1]
    text = ""
    for m in last[1:]:
        if m["role"] == "assistant":
            text += "".join(f"<calc>{json.loads(c['function']['arguments'])['expression']}</calc>"
                            for c in m.get("tool_calls", []))
        elif m["role"] == "tool":
            text += f"={m['content']}\n"
    return text


@pytest.mark.parametrize("kind", ["openai", "sdk", "command", "command_serve"])
def test_the_calculator_agents_play_the_task_through_an_openai_api_and_score_like_the_environment(kind, standin):
    st, server = standin
    command = f"{sys.executable} -m seer.tasks.agents.calculator_command --latency-median-s 0"
    target = {"openai": "seer.tasks.agents.calculator_openai:agent", "sdk": "seer.tasks.agents.calculator_sdk:agent",
              "command": command, "command_serve": f"{command} --serve"}[kind]
    args = None if kind.startswith("command") else {"latency_median_s": 0.0}
    cfg = AgentConfig(timeout_s=120, serve=kind == "command_serve")
    runner = AgentRunner(AgentSpec.parse(target, 120, args=args, cfg=cfg), max_concurrent=2)
    # four sessions where the bound is checked (the openai agent); two elsewhere (each a cold start)
    sessions = calc_sessions(st, server, kind, 4 if kind == "openai" else 2)
    slip = max(sessions, key=lambda s: s.record["reference"]["total"])
    assert slip.record["reference"]["total"] > 9
    st.slip_after[slip.session_id] = 1  # its second call takes 10 away: the session ends there
    st.hold_s = 0.2
    try:
        out = asyncio.run(run_all(runner, sessions))
    finally:
        st.hold_s = 0.0
    assert all(o.error is None for o in out.values()), out
    for s in sessions:
        # the conversation the agent held: its calls, and the calculator's answers as tool messages
        text = transcript(st, s.session_id)
        assert text.startswith(f"<calc>{s.record['prompt'].split('start=')[1].strip()}-")
        expected = score(text, s.record["reference"])  # the environment's reward, from the same text
        assert out[s.session_id].reward == (None if kind == "sdk" else expected), (s.session_id, text)
    rewards = {s.session_id: score(transcript(st, s.session_id), s.record["reference"]) for s in sessions}
    assert 0 < rewards.pop(slip.session_id) < 1 and set(rewards.values()) == {1.0}
    assert st.peak_in_flight <= 2 and runner.peak_running <= 2  # agent.max_concurrent holds
