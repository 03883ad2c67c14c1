"""The WSGI application as each granian worker loads it (deploy/web.py names this module
as its target): granian forks its workers, then each one imports its target. Before the first
request a worker

- asks to die with the master (config.processes.die_with_parent, and watch_parent in case
  the kernel's signal comes while granian is still installing its handlers),
- drops the live gauges of workers that died before it (granian has no child_exit hook),
- loads the application (config.wsgi: settings, secret key and catalogue checks), and keeps
  the process's environment variables out of every request's environ (granian starts each
  one as a copy of os.environ: config.processes.without_process_environment),
- and freezes what it imported out of the cyclic garbage collector's reach: those objects live
  as long as the process, and every full collection would walk them again.
"""

from __future__ import annotations

import gc
import os

from config import processes

# deploy/web.py names the master; started some other way (granian's own command), the parent
# at this moment is taken to be the master.
MASTER = int(os.environ.get("LEDGER_WEB_MASTER_PID") or os.getppid())
processes.die_with_parent(MASTER)
processes.watch_parent(MASTER)
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    processes.forget_dead_processes(os.environ["PROMETHEUS_MULTIPROC_DIR"])

from config.wsgi import application as django_application  # noqa: E402  (after the set-up)

application = processes.without_process_environment(django_application, os.environ)

gc.collect()
gc.freeze()

__all__ = ["application"]
