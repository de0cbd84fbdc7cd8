"""bench.harness.proc_cpu counts the CPU of the roots' descendants (by the titles they take after start)
inside the windows it is given, and nothing of other processes."""

import subprocess
import sys
import time

from bench.harness.proc_cpu import ProcCpu, kind_of

BURN = ("import setproctitle, time, sys\n"
        "setproctitle.setproctitle(sys.argv[1])\n"
        "time.sleep(1.5)\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < float(sys.argv[2]): pass\n"
        "time.sleep(1.5)\n")


def test_window_cpu_counts_descendants_by_their_later_title():
    # root: a shell that starts a grandchild; the grandchild retitles itself as a vLLM engine, then burns
    root = subprocess.Popen(["bash", "-c", f"{sys.executable} -c '{BURN}' VLLM::EngineCore 0.6; true"])
    stranger = subprocess.Popen([sys.executable, "-c", BURN, "mooncake_client", "0.6"])
    cpu = ProcCpu([root.pid], period_s=0.05).start()
    t0 = time.monotonic()
    root.wait(timeout=30)
    stranger.wait(timeout=30)
    t1 = time.monotonic()
    cpu.stop()
    whole = cpu.window_cpu([(t0, t1)])
    assert "mooncake store" not in whole  # not a descendant of the root
    engine = sum(whole["vllm engine"].values())
    assert 0.45 < engine < 1.2, whole
    # the burn happens 1.5 s after start: a window over the first second holds (almost) none of it
    early = sum(cpu.window_cpu([(t0, t0 + 1.0)]).get("vllm engine", {}).values())
    assert early < 0.2, early


def test_kinds():
    assert kind_of("VLLM::EngineCore") == "vllm engine" and kind_of("VLLM::Worker_TP0") == "vllm worker"
    assert kind_of("python -m vllm.entrypoints.openai.api_server --port 1") == "vllm api"
    assert kind_of("ray::ProcessHost.start") == "ray host actor"
    assert kind_of("/x/mooncake_client --port 2") == "mooncake store"
    assert kind_of("sleep 1") == "other"
