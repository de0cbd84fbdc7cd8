"""Builds the compiled core of the DGDS suffix tree; everything else is in pyproject.toml.

The core is required: a build that cannot compile it fails (``seer.dgds.tree.suffix_tree`` refuses
to import without it unless ``SEER_DGDS_PURE_PYTHON=1``). The SHA-256 of the C source is compiled
into the module, so the tree can tell a stale build (an .so from an older ``_suffix_core.c``) and
ask for a rebuild instead of running old code.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "seer/dgds/tree/_suffix_core.c"
digest = hashlib.sha256((Path(__file__).resolve().parent / SOURCE).read_bytes()).hexdigest()

setup(ext_modules=[Extension("seer.dgds.tree._suffix_core", [SOURCE],
                             define_macros=[("SEER_CORE_SOURCE_SHA256", f'"{digest}"')])])
