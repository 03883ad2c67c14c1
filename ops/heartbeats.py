"""When each periodic sweep last finished: recorded in one place, a Celery task_postrun
receiver, for every task in ops.figures.SWEEPS that ended without an exception. The lease and
case sweepers, the unsent sweeper and the stats rollup need not know about it."""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError
from django.utils import timezone

from ops.figures import SWEEPS
from ops.models import SweepHeartbeat

logger = logging.getLogger(__name__)


def sweep_finished(name: str) -> None:
    SweepHeartbeat.objects.update_or_create(sweep=name,
                                            defaults={"last_finished_at": timezone.now()})


def record_sweep_finished(sender: Any = None, task: Any = None, state: str | None = None,
                          **kwargs: Any) -> None:
    name = SWEEPS.get(getattr(task, "name", "") or "")
    if name is None or state != "SUCCESS":
        return
    try:
        sweep_finished(name)
    except DatabaseError:
        logger.warning("could not record that the %s sweep finished", name)
