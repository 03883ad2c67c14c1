"""Process management shared by the production web servers (deploy/web.py, the recommended
one, and deploy/gunicorn.conf.py): a worker never outlives its master, and a dead worker's live
gauges stop being reported. Imported by the servers' worker set-up only, never by the app."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1
# prometheus_client's multiprocess files: <kind>_<pid>.db; the live gauges are the ones that
# must disappear with their process (gauge_livesum_123.db, gauge_liveall_123.db, …).
_LIVE_GAUGE_FILE = re.compile(r"^gauge_live\w*_(\d+)\.db$")


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask the kernel for SIGTERM the moment this process's parent (the server's master) dies,
    so a master killed with SIGKILL leaves no orphaned workers serving on its port. If the
    parent is already gone (or is not `parent_pid`), exit now: the signal would never come."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    parent = os.getppid()
    if parent == 1 or (parent_pid is not None and parent != parent_pid):
        os._exit(0)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def forget_dead_processes(directory: str | Path) -> list[int]:
    """Drop the live gauges of every process that wrote them and is no longer running (what
    gunicorn's child_exit hook does as each worker dies; a server without such a hook calls
    this as each new worker starts, which is also when a dead one is replaced). Returns the
    process IDs forgotten."""
    from prometheus_client import multiprocess

    dead = set()
    for path in Path(directory).glob("gauge_live*_*.db"):
        match = _LIVE_GAUGE_FILE.match(path.name)
        if match and int(match[1]) != os.getpid() and not _running(int(match[1])):
            dead.add(int(match[1]))
    for pid in sorted(dead):
        multiprocess.mark_process_dead(pid, str(directory))
    return sorted(dead)
