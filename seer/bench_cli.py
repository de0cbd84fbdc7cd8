"""`seer-bench`: the throughput benchmarks of a checkout (`bench/` next to the `seer` package).

    seer-bench compare [flags of python -m bench.compare]   real instances, every configuration
    seer-bench sim [flags of python -m bench.sim]           paper-scale ablation by simulation

The benchmarks are not part of the installed package (they need the repository's measured data
and write results into it), so this entry point runs them from the checkout it was installed from.
"""

from __future__ import annotations

import sys
from pathlib import Path

COMMANDS = {"compare": "bench.compare", "sim": "bench.sim.run"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parents[1]
    if not (root / "bench" / "configs.py").exists():
        print(f"seer-bench needs a source checkout: no bench/ next to {Path(__file__).parent}", file=sys.stderr)
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import importlib

    return int(importlib.import_module(COMMANDS[argv[0]]).main(argv[1:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
