"""Every process of a whole `seer-run --sync` that starts its own Ray, Mooncake and DGDS: what it
listens on, what it inherits, and that none outlives the run when the job is killed.

One run (one tiny instance, DGDS and the KV pool on, two trainer ranks so that the trainer has a
TCP rendezvous) is shared: once it is up, every listening socket of every process of it is
compared with docs/cluster.md's "what listens where" table (parsed from it, so the two cannot drift), a
secret in `seer-run`'s environment is looked for in the vLLM processes' environments, and OPTIONS
without the secret is sent to the instance; then it is SIGKILLed and must leave no process. SIGTERM
and Ctrl-C (SIGINT to the job's process group) get cheaper runs, no trainer, stopped while the
instance is still starting. Each job runs under tests.reaper, so that a process that lost its
parent is still found.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from test_results_index import table_after
from tests.sockets import _ppid, listening, process_tree

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
SECRET = "dummy-wandb-key-of-the-driver"
NODE_IP = "127.0.0.2"  # the one-node Ray seer-run starts (seer.fleet.ray_cluster.LOCAL_NODE_IP)
WILDCARD = ("0.0.0.0", "::")
GONE_WITHIN_S = 60.0  # the guards' grace (10 s) and Ray's own shutdown, on a busy machine
SMALL = {"model.preset": "tiny", "task.num_prompts": 4, "rollout.groups_per_iteration": 2, "rollout.group_size": 2,
         "rollout.max_tokens": 32, "instances.count": 1, "kvpool.capacity_bytes": 16 * 2**20, "dgds.enabled": "true",
         "task.agent": "tests.gateway.agents_for_tests:run_agent"}  # the agent gateway listens too


def listen_table() -> dict[str, str]:
    """docs/cluster.md's "Secrets and what listens where" table: service -> what it binds."""
    header, rows = table_after(ROOT / "docs" / "cluster.md", "## Secrets and what listens where", "service | binds")
    return {r[0]: r[1] for r in rows}


def row(table: dict[str, str], starts: str) -> str:
    [name] = [k for k in table if k.startswith(starts)] or [None]
    assert name is not None, f"docs/cluster.md's listeners table has no row starting {starts!r}: {sorted(table)}"
    return table[name]


def allows(binds: str, addr: str, port: int, host_addrs: set[str]) -> bool:
    """Whether a `binds` cell of the table covers a socket listening on (addr, port)."""
    if addr in WILDCARD:
        if "every interface" not in binds:
            return False
        r = re.search(r"port in (\d+)[–-](\d+)", binds)
        return r is None or int(r.group(1)) <= port <= int(r.group(2))
    if "every interface" in binds:
        return True
    if addr == NODE_IP:
        return bool(re.search(r"node|\.host`|MC_TCP_BIND_ADDRESS", binds))
    if addr == "127.0.0.1" and "`127.0.0.1`" in binds:
        return True
    return addr in host_addrs and "host name" in binds


