from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("agent_ledger")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

from config.request_id import connect_celery_signals  # noqa: E402

# The request ID of the web request that enqueued a task is bound while the task runs.
connect_celery_signals()
