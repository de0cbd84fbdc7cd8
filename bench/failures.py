"""Record the recovery times README.md's "Failure behaviour" table quotes.

    flock /tmp/seer-vllm.lock env LD_PRELOAD=.venv/lib/libiomp5.so python -m bench.failures [TEST ...]

Runs the failure tests (real vLLM, Mooncake and DGDS processes) with SEER_RECORD=1: each asserts
its recovery bound (stated once, in tests/failure_record.py's RECORDS) and then writes what it
measured, with the bound, to bench/results/failures/<name>.json. Without arguments, every test
below; with arguments, those pytest node ids (or pytest options) only, to re-record one. A test
that fails writes nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TESTS = (
    "tests/fleet/test_instance_failure.py",  # instance_loss.json, all_instances_lost.json
    "tests/fleet/test_rollout_faults_real.py",  # retries_exhausted.json, rollout_cancelled.json
    "tests/test_run_survives_instance_loss.py",  # run_instance_loss_rollout.json, run_instance_loss_training.json
    "tests/test_run_survives_kv_master_loss.py",  # run_kv_master_loss.json
    "tests/fleet/test_two_nodes.py::test_a_node_lost_mid_rollout_costs_no_sample_and_leaves_no_process",  # run_node_loss.json
    "tests/kvpool/test_master_restart.py",  # kv_master_restart.json
    "tests/dgds/test_dgds_grpc.py::test_client_keeps_drafting_through_a_server_restart_and_resyncs",  # dgds_restart.json
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.failures", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tests", nargs="*", metavar="TEST",
                    help="pytest node ids to record (default: every failure test listed in TESTS)")
    tests = ap.parse_args(argv).tests or list(TESTS)
    env = {**os.environ, "SEER_RECORD": "1"}
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *tests],
                           cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
