"""Regenerate the checked-in Python code from protos/dgds.proto.

    python -m seer.dgds.proto.generate [out_dir]

grpc_tools writes ``import dgds_pb2`` into the service module; it is rewritten to a package import so
the generated code lives inside ``seer.dgds.proto``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

PROTO = Path(__file__).resolve().parents[3] / "protos" / "dgds.proto"
HERE = Path(__file__).resolve().parent
FILES = ("dgds_pb2.py", "dgds_pb2.pyi", "dgds_pb2_grpc.py")


def generate(out_dir: Path, proto: Path = PROTO) -> None:
    from grpc_tools import protoc  # dev dependency: only needed to regenerate

    with tempfile.TemporaryDirectory() as tmp:
        rc = protoc.main([
            "grpc_tools.protoc",
            f"-I{proto.parent}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(proto),
        ])
        if rc != 0:
            raise RuntimeError(f"protoc failed with {rc}")
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            text = (Path(tmp) / name).read_text()
            text = text.replace("import dgds_pb2 as", "from seer.dgds.proto import dgds_pb2 as")
            (out_dir / name).write_text(text)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
