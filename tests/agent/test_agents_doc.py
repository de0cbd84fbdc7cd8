"""docs/agents.md quotes what bench.agent_runner_cost recorded (no process, no model)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "bench" / "results" / "agent_gateway"


def table_rows(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("| 1 |") or line.strip().startswith("| 8 |")]


def test_the_agents_doc_quotes_the_recorded_cost_of_containment():
    doc = (ROOT / "docs" / "agents.md").read_text()
    rec = json.loads((RECORD / "runner_cost.json").read_text())
    assert table_rows(doc) == table_rows((RECORD / "runner_cost.md").read_text()) != []
    one = rec["summary"]["concurrent_1"]
    wall, own = one["session_wall_median_s"], one["agent_own_median_s"]
    ms = lambda x: round(x * 1000)  # noqa: E731
    runner_process, runner_loop = ms(wall["process"] - own["process"]), ms(wall["loop"] - own["loop"])
    said = {f"Of the {ms(wall['process'] - wall['loop'])} ms", f"{runner_process - runner_loop} ms are the runner's",
            f"is {runner_process} ms against {runner_loop} ms", f"{ms(own['process'] - own['loop'])} ms the agent's own",
            f"importing the agent: {rec['warm_up_s_median']['process']:.2f} s here",
            f"about {round(rec['process_session_uss_kib_median'] * 1024 / 1e6)} MB of its own"}
    flat = re.sub(r"\s+", " ", doc)
    assert not [s for s in said if s not in flat], [s for s in said if s not in flat]


def test_the_agents_doc_quotes_the_recorded_cost_of_a_command_agents_start():
    doc = re.sub(r"\s+", " ", (ROOT / "docs" / "agents.md").read_text())
    rec = json.loads((RECORD / "command_cost.json").read_text())
    one, eight = rec["summary"]["concurrent_1"], rec["summary"]["concurrent_8"]
    said = {f"one session at a time took {one['session_wall_median_s']['command']:.2f} s",
            f"and {one['session_wall_median_s']['serve']:.3f} s served",
            f"took {eight['total_s_median']['command']:.1f} s against {eight['total_s_median']['serve']:.2f} s "
            f"({eight['command_over_serve_total']:.2f}x)",
            f"the served process's start ({rec['warm_up_s_median']['serve']:.2f} s)"}
    assert rec["errors"] == 0 and rec["command"] == "python -m bench.agent_command_cost"
    assert not [s for s in said if s not in doc], [s for s in said if s not in doc]
