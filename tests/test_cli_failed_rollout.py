"""`seer-run` reports a failed rollout (every instance down mid-rollout, a request past its retries)
as one error line and exit 1, as docs/failures.md's table shows (no vLLM: the loop is
replaced by one that raises what the rollout driver raises)."""

import pytest

from seer import cli, loop
from seer.fleet import FleetError
from seer.scheduler import RolloutError
from seer.tasks import RewardAborted
from seer.types import PromptSpec, Sample


def _aborted() -> RewardAborted:
    s = Sample(0, 0, "it0-g0-s0", PromptSpec(3, "", [], {}), [], [], "error", 0.0, 0.0, [],
               reward_error="the agent host did not start within 60 s", failure="system")
    return RewardAborted(s, "the system failed the session")


@pytest.mark.parametrize("error", [
    RolloutError("every instance is down: inst0: dead: x; inst1: dead: y"),
    RolloutError("it0-g3-s0 failed 4 times; last on inst0: InstanceError('rejected (400)')"),
    FleetError("every instance is down (before the rollout): inst0, inst1"),
    _aborted(),  # rollout.reward_error_policy: abort, on a reward's failure or the system's
])
def test_a_failed_rollout_is_one_error_line_and_exit_1(error, monkeypatch, capsys, tmp_path):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(loop, "run", fail)
    assert cli.main(["--sync", "--run-dir", str(tmp_path / "run"), "--set", "model.preset=tiny"]) == 1
    out = capsys.readouterr().out
    assert f"seer-run: {error}" in " ".join(out.split()), out
    assert "Traceback" not in out
