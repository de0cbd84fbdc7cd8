"""Who owns what around a weight push, without instances: the push chooses the transport and asks
the trainer for that form, and the fleet closes only a Ray connection it opened itself."""

from __future__ import annotations

from pathlib import Path

from seer.fleet import Fleet
from seer.fleet.pool import InstancePool
from seer.types import WeightsRef


class _Trainer:
    def __init__(self):
        self.calls: list = []

    def export_hf(self, out_dir):
        self.calls.append(("export_hf", Path(out_dir)))
        return Path(out_dir)

    def publish(self, version):
        self.calls.append(("publish", version))
        return WeightsRef(version, "ray://x", payload=object(), manifest={"a": {"size": 1, "sha256": "0"}})


class _Cluster:
    closed = False

    def close(self):
        self.closed = True


def _pool() -> InstancePool:
    return InstancePool.connect(["http://127.0.0.1:9", "http://127.0.0.1:10"])


def test_attached_instances_get_a_directory_export_through_the_fleets_one_push(tmp_path):
    fleet = Fleet(_pool())
    trainer = _Trainer()
    assert fleet.weights.transport == "shared-fs"
    ref = fleet.weights.export(trainer, 3, tmp_path / "v3")
    assert ref == WeightsRef(3, str(tmp_path / "v3")) and trainer.calls == [("export_hf", tmp_path / "v3")]


def test_the_fleet_closes_only_a_ray_connection_it_opened():
    borrowed, own = _Cluster(), _Cluster()
    Fleet(_pool(), cluster=borrowed, owns_cluster=False).close()  # the job's: the job closes it, after the trainer
    Fleet(_pool(), cluster=own, owns_cluster=True).close()
    assert not borrowed.closed and own.closed
