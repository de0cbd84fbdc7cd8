"""A delivered weight version's files: checked against the manifest, written whole, the newest kept
(seer.fleet.weight_files; no vLLM, no Ray)."""

from __future__ import annotations

import os
import time

import pytest

from seer.fleet.weight_files import (WeightsMismatch, check_bytes, check_dir, manifest_json, parse_manifest,
                                     write_version)
from seer.types import WeightsRef

pytestmark = pytest.mark.timeout(60)

FILES = {"config.json": b'{"a": 1}\n', "model.safetensors": bytes(range(256)) * 64}


def test_the_manifest_travels_as_json_and_checks_bytes():
    manifest = WeightsRef.manifest_of(FILES)
    assert parse_manifest(manifest_json(manifest)) == manifest and parse_manifest("") == ()
    check_bytes(FILES, manifest)
    bad = {**FILES, "model.safetensors": FILES["model.safetensors"][:-1] + b"\x00"}
    with pytest.raises(WeightsMismatch, match=r"model\.safetensors: expected sha256 [0-9a-f]{16}…, found [0-9a-f]{16}…"):
        check_bytes(bad, manifest)
    with pytest.raises(WeightsMismatch, match=r"config\.json: expected 9 bytes sha256 .*found no such file"):
        check_bytes({"model.safetensors": FILES["model.safetensors"]}, manifest)
    with pytest.raises(WeightsMismatch, match="no manifest"):
        check_bytes(FILES, ())


def test_a_version_is_written_whole_checked_on_disk_and_old_ones_pruned(tmp_path):
    manifest = WeightsRef.manifest_of(FILES)
    dirs = []
    for v in (1, 2, 3):
        dirs.append(write_version(FILES, manifest, tmp_path, v))
        time.sleep(0.01)
    assert [d.name for d in dirs] == ["v1", "v2", "v3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2", "v3"]  # the newest two, no temporary left
    check_dir(dirs[-1], manifest)
    # re-delivering a version replaces it; an older version written last is kept as the newest
    write_version(FILES, manifest, tmp_path, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1", "v3"]
    # a file changed on disk after delivery: the size check, then the hash check, name it
    weights = tmp_path / "v3" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[100] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(WeightsMismatch, match=r"v3 do not match the manifest: model\.safetensors: expected sha256"):
        check_dir(tmp_path / "v3", manifest)
    weights.write_bytes(bytes(data[:-5]))
    with pytest.raises(WeightsMismatch, match=r"model\.safetensors: expected 16384 bytes, found 16379 bytes"):
        check_dir(tmp_path / "v3", manifest)
    os.unlink(weights)
    with pytest.raises(WeightsMismatch, match="found no such file"):
        check_dir(tmp_path / "v3", manifest)


def test_a_payload_that_is_not_its_manifest_writes_nothing(tmp_path):
    manifest = WeightsRef.manifest_of(FILES)
    with pytest.raises(WeightsMismatch):
        write_version({**FILES, "config.json": b"{}"}, manifest, tmp_path, 1)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(WeightsMismatch, match="plain file name"):
        files = {**FILES, "../x": b"1"}
        write_version(files, WeightsRef.manifest_of(files), tmp_path, 1)
    assert list(tmp_path.iterdir()) == []
