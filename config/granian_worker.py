"""The WSGI application as each granian worker loads it (deploy/web.py names this module
as its target): granian forks its workers, then each one imports its target. Before the first
request a worker

- asks to die with the master (config.processes.die_with_parent),
- drops the live gauges of workers that died before it (granian has no child_exit hook),
- loads the application (config.wsgi: settings, secret key and catalogue checks),
- and freezes what it imported out of the cyclic garbage collector's reach: those objects live
  as long as the process, and every full collection would walk them again.
"""

from __future__ import annotations

import gc
import os

from config import processes

processes.die_with_parent()
if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    processes.forget_dead_processes(os.environ["PROMETHEUS_MULTIPROC_DIR"])

from config.wsgi import application  # noqa: E402  (after the worker's own set-up)

gc.collect()
gc.freeze()

__all__ = ["application"]
