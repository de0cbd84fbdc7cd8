"""The checked-in generated code must be what protos/dgds.proto generates today.

The generators' own versions (grpcio-tools' `GRPC_GENERATED_VERSION`, protoc's `Protobuf Python
Version` and its runtime check) are not the proto's: PyPI serves newer grpcio-tools than the one
that generated the checked-in files, so they are compared with those stamps left out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from seer.dgds.proto import generate

_STAMPS = (
    (re.compile(r"^GRPC_GENERATED_VERSION = '[^']*'$", re.M), "GRPC_GENERATED_VERSION = <v>"),
    (re.compile(r"^# Protobuf Python Version: .*$", re.M), "# Protobuf Python Version: <v>"),
    (re.compile(r"(ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,)\s*\d+,\s*\d+,\s*\d+,\s*'[^']*',"),
     r"\1 <v>,"),
)


def without_generator_versions(text: str) -> str:
    for pattern, repl in _STAMPS:
        text = pattern.sub(repl, text)
    return text


def test_generated_code_matches_the_proto(tmp_path: Path):
    pytest.importorskip("grpc_tools")
    generate.generate(tmp_path)
    for name in generate.FILES:
        fresh = without_generator_versions((tmp_path / name).read_text())
        checked_in = without_generator_versions((generate.HERE / name).read_text())
        assert fresh == checked_in, f"{name} drifted from protos/dgds.proto: run python -m seer.dgds.proto.generate"


def test_a_changed_proto_is_still_drift_once_versions_are_left_out():
    """The stamps removed are exactly the version lines: a change to a message still shows."""
    text = (generate.HERE / generate.FILES[0]).read_text()
    assert without_generator_versions(text) != without_generator_versions(text.replace("dgds.proto", "dgds2.proto", 1))
    assert "<v>" in without_generator_versions((generate.HERE / "dgds_pb2_grpc.py").read_text())
