"""Keep a stranger's agent out of Seer's processes through /proc: non-dumpable Seer processes, capless agents.

Linux guards /proc/<pid>/environ, mem, maps, fd/ ... (and ptrace, process_vm_readv) with one check:
a process of the same user may read another's unless that one is *non-dumpable*, and then only
with CAP_SYS_PTRACE. So every Seer process that holds a secret (the driver, whose environment may
hold the user's WANDB_API_KEY for good; vLLM servers and the DGDS server, once
seer.procs.secret_launch has read their secrets; the agent host, which holds every session's key)
makes itself non-dumpable (`protect`), and an agent process drops every capability for good
(`contain_agent`): as root that is what keeps it from reading those processes anyway. For a
non-root user the first alone suffices (an agent has no capability to drop).

An agent still runs as the run's user, so it could read that user's files: Ray's token among them
(with it, code in any Ray worker, the trainer's included). Where it may (root), the agent host gets
its own mount namespace with those paths covered (`hidden_paths`: Seer's own Ray's temporary
directory, or a joined cluster's token file), so an agent finds them empty. What an agent can still
read is in docs/agents.md ("Keys and secrets").
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from pathlib import Path

_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
# SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP, SECBIT_KEEP_CAPS_LOCKED, SECBIT_NO_CAP_AMBIENT_RAISE and
# each one's lock: an exec'd program run by uid 0 gains no capability from being root.
_SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91, "ppc64le": 184, "s390x": 185}
_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 2, 4, 8, 4096, 16384, 1 << 18
HIDE_ENV = "SEER_AGENT_HIDE"  # the paths `hidden_paths` named, from the driver to the agent host


class ContainError(RuntimeError):
    """An agent process still holds a capability after dropping them all: it must not run."""


@dataclass(frozen=True)
class Containment:
    """What `contain_agent` achieved in this process (for its tests and its host's log)."""

    non_dumpable: bool
    no_new_privs: bool
    bounding_set_dropped: bool
    effective_caps: int  # CapEff after the drop: always 0, or ContainError was raised
    hidden: tuple[str, ...] = ()  # the paths covered in its own mount namespace


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def protect() -> bool:
    """Make this process non-dumpable: no process without CAP_SYS_PTRACE reads its /proc/<pid>/environ,
    mem, maps or fds, or ptraces it, even one of its own user. Kept across fork, undone by exec (so
    each exec'd Seer process calls it again). False off Linux."""
    if not sys.platform.startswith("linux"):
        return False
    return _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def _status_caps(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    return 0


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def hidden_paths(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """What an agent must not read although the run's user may: Ray's token (RAY_AUTH_TOKEN_PATH), and
    when it is Seer's own Ray's (seer.fleet.ray_cluster), that Ray's whole temporary directory (its
    sockets too)."""
    environ = os.environ if environ is None else environ
    token = environ.get("RAY_AUTH_TOKEN_PATH")
    if not token:
        return ()
    parent = os.path.dirname(os.path.abspath(token))
    return (parent,) if os.path.basename(parent).startswith("seer-ray-") else (os.path.abspath(token),)


def _hide(libc: ctypes.CDLL, paths: tuple[str, ...]) -> tuple[str, ...]:
    """Cover `paths` in a mount namespace of this process's own (an empty, unreadable tmpfs over a
    directory, /dev/null over a file). Needs CAP_SYS_ADMIN; () without it."""
    paths = tuple(p for p in paths if os.path.lexists(p))
    if not paths or libc.unshare(_CLONE_NEWNS) != 0:
        return ()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:  # nothing propagates back out
        raise ContainError(f"making the agent's mounts private failed: {os.strerror(ctypes.get_errno())}")
    for path in paths:
        target = path.encode()
        if os.path.isdir(path):
            ok = libc.mount(b"tmpfs", target, b"tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                            b"size=4k,mode=000") == 0
        else:
            ok = libc.mount(b"/dev/null", target, None, _MS_BIND, None) == 0
        if not ok:
            raise ContainError(f"hiding {path} from agents failed: {os.strerror(ctypes.get_errno())}")
    return paths


def contain_agent(hide: tuple[str, ...] = ()) -> Containment:
    """In an agent's process (the agent host, before it imports the agent; every session is its fork):
    `hide` covered (where it may: `_hide`), non-dumpable, no new privileges on exec, and no
    capability, effective, permitted, inheritable, ambient or in the bounding set, so neither it nor
    anything it execs can read a Seer process through /proc or ptrace, or uncover what was hidden.
    Raises ContainError if a capability survives (Linux only)."""
    if not sys.platform.startswith("linux"):
        return Containment(False, False, False, 0)
    libc = _libc()
    non_dumpable = libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    hidden = _hide(libc, hide)
    # While it still may (CAP_SETPCAP): lock root out of regaining capabilities on exec.
    libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0)
    dropped = True
    for cap in range(_last_cap() + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
            dropped = False
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    no_new_privs = libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    number = _SYS_CAPSET.get(os.uname().machine)
    if number is not None and (_status_caps("CapEff") or _status_caps("CapPrm") or _status_caps("CapInh")):
        header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
        data = (_CapData * 2)()  # all zero: dropping is always allowed
        if libc.syscall(number, ctypes.byref(header), ctypes.byref(data)) != 0:
            raise ContainError(f"capset failed: {os.strerror(ctypes.get_errno())}")
    left = _status_caps("CapEff") | _status_caps("CapPrm") | _status_caps("CapAmb")
    if left:
        raise ContainError(f"the agent's process still holds capabilities {left:#x} (CapEff|CapPrm|CapAmb); "
                           "it would read Seer's processes through /proc")
    if not no_new_privs:
        raise ContainError(f"PR_SET_NO_NEW_PRIVS failed: {os.strerror(ctypes.get_errno())}")
    # Without PR_CAPBSET_DROP (no CAP_SETPCAP in a container) NO_NEW_PRIVS still keeps an exec from
    # gaining capabilities: the kernel caps an exec's permitted set at the old (empty) one.
    return Containment(non_dumpable, no_new_privs, dropped and _status_caps("CapBnd") == 0, 0, hidden)


def contained_argv(argv: list[str]) -> list[str]:
    """`argv` started contained: this interpreter runs `exec_contained`, which execs the program
    capless (a served command agent, started by the driver rather than forked from the contained
    agent host). The program's environment gets nothing of Seer's (no PYTHONPATH): the path to Seer
    travels as an argument."""
    root = str(Path(__file__).resolve().parents[2])
    code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); "
            "from seer.procs.contain import exec_contained; exec_contained(sys.argv[1:])")
    return [sys.executable, "-c", code, root, *argv]


def exec_contained(argv: list[str]) -> None:
    """Contain this process (hiding what HIDE_ENV names), say what was achieved on stderr (its log),
    and exec `argv`: the locked securebits and NO_NEW_PRIVS keep the program capless."""
    hide = tuple(p for p in os.environ.pop(HIDE_ENV, "").split(os.pathsep) if p)
    print(contain_agent(hide), file=sys.stderr, flush=True)
    os.execvp(argv[0], argv)
