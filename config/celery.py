from __future__ import annotations

import os

from celery import Celery, signals
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("agent_ledger")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

from config.request_id import connect_celery_signals  # noqa: E402

# The request ID of the web request that enqueued a task is bound while the task runs.
connect_celery_signals()


@signals.worker_process_shutdown.connect(weak=False)
def _metrics_of_a_finished_pool_process(pid: int | None = None, **kwargs: object) -> None:
    # prometheus_client multiprocess mode: drop the process's live gauges when it exits.
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())


@worker_init.connect
def _refuse_a_broken_catalogue(**kwargs: object) -> None:
    """A worker with a broken tool catalogue refuses to start rather than fail at send time."""
    from ledger.tools import catalogue

    catalogue()
