"""Production web server for the ledger (granian, a Rust HTTP server running the Django WSGI
app): the recommended configuration, the one bench/peers.py measures, and the one the systemd
unit starts.

    .venv/bin/python deploy/web.py

Each knob can be overridden by an environment variable (GRANIAN_WORKERS=4 …); see README
"Production server". deploy/gunicorn.conf.py remains a supported alternative.

Why granian, and these values:
- HTTP parsing, keep-alive and socket I/O run in Rust, outside the GIL; a request reaches Python
  once, in one of the worker's blocking threads. Measured side by side against gunicorn's
  gthread workers (bench/peers.py, same machine, same rounds, five runs), an HTTP replay costs
  13–30 % less CPU across all processes and granian serves 1.1–1.6× the replays per
  second: gthread's main thread hands every request to a pool thread and back, and those
  thread switches were a fifth of its worker's CPU (perf).
- workers = CPU cores, blocking threads = 4: the work between waits is Python (one core per
  process under the GIL); the waits are the provider and PostgreSQL's commit, and 4 threads per
  process let a worker wait on several at once. More threads than that contend for the GIL:
  measured interleaved on 2 cores (16 clients, an instant provider), 4 threads instead of 8
  served 10–20 % more replays at about a tenth less CPU each, with a lower fresh-action p99;
  2 was no better than 4. Raise it when providers are slow or agents long-poll: each waiting
  call holds a thread. Each thread keeps its own database connection (CONN_MAX_AGE, no health
  ping per request).
- HTTP/1.1 only, no websockets: agents call a JSON API.
- blocking threads stay alive for GRANIAN_BLOCKING_THREADS_IDLE_TIMEOUT (300 s) once started,
  so their database connections stay warm between bursts.
- respawn failed workers; workers_lifetime (default off) recycles workers after that many
  seconds if memory growth ever needs bounding.
- each worker dies with the master (PR_SET_PDEATHSIG) and drops dead workers' live gauges
  (config/granian_worker.py); systemd stops the whole process group
  (deploy/systemd/agent-ledger-web.service).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = "config.granian_worker:application"
MASTER_PID_VARIABLE = "LEDGER_WEB_MASTER_PID"


def _env_int(name: str, default: int | None) -> int | None:
    value = os.environ.get(f"GRANIAN_{name.upper()}", "")
    return int(value) if value.strip() else default


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(f"GRANIAN_{name.upper()}", "").strip().lower()
    return default if not value else value not in {"0", "false", "no", "off"}


def settings() -> dict[str, object]:
    """granian.server.Server's keyword arguments, from the environment."""
    from granian.constants import HTTPModes, Interfaces
    from granian.log import LogLevels

    return {
        "target": TARGET,
        "address": os.environ.get("GRANIAN_HOST", "127.0.0.1"),
        "port": _env_int("port", 8000),
        "interface": Interfaces.WSGI,
        "workers": _env_int("workers", multiprocessing.cpu_count()),
        "blocking_threads": _env_int("blocking_threads", 4),
        "blocking_threads_idle_timeout": _env_int("blocking_threads_idle_timeout", 300),
        "runtime_threads": _env_int("runtime_threads", 1),
        "http": HTTPModes.http1,
        "websockets": False,
        "backlog": _env_int("backlog", 2048),
        "respawn_failed_workers": True,
        "workers_lifetime": _env_int("workers_lifetime", None),
        "workers_kill_timeout": _env_int("workers_kill_timeout", 30),
        "log_level": LogLevels(os.environ.get("GRANIAN_LOG_LEVEL", "warning")),
        "log_access": _env_bool("log_access", False),
        "working_dir": ROOT,
    }


def main() -> None:
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # Read by each forked worker (config/granian_worker.py): a worker that finds another parent
    # when it starts — the master died while it was starting — exits at once.
    os.environ[MASTER_PID_VARIABLE] = str(os.getpid())
    from granian.server import Server

    Server(**settings()).serve()  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
