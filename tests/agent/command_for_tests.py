"""A command-line agent that misbehaves on purpose (SEER_RECORD's "do"), for the runner's tests."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agents_for_tests import environment, spawn_tree  # noqa: E402


def main() -> None:
    record = json.loads(os.environ["SEER_RECORD"])
    do = record["do"]
    if do == "ok":
        Path(os.environ["SEER_REWARD_FILE"]).write_text(f"{record['reward']}\n")
    elif do == "none":
        pass
    elif do == "crash":
        print("something went wrong in the agent", file=sys.stderr)
        sys.exit(4)
    elif do == "tree":
        spawn_tree(record["pid_file"])
        time.sleep(3600)
    elif do == "environ":
        Path(record["out"]).write_text(json.dumps(environment()))
    elif do == "junk":
        Path(os.environ["SEER_REWARD_FILE"]).write_text("high\n")


def handle(session: dict) -> float | None:
    """A session of the served agent (agent.serve: true)."""
    record = session["record"]
    do = record["do"]
    if do == "ok":
        return record["reward"]
    if do == "crash":
        raise RuntimeError("the served agent broke")
    if do == "hang":
        time.sleep(3600)
    if do == "pid":  # which process served it
        return os.getpid()
    if do == "die":  # the whole serving process goes, the other sessions in it with it
        os._exit(3)
    if do == "garbage":
        os.write(int(os.environ["SEER_TEST_STDOUT_FD"]), b"\xff\xff\xff\xffnot a frame")
        time.sleep(3600)
    raise AssertionError(f"unknown behaviour {do!r}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        os.environ["SEER_TEST_STDOUT_FD"] = str(os.dup(1))
        from seer.tasks.agents.serve_sessions import serve

        serve(handle)
    else:
        main()
