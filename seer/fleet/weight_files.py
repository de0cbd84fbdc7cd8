"""A weight version's files on an instance's node: written from a payload, checked against its manifest.

When the instances do not share a filesystem with the trainer, a weight version travels as its
checkpoint's files ({name: bytes}, a Ray object) with a manifest ((name, size, sha256) per file,
seer.types.WeightsRef.manifest_of). The node's host actor checks the bytes it received and writes
them into a node-local directory (`write_version`); every vLLM worker checks the files on disk
again before it applies anything (`check_dir`, from seer.fleet.weight_ext). A mismatch names the
file, what the manifest expects and what was found.

Light on purpose (hashlib, json, pathlib): the worker extension imports it in every vLLM worker.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

Manifest = tuple[tuple[str, int, str], ...]
KEEP_VERSIONS = 2  # versions kept per node and fleet: the one being loaded and the one before it
_CHUNK = 8 << 20


class WeightsMismatch(ValueError):
    """A weight file is missing, or its size or sha256 is not the manifest's."""


def manifest_json(manifest: Manifest) -> str:
    return json.dumps([list(m) for m in manifest])


def parse_manifest(text: str) -> Manifest:
    return tuple((str(n), int(s), str(h)) for n, s, h in json.loads(text)) if text else ()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _mismatches(manifest: Manifest, size_of, sha_of) -> list[str]:
    bad = []
    for name, size, sha in manifest:
        found = size_of(name)
        if found is None:
            bad.append(f"{name}: expected {size} bytes sha256 {sha[:16]}…, found no such file")
        elif found != size:
            bad.append(f"{name}: expected {size} bytes, found {found} bytes")
        elif (digest := sha_of(name)) != sha:
            bad.append(f"{name}: expected sha256 {sha[:16]}…, found {digest[:16]}… ({size} bytes)")
    return bad


def _raise(bad: list[str], where: str) -> None:
    if bad:
        raise WeightsMismatch(f"weight files in {where} do not match the manifest: " + "; ".join(bad))


def check_bytes(files: dict[str, bytes], manifest: Manifest, where: str = "the payload") -> None:
    """The received bytes are the manifest's files, each of its size and sha256."""
    if not manifest:
        raise WeightsMismatch(f"{where}: no manifest to check the weight files against")
    _raise(_mismatches(manifest, lambda n: len(files[n]) if n in files else None,
                       lambda n: hashlib.sha256(files[n]).hexdigest()), where)


def check_dir(path: str | Path, manifest: Manifest) -> None:
    """Every file of the manifest is in `path`, of its size and sha256 (read from disk)."""
    path = Path(path)

    def size_of(name: str) -> int | None:
        try:
            return (path / name).stat().st_size
        except FileNotFoundError:
            return None

    _raise(_mismatches(manifest, size_of, lambda n: sha256_file(path / n)), str(path))


def version_dir(base: str | Path, version: int) -> Path:
    return Path(base) / f"v{version}"


def write_version(files: dict[str, bytes], manifest: Manifest, base: str | Path, version: int,
                  keep: int = KEEP_VERSIONS) -> Path:
    """Check `files` against `manifest`, write them as `base/v<version>` (whole or not at all: a
    temporary directory renamed into place, replacing an earlier delivery of that version), and
    remove all but the `keep` newest versions under `base`. Returns the directory."""
    check_bytes(files, manifest)
    base = Path(base)
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / f".v{version}.tmp-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        for name, data in files.items():
            if "/" in name or name.startswith("."):
                raise WeightsMismatch(f"refusing a weight file name {name!r}: a plain file name only")
            with open(tmp / name, "wb") as f:
                f.write(data)
        for name, size, _ in manifest:
            if (found := (tmp / name).stat().st_size) != size:
                raise WeightsMismatch(f"{name}: wrote {found} bytes, the manifest says {size}")
        out = version_dir(base, version)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
        os.utime(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(base, keep)
    return out


def prune(base: str | Path, keep: int = KEEP_VERSIONS) -> list[Path]:
    """Remove all but the `keep` most recently written version directories under `base`."""
    versions = sorted((p for p in Path(base).glob("v*") if p.is_dir() and p.name[1:].isdigit()),
                      key=lambda p: p.stat().st_mtime_ns, reverse=True)
    old = versions[keep:]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return old


__all__ = ["KEEP_VERSIONS", "Manifest", "WeightsMismatch", "check_bytes", "check_dir", "manifest_json",
           "parse_manifest", "prune", "sha256_file", "version_dir", "write_version"]
