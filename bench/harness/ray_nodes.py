"""A real multi-node Ray cluster on one machine (tests and benchmarks): one `ray start --block` per node, each on its own
loopback address and its own cores, as `../shared/design/ray-on-one-machine.md` measured.

Each node runs in its own session under `taskset`, so its raylet, its workers and every process
they start (vLLM servers, Mooncake stores) stay on that node's cores. A node is stopped, or lost
(SIGKILL of its whole session), by its own process group: never `ray stop`, which kills Ray
processes by name across the machine.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from seer.fleet.ray_cluster import TRAINER_CPUS
from seer.procs import free_port, port_open

# Ray's own health-check timing: the fast settings (1 s period and timeout, 3 misses) declared a
# live node dead on this 2-core machine while vLLM start-up kept both cores busy, and its raylet
# then exits. Seer drops a lost node's instances by their failed calls, not by Ray's verdict.
FAST_HEALTH = {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


@dataclass
class Node:
    ip: str
    cores: str
    proc: subprocess.Popen
    log: Path

    def session_pids(self) -> list[int]:
        """Every process of this node's session (raylet, workers and what they started in it)."""
        sid = self.proc.pid
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if os.getsid(int(d.name)) == sid:
                        out.append(int(d.name))
                except (ProcessLookupError, PermissionError):
                    pass
        return out


@dataclass
class RayNodes:
    """Nodes of one cluster: `nodes[0]` is the head. `address` is its GCS, for cluster.address."""

    tmp: Path
    address: str = ""
    nodes: list[Node] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        """For every process of this cluster and every job that joins it: its own token."""
        return {**os.environ, **FAST_HEALTH, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": str(self.tmp / "token")}

    def start(self, ips: list[str], cores: list[str], timeout_s: float = 90.0) -> RayNodes:
        self.tmp.mkdir(parents=True, exist_ok=True)
        token = self.tmp / "token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        port = free_port(ips[0])
        self.address = f"{ips[0]}:{port}"
        for k, (ip, cpus) in enumerate(zip(ips, cores)):
            self.nodes.append(self._start_node(k, ip, cpus))
            if k == 0:
                self._wait(lambda: port_open(ips[0], port, 0.5), timeout_s, "the head's GCS port")
        self._wait(lambda: len(self.alive_nodes()) == len(ips), timeout_s, f"{len(ips)} live nodes")
        return self

    def _start_node(self, k: int, ip: str, cpus: str) -> Node:
        ray = str(Path(sys.executable).with_name("ray"))
        port = self.address.rsplit(":", 1)[1]
        where = ["--head", "--port", port, "--include-dashboard", "false", "--disable-usage-stats"] if k == 0 \
            else ["--address", self.address]
        cmd = ["taskset", "-c", cpus, ray, "start", "--block", *where, "--node-ip-address", ip,
               "--num-cpus", str(len(cpus.split(",")) + TRAINER_CPUS), "--resources", json.dumps({f"node{k}": 1}),
               "--temp-dir", str(self.tmp / f"n{k}")]
        log = self.tmp / f"node{k}-{time.monotonic_ns()}.log"
        proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=self.env(),
                                start_new_session=True)
        return Node(ip, cpus, proc, log)

    def revive(self, node: Node, timeout_s: float = 90.0) -> Node:
        """A replacement machine joins with the lost node's address and cores."""
        k = self.nodes.index(node)
        self.nodes[k] = self._start_node(k, node.ip, node.cores)
        self._wait(lambda: node.ip in self.alive_nodes(), timeout_s, f"node {node.ip} back")
        return self.nodes[k]

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            for n in self.nodes:
                if n.proc.poll() is not None:
                    raise RuntimeError(f"ray node {n.ip} exited: {n.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} after {timeout_s:.0f} s: "
                                   + " | ".join(n.log.read_text()[-1500:] for n in self.nodes))
            time.sleep(0.5)

    def query(self, code: str, timeout_s: float = 60.0) -> object:
        """Run `code` (which sets `result`) in a driver joined to the cluster; returns `result`."""
        script = (f"import json, ray\nray.init(address={self.address!r}, _node_ip_address={self.nodes[0].ip!r}, "
                  f"configure_logging=False, log_to_driver=False)\n{code}\nprint('RESULT=' + json.dumps(result))\n")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout_s,
                             env=self.env())
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT=")), None)
        if line is None:
            raise RuntimeError(f"cluster query failed: {out.stderr[-3000:]}")
        return json.loads(line[len("RESULT="):])

    def alive_nodes(self) -> dict[str, str]:
        """node ip -> Ray node id, for the nodes Ray counts alive."""
        try:
            return self.query("result = {n['NodeManagerAddress']: n['NodeID'] for n in ray.nodes() if n['Alive']}")
        except (RuntimeError, subprocess.TimeoutExpired):
            return {}

    def lose(self, node: Node) -> list[int]:
        """The node's machine goes away: SIGKILL every process of its session at once. Returns
        the pids that were killed."""
        pids = node.session_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        node.proc.wait(timeout=10)
        return pids

    def stop(self) -> None:
        for n in reversed(self.nodes):
            if n.proc.poll() is None:
                os.killpg(n.proc.pid, signal.SIGTERM)
        for n in reversed(self.nodes):
            try:
                n.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            for pid in n.session_pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
