"""gunicorn configuration for production: `gunicorn -c deploy/gunicorn.conf.py config.wsgi`.

Sections are kept apart so each can change on its own: process management (issue 11) and
performance tuning (issue 10). Every value can be overridden with GUNICORN_* variables.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from typing import Any

# --- Process management ----------------------------------------------------------------------
# The whole process group stops and restarts together:
# - systemd runs the master with KillMode=control-group (deploy/systemd/agent-ledger-web.service),
#   so `systemctl stop/restart` signals every worker too, not just the master;
# - each worker asks the kernel for SIGTERM the moment its master dies (PR_SET_PDEATHSIG, see
#   post_fork), so a master killed with SIGKILL leaves no orphaned workers holding the port
#   (gunicorn's own check — workers compare os.getppid() with the master's pid — only runs
#   between requests and after the worker's wait timeout, which left orphans serving for 89 s);
# - the listen socket is not inherited by anything else, so a restart binds at once.
bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("GUNICORN_WORKERS", "4"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "30"))
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "60"))
# The request ID and the log format are the application's (config.logging); gunicorn's own
# access log stays off, its error log goes to stderr (the journal).
accesslog = None
errorlog = "-"
proc_name = "agent-ledger-web"

PR_SET_PDEATHSIG = 1


def _die_with_the_master(master_pid: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != master_pid:  # the master died before the request was registered
        os._exit(0)


def post_fork(server: Any, worker: Any) -> None:
    _die_with_the_master(server.pid)


def child_exit(server: Any, worker: Any) -> None:
    # prometheus_client multiprocess mode: drop the dead worker's live gauges.
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


# --- Performance tuning ----------------------------------------------------------------------
# (issue 10 owns this section: worker class, threads, keep-alive, backlog.)
