"""Builds the optional compiled core of the DGDS suffix tree; everything else is in pyproject.toml.

``optional=True``: without a C compiler the install goes on and ``seer.dgds.suffix_tree`` appends
in pure Python (same trees, slower).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("seer.dgds._suffix_core", ["seer/dgds/_suffix_core.c"], optional=True)])
