"""The trainer's ranks as a Ray worker group: one actor per rank, each in its own placement bundle.

The driver holds a `TrainerGroup` with the Trainer's interface (`train_step`, `iteration`, exports,
checkpoints); every call runs on all ranks at once, since each is a collective, and the answer is
rank 0's. World size 1 is the same group with one actor. Ray must be connected first (the job does
it, seer.fleet.ray_cluster). Nothing here needs a filesystem shared with the driver except the base
model, which every trainer node reads like every instance node: checkpoints travel as bytes and
weight versions as Ray objects (or as a directory written by rank 0 when it runs on the driver's node).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from seer.procs import free_port, remote_error_line
from seer.trainer.config import RankPlace, TrainerConfig
from seer.trainer.errors import TrainerGroupError
from seer.types import RolloutBatch, WeightsRef


@dataclass(frozen=True)
class RankInfo:
    rank: int
    node_id: str
    ip: str
    cores: tuple[int, ...]
    gpus: tuple[str, ...]
    threads: int = 0  # torch threads, set in `setup`


class TrainerRank:
    """One rank: a Trainer in a Ray worker process of its node."""

    def __init__(self) -> None:
        self.trainer = None

    def info(self, rank: int) -> RankInfo:
        ctx = ray.get_runtime_context()
        return RankInfo(rank, ctx.get_node_id(), ray.util.get_node_ip_address(),
                        tuple(sorted(os.sched_getaffinity(0))), tuple(str(g) for g in ray.get_gpu_ids()))

    def rendezvous(self) -> str:
        """Rank 0's store address: this node's address, a free port on it."""
        ip = ray.util.get_node_ip_address()
        return f"tcp://{ip}:{free_port(ip)}"

    def setup(self, hf_path: str, config: TrainerConfig, place: RankPlace, threads: int) -> int:
        import torch

        torch.set_num_threads(max(1, threads))
        from seer.trainer.trainer import Trainer

        self.trainer = Trainer(hf_path, config, place)
        return self.trainer.iteration

    def train_step(self, batch: RolloutBatch):
        return self.trainer.train_step(batch)

    def export_dir(self, out_dir: str) -> str | None:
        """Rank 0 writes the HF directory (the others only take part in gathering the weights)."""
        if self.trainer.is_writer:
            return str(self.trainer.export_hf(out_dir))
        self.trainer.join_export()
        return None

    def publish(self) -> tuple[list, tuple] | None:
        """Rank 0 puts the HF checkpoint's files in Ray's object store, owned here: instance nodes
        fetch them from this node. Returns ([the ObjectRef], its manifest)."""
        if not self.trainer.is_writer:
            self.trainer.join_export()
            return None
        files = self.trainer.export_files()
        return [ray.put(files)], WeightsRef.manifest_of(files)

    def checkpoint_bytes(self) -> bytes | None:
        return self.trainer.checkpoint_bytes()

    def load_checkpoint_bytes(self, data: bytes) -> int:
        return self.trainer.load_checkpoint_bytes(data)

    def apply(self, fn):
        """`fn(trainer)` on this rank (tests and diagnostics: gradients, parameters)."""
        return fn(self.trainer)


_Rank = ray.remote(TrainerRank)


class TrainerGroup:
    """`config.world_size` ranks placed with `config.placement_strategy`; see the module docstring."""

    def __init__(self, actors: list, infos: list[RankInfo], pg, config: TrainerConfig, startup_s: float):
        self.actors = actors
        self.infos = infos
        self.pg = pg
        self.config = config
        self.startup_s = startup_s
        self.iteration = 0

    @classmethod
    def start(cls, hf_path: str | Path, config: TrainerConfig, timeout_s: float = 600.0) -> TrainerGroup:
        """Place the ranks, rendezvous at rank 0's node address, build the model on every rank."""
        t0 = time.monotonic()
        n = config.world_size
        bundle = {k: v for k, v in (("CPU", config.cpus_per_rank), ("GPU", config.gpus_per_rank)) if v}
        pg = _place([dict(bundle) for _ in range(n)], config.placement_strategy, min(timeout_s, 120.0))
        actors = [_Rank.options(num_cpus=config.cpus_per_rank, num_gpus=config.gpus_per_rank, max_restarts=0,
                                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)
                                ).remote() for i in range(n)]
        group = cls(actors, [], pg, config, 0.0)
        try:
            infos = group._all(lambda a, i: a.info.remote(i), timeout_s=120.0)
            threads = _threads(infos, config.threads_per_rank)
            group.infos = [RankInfo(**{**asdict(r), "threads": t}) for r, t in zip(infos, threads)]
            init = group._call(actors[0].rendezvous.remote(), 60.0) if n > 1 else None
            places = [RankPlace(i, n, init, config.tensor_parallel, config.pipeline_parallel, config.expert_parallel)
                      for i in range(n)]
            group._all(lambda a, i: a.setup.remote(str(hf_path), config, places[i], threads[i]), timeout_s)
        except BaseException:
            group.close()
            raise
        group.startup_s = time.monotonic() - t0
        return group

    # ---- calls on every rank ---------------------------------------------------------------
    def _call(self, ref, timeout_s: float | None):
        try:
            return ray.get(ref, timeout=timeout_s)
        except Exception as e:
            raise TrainerGroupError(f"a trainer rank failed: {remote_error_line(e)}") from e

    def _all(self, method, timeout_s: float | None = None) -> list:
        """`method(actor, rank)` on every rank; the first rank to fail fails the call at once (its
        peers would otherwise wait in a collective until gloo's timeout)."""
        refs = [method(a, i) for i, a in enumerate(self.actors)]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pending = list(refs)
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                raise TrainerGroupError(f"trainer ranks did not answer within {timeout_s:.0f} s")
            try:
                ray.get(ready[0])
            except Exception as e:
                rank = refs.index(ready[0])
                where = _where(self.infos[rank] if rank < len(self.infos) else rank)
                raise TrainerGroupError(f"trainer {where} failed: {remote_error_line(e)}") from e
        return ray.get(refs)

    # ---- the Trainer's interface -----------------------------------------------------------
    def train_step(self, batch: RolloutBatch):
        """One GRPO step on every rank; rank 0's (global) metrics, with each rank's time in
        `extra["ranks"]` (rank, node, train_s)."""
        every = self._all(lambda a, i: a.train_step.remote(batch))
        metrics = every[0]
        metrics.extra["ranks"] = [{"rank": r.rank, "node": r.ip, "train_s": round(m.time_s, 4)}
                                  for r, m in zip(self.infos, every)]
        self.iteration = metrics.iteration
        return metrics

    def export_hf(self, out_dir: str | Path) -> Path:
        """A HF directory at `out_dir` on the driver's node: written by rank 0 where it runs there,
        else fetched from rank 0 and written here. `publish` is the way to instances on other nodes."""
        if self.infos[0].ip == ray.util.get_node_ip_address():
            return Path(self._all(lambda a, i: a.export_dir.remote(str(out_dir)))[0])
        from seer.trainer.export import write_checkpoint_files

        ref = self.publish(0).payload
        return write_checkpoint_files(ray.get(ref), out_dir)

    def publish(self, version: int) -> WeightsRef:
        refs, manifest = self._all(lambda a, i: a.publish.remote())[0]
        return WeightsRef(version, f"ray://{refs[0].hex()}", payload=refs[0], manifest=manifest)

    def save_checkpoint(self, ckpt_dir: str | Path) -> Path:
        from seer.trainer.export import atomic_write_bytes
        from seer.trainer.trainer import CHECKPOINT_FILE

        data = self._all(lambda a, i: a.checkpoint_bytes.remote())[0]
        ckpt_dir = Path(ckpt_dir)
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        return atomic_write_bytes(ckpt_dir / CHECKPOINT_FILE, data, durable=True)

    def load_checkpoint(self, ckpt_dir: str | Path) -> int:
        from seer.trainer.trainer import CHECKPOINT_FILE

        data = ray.put((Path(ckpt_dir) / CHECKPOINT_FILE).read_bytes())
        self.iteration = self._all(lambda a, i: a.load_checkpoint_bytes.remote(data))[0]
        return self.iteration

    def apply(self, fn) -> list:
        """`fn(trainer)` on every rank at once (it may run collectives); each rank's result."""
        return self._all(lambda a, i: a.apply.remote(fn))

    def describe(self) -> str:
        c = self.config
        where = ", ".join(f"rank {r.rank} on {r.ip} ({r.threads} threads)" for r in self.infos)
        return (f"trainer: {c.world_size} rank(s) (data_parallel {c.data_parallel} x tensor_parallel "
                f"{c.tensor_parallel}{f' x expert_parallel {c.expert_parallel}' if c.expert_parallel > 1 else ''}, "
                f"{c.placement_strategy}): {where}")

    def close(self) -> None:
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        self.actors = []
        try:
            remove_placement_group(self.pg)
        except Exception:
            pass


