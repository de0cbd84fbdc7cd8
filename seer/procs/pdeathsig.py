"""Linux PR_SET_PDEATHSIG: ask the kernel to signal this process when its parent dies."""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """True when set; a no-op (False) off Linux, where the guard's parent polling still works."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
