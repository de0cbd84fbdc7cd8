"""The run config's `instances:` section: how many vLLM instances, or which running ones to use.

Light on purpose: `seer.config` composes it, and `import seer.config` loads nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class InstancesConfig:
    count: int = 2  # vLLM instances to launch (one CPU core or GPU set each)
    urls: list[str] = field(default_factory=list)  # connect to running servers instead of launching
    kv_cache_bytes: int | None = 256 * 2**20  # per instance; CPU RAM reserved for KV blocks
    max_num_seqs: int = 256  # vLLM's --max-num-seqs: requests an instance runs at once
    startup_timeout_s: float = 600.0  # how long launched instances may take to answer /health
    extra_args: list[str] = field(default_factory=list)  # more vLLM server arguments for launched instances


PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
WEIGHT_TRANSPORTS = ("auto", "shared-fs", "ray")


@dataclass(frozen=True)
class ClusterConfig:
    """The run config's `cluster:` section: the Ray cluster that places a launched fleet.

    Without an address seer-run starts a one-node Ray of its own on `node_ip` (a loopback address:
    Ray rewrites 127.0.0.1 to the machine's external one) with its own auth token, and stops it at
    the end; with one it joins that cluster and uses the cluster's token (RAY_AUTH_TOKEN_PATH).
    """

    address: str | None = None  # host:port of a running cluster's GCS; RAY_ADDRESS works too
    node_ip: str | None = None  # this machine's address in the cluster; None: 127.0.0.2 when started here
    placement_strategy: str = "PACK"  # one bundle per instance: PACK, SPREAD, STRICT_PACK or STRICT_SPREAD
    cpus_per_instance: int = 1  # CPUs in each instance's bundle (its share of its node's cores)
    gpus_per_instance: int = 0  # GPUs in each instance's bundle (Ray sets its CUDA_VISIBLE_DEVICES)
    connect_timeout_s: float = 60.0  # ray.init has no timeout of its own
    placement_timeout_s: float = 120.0  # how long the placement group may wait for free resources
    # How a weight version reaches the instances: "shared-fs" (they read the trainer's export
    # directory), "ray" (its files travel as a Ray object to each node's own directory, checked by
    # size and sha256), or "auto": shared-fs when every instance runs on the driver's node, else ray.
    weight_transport: str = "auto"
    weights_dir: str | None = None  # each node's folder for delivered weights; None: under its Ray session dir

    def __post_init__(self) -> None:
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"cluster.placement_strategy must be one of {', '.join(PLACEMENT_STRATEGIES)}, "
                             f"got {self.placement_strategy!r}")
        if self.weight_transport not in WEIGHT_TRANSPORTS:
            raise ValueError(f"cluster.weight_transport must be one of {', '.join(WEIGHT_TRANSPORTS)}, "
                             f"got {self.weight_transport!r}")
        if self.address is not None and ":" not in self.address:
            raise ValueError(f"cluster.address must be host:port, got {self.address!r}")
        if self.node_ip in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"cluster.node_ip cannot be {self.node_ip}: Ray rewrites it to the machine's "
                             "external address; use another loopback address such as 127.0.0.2")
        if self.cpus_per_instance < 0 or self.gpus_per_instance < 0 or self.cpus_per_instance + self.gpus_per_instance == 0:
            raise ValueError("cluster.cpus_per_instance and gpus_per_instance must be >= 0, not both 0")