def _place(bundles: list[dict], strategy: str, timeout_s: float):
    """The ranks' placement group. PACK first tries the driver's node (STRICT_PACK with it as the
    target: the ranks then share the driver's machine and fate), then anywhere that packs them."""
    tries = [(strategy, None, timeout_s)]
    if strategy == "PACK":
        tries.insert(0, ("STRICT_PACK", ray.get_runtime_context().get_node_id(), 5.0))
    for how, target, wait_s in tries:
        pg = placement_group(bundles, strategy=how, _soft_target_node_id=target)
        try:
            ray.get(pg.ready(), timeout=wait_s)
            return pg
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)
    raise TrainerGroupError(f"Ray could not place {len(bundles)} trainer ranks of {bundles[0]} ({strategy}) within "
                            f"{timeout_s:.0f} s; free: {ray.available_resources()}")


def _threads(infos: list[RankInfo], fixed: int | None) -> list[int]:
    """torch threads per rank: fixed, or the node's cores split among that node's ranks."""
    if fixed:
        return [fixed] * len(infos)
    per_node: dict[str, int] = {}
    for r in infos:
        per_node[r.node_id] = per_node.get(r.node_id, 0) + 1
    return [max(1, len(r.cores) // per_node[r.node_id]) for r in infos]


def _where(r) -> str:
    return f"rank {r.rank} on {r.ip}" if isinstance(r, RankInfo) else f"rank {r}"


__all__ = ["RankInfo", "TrainerGroup", "TrainerGroupError", "TrainerRank"]
