from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("agent_ledger")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _refuse_a_broken_catalogue(**kwargs: object) -> None:
    """A worker with a broken tool catalogue refuses to start rather than fail at send time."""
    from ledger.tools import catalogue

    catalogue()
