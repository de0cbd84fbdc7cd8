"""The checked-in generated code must be what protos/dgds.proto generates today."""

from __future__ import annotations

from pathlib import Path

import pytest

from seer.dgds.proto import generate


def test_generated_code_matches_the_proto(tmp_path: Path):
    pytest.importorskip("grpc_tools")
    generate.generate(tmp_path)
    for name in generate.FILES:
        fresh = (tmp_path / name).read_text()
        checked_in = (generate.HERE / name).read_text()
        assert fresh == checked_in, f"{name} drifted from protos/dgds.proto: run python -m seer.dgds.proto.generate"