def host_name_addresses() -> set[str]:
    """What this machine's host name resolves to (gloo binds there when it can)."""
    try:
        return {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return set()


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@dataclass
class Job:
    """One `seer-run --sync` under tests.reaper; `pid` is seer-run's."""

    reaper: subprocess.Popen
    pid: int
    run_dir: Path
    log: Path

    @classmethod
    def start(cls, tmp: Path, sets: dict, iterations: int = 1000) -> Job:
        run_dir, log = tmp / "run", tmp / "seer-run.log"
        cmd = [sys.executable, "-m", "seer.cli", "--sync", "--iterations", str(iterations), "--run-dir", str(run_dir)]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        reaper = subprocess.Popen([sys.executable, "-m", "tests.reaper", "--", *cmd], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=open(log, "w"), cwd=ROOT,
                                  env=dict(os.environ, WANDB_API_KEY=SECRET))
        return cls(reaper, int(reaper.stdout.readline()), run_dir, log)

    def processes(self) -> list[int]:
        """Every live process of the job, seer-run included while it lives (not the reaper)."""
        return [p for p in process_tree(self.reaper.pid) if p != self.reaper.pid and _alive(p)]

    def wait_for(self, what: str, ready, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert _alive(self.pid), f"seer-run exited before {what}:\n{self.tail()}"
            # (the job's processes by name: once, in a full suite, the engine was not among them)
            assert time.monotonic() < deadline, (f"no {what} within {timeout_s:.0f} s; the job's processes: "
                                                 f"{[(p, _comm(p)) for p in self.processes()]}\n{self.tail()}")
            time.sleep(0.5)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def signal(self, sig: int, group: bool = False) -> float:
        """Send `sig` (to seer-run's whole process group, as a terminal's Ctrl-C does, with `group`);
        the seconds until no process of the job is left (asserted within GONE_WITHIN_S)."""
        t0 = time.monotonic()
        (os.killpg if group else os.kill)(self.pid, sig)
        while (left := self.processes()) and time.monotonic() - t0 < GONE_WITHIN_S:
            time.sleep(0.2)
        assert not left, (f"{signal.Signals(sig).name} left {len(left)} processes of the run after "
                          f"{GONE_WITHIN_S:.0f} s:\n" + "\n".join(f"{p} {_cmd(p)[:160]}" for p in left))
        return time.monotonic() - t0

    def close(self) -> None:
        """Kill whatever is left (a failed test), then end the reaper."""
        for p in self.processes():
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.reaper.stdin.close()
        self.reaper.wait(timeout=30)


def _run_log(job: Job) -> str:
    try:
        return (job.run_dir / "run.log").read_text()
    except OSError:
        return ""


@pytest.fixture(scope="module")
def whole_run(tiny_model, tmp_path_factory):
    """The shared run: DGDS, the KV pool, two trainer ranks; up once its instances are ready."""
    job = Job.start(tmp_path_factory.mktemp("whole-run"), {**SMALL, "trainer.data_parallel": 2})
    try:
        t0 = time.monotonic()
        job.wait_for("ready instances and the gateway", lambda: "gateway: http" in _run_log(job))
        print(f"\nseer-run with Ray, Mooncake, DGDS and two trainer ranks up in {time.monotonic() - t0:.0f} s")
        yield job
    finally:
        job.close()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _engine_started(job: Job) -> bool:
    """Whether a vLLM API server of the job has started its engine core: a process it spawned
    (multiprocessing), found by the process tree. Not by vLLM's process title: that title
    ("VLLM::EngineCore", setproctitle) is not always set; once an engine served 70 iterations here
    as plain `python3`, and a wait for the title ran until its deadline with the job running."""
    for p in job.processes():
        if _comm(p).startswith("VLLM::Engine"):
            return True
        if "multiprocessing.spawn" in _cmd(p) and "vllm.entrypoints" in _cmd(_ppid(p) or 0):
            return True
    return False


def _service(pid: int, job: Job) -> str:
    """What a process of the run is: by its command line, else by the nearest guard above it."""
    cmd = _cmd(pid)
    if pid == job.pid:
        return "driver"
    if "seer.procs.guard" in cmd:
        return "guard"
    if cmd.startswith("ray::"):
        name = cmd.split()[0]
        return ("ray system" if name in ("ray::RuntimeEnvAgent", "ray::DashboardAgent") else
                "trainer rank" if name.startswith("ray::TrainerRank") else "ray worker")
    up = _ppid(pid)
    while up and up > 1 and up != job.reaper.pid:
        guarded = _cmd(up)
        if "seer.procs.guard" in guarded:
            guarded = guarded.split(" -- ", 1)[-1]
            return ("vllm" if "vllm.entrypoints" in guarded else "mooncake_master" if "mooncake_master" in guarded
                    else "mooncake store" if "mooncake_client" in guarded else "dgds" if "seer.dgds.server" in guarded
                    else "ray system" if " start --head" in guarded else "unknown")
        up = _ppid(up)
    return "unknown"


def _services(job: Job) -> dict[int, str]:
    """pid -> service, for every process of the run."""
    return {p: _service(p, job) for p in job.processes()}


def test_every_listener_of_a_run_is_where_the_readme_table_says(whole_run):
    """Each listening socket of each process of the run is covered by the table's row for that
    process's service and bound where the row says: a listener the table does not name, or one on
    another address (a wildcard where the row names the node address), fails."""
    table = listen_table()
    rows = {  # the table's rows each kind of process answers for
        "vllm": [row(table, "vLLM instances"), row(table, "Mooncake transfer engine"), row(table, "torch's groups")],
        "mooncake_master": [row(table, "`mooncake_master` RPC"), row(table, "`mooncake_master` HTTP")],
        "mooncake store": [row(table, "Mooncake transfer engine")],
        "dgds": [row(table, "DGDS server")],
        "trainer rank": [row(table, "torch's groups")],
        "driver": [row(table, "the driver's live metrics"), row(table, "the agent gateway")],
        "ray worker": [], "guard": [], "unknown": [],
    }
    ray = row(table, "Ray")  # a Ray worker's listener is its gRPC port, which the row names
    assert any(k.startswith("Ray") and "each worker's gRPC port" in k for k in table) and "every interface" in ray
    hosts = host_name_addresses()
    services = _services(whole_run)
    assert {"vllm", "mooncake_master", "mooncake store", "dgds", "trainer rank", "driver", "ray system"} <= set(
        services.values()), services
    bad, seen = [], 0
    for pid, service in services.items():
        found = sorted((a.removeprefix("::ffff:"), port) for a, port in listening([pid]))
        seen += len(found)
        if service == "ray system":  # Ray's GCS, raylet and agents: every interface, the table says
            assert all(allows(ray, a, port, hosts) for a, port in found)
            continue
        if service in ("driver", "ray worker", "trainer rank"):  # a Ray worker: its one gRPC port
            ray_port = [x for x in found if x[0] in WILDCARD][:1]
            found = [x for x in found if x not in ray_port]
        for a, port in found:
            if not any(allows(binds, a, port, hosts) for binds in rows[service]):
                bad.append(f"{service} (pid {pid}, {_cmd(pid)[:80]}): {a}:{port}")
    assert seen >= 8, f"found only {seen} listening sockets in the whole run: the check itself is broken"
    assert not bad, "listening where docs/cluster.md's table does not say:\n" + "\n".join(bad)
    # the trainer's rendezvous: rank 0's store on the node's address, not every interface
    trainer = [p for p, s in services.items() if s == "trainer rank"]
    assert len(trainer) == 2
    assert any(a == NODE_IP for p in trainer for a, _ in listening([p])), "no trainer rank listens on the node address"


def test_a_secret_in_seer_runs_environment_never_reaches_the_vllm_processes(whole_run):
    """Nor any other process the run starts (Ray's, the trainer ranks, Mooncake's, the DGDS server):
    each inherits only the allow-listed part of the driver's environment (seer.procs.environment), and
    the run's own secrets are in none of their exec environments."""
    services = _services(whole_run)
    environs = {}
    for p in services:
        try:
            environs[p] = Path(f"/proc/{p}/environ").read_bytes()
        except OSError:  # ended meanwhile
            continue
    vllm = [p for p in environs if services[p] == "vllm"]
    assert len(vllm) >= 3, [(p, _cmd(p)[:80]) for p in vllm]  # API server, engine core, its worker
    # the instance's own secret reaches it on a pipe, into os.environ only (seer.procs.secret_launch)
    assert not [p for p in vllm if b"VLLM_API_KEY=" in environs[p] or b"SEER_DGDS_TOKEN=" in environs[p]]
    assert SECRET.encode() in environs[whole_run.pid]  # it was there to leak
    leaked = [p for p, e in environs.items() if SECRET.encode() in e and p != whole_run.pid]
    assert not [p for p in leaked if p in vllm], f"WANDB_API_KEY of seer-run reached {[_cmd(p)[:80] for p in leaked]}"
    assert not leaked, f"WANDB_API_KEY of seer-run reached {[(services[p], _cmd(p)[:80]) for p in leaked]}"


def test_options_without_the_secret_is_refused_on_every_path_but_health(whole_run):
    [url] = re.findall(r"inst0 on node \S+ \(Ray node \w+\): (http://[\d.]+:\d+)", _run_log(whole_run))
    for path in ("/v1/completions", "/collective_rpc", "/metrics"):
        req = urllib.request.Request(url + path, method="OPTIONS", headers={"Origin": "http://elsewhere",
                                                                           "Access-Control-Request-Method": "POST"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        assert e.value.code == 401, (path, e.value.code)
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        assert r.status == 200


def test_a_sigkilled_run_leaves_no_process(whole_run):
    """SIGKILL: no clean-up code of seer-run runs; its guards, Ray and the ranks must still go.
    Last in this file: it ends the shared run."""
    before = len(whole_run.processes())
    took = whole_run.signal(signal.SIGKILL)
    print(f"\nSIGKILL: all {before} processes of the run gone in {took:.1f} s")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_run_stopped_by_a_signal_while_starting_leaves_no_process(sig, tiny_model, tmp_path):
    """SIGTERM, and Ctrl-C (SIGINT to the job's process group): stopped once Ray, Mooncake, DGDS and
    the instance's engine are running, before the instance is ready; nothing is left."""
    job = Job.start(tmp_path, {**SMALL, "train.enabled": "false"})
    try:
        job.wait_for("a vLLM engine process", lambda: _engine_started(job))
        services = set(_services(job).values())
        assert {"vllm", "mooncake_master", "mooncake store", "dgds", "ray system"} <= services, services
        before = len(job.processes())
        took = job.signal(getattr(signal, sig), group=sig == "SIGINT")
        print(f"\n{sig}: all {before} processes of the run gone in {took:.1f} s")
    finally:
        job.close()
