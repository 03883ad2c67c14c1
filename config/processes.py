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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
# prometheus_client's multiprocess files: <kind>_<pid>.db; the live gauges are the ones that
# must disappear with their process (gauge_livesum_123.db, gauge_liveall_123.db, …).
_LIVE_GAUGE_FILE = re.compile(r"^gauge_live\w*_(\d+)\.db$")


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel for SIGTERM the moment this process's parent (the server's master,
    `parent_pid`) dies, so a master killed with SIGKILL leaves no orphaned workers serving on
    its port. If the parent is already another process, exit now: the signal would never come."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(0)


def watch_parent(parent_pid: int, *, interval: float = 1.0, grace: float = 30.0) -> None:
    """Back up die_with_parent with a daemon thread that checks the parent every `interval`
    seconds: once this process has been orphaned it asks itself to stop (SIGTERM, again every
    few seconds) and, if still running after `grace` seconds, exits. A signal can be lost to a
    server that was still installing its handlers when it came (granian's workers were seen to
    swallow the kernel's SIGTERM that way while starting); the check cannot be."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(min(5.0, max(deadline - time.monotonic(), 0.0)))
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # PermissionError: running, as another user
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def forget_dead_processes(directory: str | Path) -> list[int]:
    """Drop the live gauges of every process that wrote them and is no longer running (what
    gunicorn's child_exit hook does as each worker dies; a server without such a hook calls
    this as each new worker starts, which is also when a dead one is replaced). Returns the
    process IDs forgotten."""
    from prometheus_client import multiprocess

    writers = {int(match[1]) for path in Path(directory).glob("gauge_live*_*.db")
               if (match := _LIVE_GAUGE_FILE.match(path.name))}
    dead = sorted(pid for pid in writers if pid != os.getpid() and not _running(pid))
    for pid in dead:
        multiprocess.mark_process_dead(pid, str(directory))
    return dead


# What a WSGI server itself puts in a request's environ (PEP 3333's CGI variables); headers
# arrive as HTTP_*.
_CGI_KEYS = frozenset({
    "REQUEST_METHOD", "SCRIPT_NAME", "PATH_INFO", "QUERY_STRING", "CONTENT_TYPE",
    "CONTENT_LENGTH", "SERVER_NAME", "SERVER_PORT", "SERVER_PROTOCOL", "SERVER_SOFTWARE",
    "GATEWAY_INTERFACE", "REMOTE_ADDR", "REMOTE_PORT", "REMOTE_HOST", "HTTPS",
})


def without_process_environment(app: Callable[[dict[str, Any], Any], Any],
                                environment: Mapping[str, str]) -> Callable[..., Any]:
    """The WSGI app, given each request's environ without the process's environment variables.

    granian (like wsgiref, CGI's heir) starts every request's environ as a copy of the worker's
    os.environ — DATABASE_URL with its password, DJANGO_SECRET_KEY, provider keys — so Django's
    request.META would carry them into anything that shows or logs a request. Only variables
    the server sets for the request (CGI variables, HTTP_* headers) are kept under those names."""
    dropped = tuple(key for key in environment
                    if key not in _CGI_KEYS and not key.startswith(("HTTP_", "wsgi.")))

    def application(environ: dict[str, Any], start_response: Any) -> Any:
        for key in dropped:
            environ.pop(key, None)
        return app(environ, start_response)

    return application
