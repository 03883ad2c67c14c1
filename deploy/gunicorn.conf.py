"""WSGI server settings for the ledger under gunicorn — a supported alternative to the recommended
deploy/web.py (granian), measured beside it by bench/peers.py — and process management (the
whole process group stops and restarts together).

    .venv/bin/gunicorn -c deploy/gunicorn.conf.py config.wsgi

Each knob can be overridden by an environment variable of the same name in upper case with a
GUNICORN_ prefix (GUNICORN_WORKERS=4 …); see README "Production server".

Why these values:
- worker_class gthread, not sync: sync workers close the client connection after every
  request, so every call pays a TCP handshake, and a worker blocked on the provider call
  serves nobody. Threads let one process wait on the provider and on PostgreSQL's commit
  (fsync) for several requests at once, and keep client connections alive.
- workers = CPU cores, threads = 8: the work between waits is Python (one core per process
  under the GIL), the waits are the provider and the database.
- keepalive: agents talk to the ledger in bursts; a kept-alive connection saves a handshake.
- preload_app: the app is imported once in the master and forked (copy-on-write memory,
  a broken configuration fails at start, not in every worker).
- Database connections persist per worker thread (CONN_MAX_AGE, settings) without a health
  ping per request (CONN_HEALTH_CHECKS off); credentials are cached per process for
  LEDGER_CREDENTIAL_CACHE_SECONDS.
- gc.freeze() in the master once the app is loaded (when_ready, before the first fork): the
  objects imported at start live for the process's life; frozen, the cyclic garbage collector
  stops walking them on every full collection in every worker (and stops touching their pages,
  which keeps them shared copy-on-write). Measured: about 15 % less CPU per replay.
- max_requests with jitter recycles workers now and then to bound memory growth, staggered so
  they do not all restart at once.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from typing import Any

# --- Performance tuning ----------------------------------------------------------------------

def _env_int(name: str, default: int) -> int:
    value = os.environ.get(f"GUNICORN_{name.upper()}", "")
    return int(value) if value.strip() else default


bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
worker_class = os.environ.get("GUNICORN_WORKER_CLASS", "gthread")
workers = _env_int("workers", multiprocessing.cpu_count())
threads = _env_int("threads", 8)
keepalive = _env_int("keepalive", 30)
backlog = _env_int("backlog", 2048)
preload_app = os.environ.get("GUNICORN_PRELOAD_APP", "true").lower() not in {"0", "false", "no"}
# Above the longest provider timeout a request may wait on (tools' request_timeout).
timeout = _env_int("timeout", 60)
graceful_timeout = _env_int("graceful_timeout", 30)
max_requests = _env_int("max_requests", 20_000)
max_requests_jitter = _env_int("max_requests_jitter", 2_000)
accesslog = os.environ.get("GUNICORN_ACCESSLOG") or None
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOGLEVEL", "warning")


# --- Process management ----------------------------------------------------------------------
# The whole process group stops and restarts together:
# - systemd runs the master with KillMode=control-group (deploy/systemd/agent-ledger-web.service),
#   so `systemctl stop/restart` signals every worker too, not just the master;
# - each worker asks the kernel for SIGTERM the moment its master dies (PR_SET_PDEATHSIG, see
#   post_fork), so a master killed with SIGKILL leaves no orphaned workers holding the port
#   (gunicorn's own check — workers compare os.getppid() with the master's pid — only runs
#   between requests and after the worker's wait timeout, which left orphans serving for 89 s);
# - the listen socket is not inherited by anything else, so a restart binds at once.
proc_name = "agent-ledger-web"


def when_ready(server: Any) -> None:
    gc.collect()
    gc.freeze()


def post_fork(server: Any, worker: Any) -> None:
    from config.processes import die_with_parent  # the project root is on the path by now

    die_with_parent(server.pid)


def child_exit(server: Any, worker: Any) -> None:
    # prometheus_client multiprocess mode: drop the dead worker's live gauges.
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
