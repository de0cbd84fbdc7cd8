"""The run's Ray connection: join a running cluster, or start a one-node Ray of its own.

A one-node Ray started here binds to a loopback address other than 127.0.0.1 (Ray rewrites that one
to the machine's external address, and `ray.init` then retries forever), turns on Ray's token
authentication with a fresh token kept in a private temporary directory (never the run directory),
and is stopped with the run. A joined cluster is left running and brings its own token.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from seer.fleet.config import ClusterConfig
from seer.procs import GuardedProcess, free_port, port_open

LOCAL_NODE_IP = "127.0.0.2"
# A logical CPU beyond the node's cores, for the trainer ranks' bundles (trainer.cpus_per_rank each):
# in a synchronous loop the ranks compute while the instances, which hold the cores' bundles, idle.
TRAINER_CPUS = 1


class ClusterError(RuntimeError):
    """Ray could not be started or reached, or cannot place what the run asks for."""


@dataclass(frozen=True)
class NodeInfo:
    """Where a Ray actor runs: what the fleet needs to bind, pin and report."""

    node_id: str
    ip: str
    cores: tuple[int, ...]  # this node's usable cores (the raylet's affinity on simulated nodes)
    gpus: tuple[str, ...] = ()  # the GPUs Ray gave the actor


class RayCluster:
    """A connection to Ray for one run. `close()` disconnects, and stops a Ray started here."""

    def __init__(self, node_ip: str, started_here: bool, connected_here: bool, tmp_dir: Path | None = None,
                 startup_s: float = 0.0):
        self.node_ip = node_ip  # this driver's address: services on the driver's node bind here
        self.started_here = started_here
        self.connected_here = connected_here
        self.tmp_dir = tmp_dir
        self.startup_s = startup_s

    @classmethod
    def connect(cls, cfg: ClusterConfig, log_dir: str | Path | None = None) -> RayCluster:
        """Use the Ray this process is already connected to, join `cfg.address` (or RAY_ADDRESS),
        or start a one-node Ray on `cfg.node_ip` (default 127.0.0.2)."""
        t0 = time.monotonic()
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():  # a test or an embedding program connected
            return cls(sys.modules["ray"].util.get_node_ip_address(), False, False)
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        address = cfg.address or os.environ.get("RAY_ADDRESS")
        if address:
            import ray

            kwargs = {"address": address, "configure_logging": False, "log_to_driver": False}
            if cfg.node_ip:
                kwargs["_node_ip_address"] = cfg.node_ip
            _init(kwargs, cfg.connect_timeout_s, f"the Ray cluster at {address}")
            return cls(ray.util.get_node_ip_address(), False, True, startup_s=time.monotonic() - t0)
        ip = cfg.node_ip or LOCAL_NODE_IP
        # Short on purpose: Ray's socket paths live under it and must fit in 107 bytes.
        tmp = Path(tempfile.mkdtemp(prefix="seer-ray-", dir="/tmp"))
        token = tmp / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        if "ray" in sys.modules and os.environ.get("RAY_AUTH_MODE") != "token":
            shutil.rmtree(tmp, ignore_errors=True)
            raise ClusterError("ray was imported before its token authentication was set up: start Seer's own Ray "
                               "before importing ray, or set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH first")
        # Read when ray is imported (and inherited by every process of this Ray): set before that.
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
        # The head is a `ray start --block` under the guard, not ray.init's own processes: those are
        # forked with a preexec hook, and in a driver whose OpenMP runtime is up (the trainer) the
        # fork handler of Intel OpenMP pins the child, and so every Ray worker, to one core.
        port = free_port(ip)
        head = GuardedProcess(
            "ray-head", [*_ray_cli(), "start", "--head", "--block", "--node-ip-address", ip, "--port", str(port),
                         "--num-cpus", str(len(os.sched_getaffinity(0)) + TRAINER_CPUS), "--include-dashboard", "false",
                         "--disable-usage-stats", "--temp-dir", str(tmp / "r")],
            Path(log_dir or tmp) / "ray-head.log",
            # Ray's own settings (its token above) on top of what every launched process inherits: Ray's
            # workers (trainer ranks, instance hosts) see what a joined cluster's would, not the driver's secrets.
            env={**{k: v for k, v in os.environ.items() if k.startswith("RAY_")},
                 "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"})
        head.start()
        cluster = cls(ip, True, True, tmp)
        cluster.head = head
        try:
            deadline = time.monotonic() + cfg.connect_timeout_s
            while not port_open(ip, port, 0.5):
                if not head.alive() or time.monotonic() > deadline:
                    raise ClusterError(f"a one-node Ray on {ip} did not start (log {head.log_path}):\n{head.log_tail()}")
                time.sleep(0.2)
            import ray

            # In this thread (its GCS answers already): ray.init installs its signal handlers here.
            ray.init(address=f"{ip}:{port}", _node_ip_address=ip, configure_logging=False, log_to_driver=False)
        except BaseException:
            cluster.close()
            raise
        cluster.startup_s = time.monotonic() - t0
        return cluster

    head: GuardedProcess | None = None  # the `ray start --head` of a Ray started here

    def close(self) -> None:
        if self.connected_here and "ray" in sys.modules and sys.modules["ray"].is_initialized():
            sys.modules["ray"].shutdown()  # disconnects this driver
        if self.head is not None:
            self.head.stop()  # the guard takes the head's whole session down
            self.head = None
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            self.tmp_dir = None


def _init(kwargs: dict, timeout_s: float, what: str) -> None:
    """ray.init joining a cluster, with a deadline: it retries an unreachable GCS forever on its own
    (a joining driver starts no process, so the thread it runs in may end)."""
    import ray

    failure: list[BaseException] = []

    def run():
        try:
            ray.init(**kwargs)
        except BaseException as e:  # surfaced below, in the caller's thread
            failure.append(e)

    t = threading.Thread(target=run, name="ray-init", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise ClusterError(f"could not connect to {what} within {timeout_s:.0f} s (is it running, and is "
                           "cluster.node_ip this machine's address in it? RAY_AUTH_TOKEN_PATH its token?)")
    if failure:
        raise ClusterError(f"could not connect to {what}: {failure[0]}") from failure[0]


def _ray_cli() -> list[str]:
    """The `ray` command of this Python environment."""
    script = Path(sys.executable).with_name("ray")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"]

