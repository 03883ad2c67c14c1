"""Is reconciliation running? /readyz needs every periodic sweep to have finished within
three sweep intervals.

The times are the dashboard's (issue 12): ops.heartbeats records each sweep's finish in the
database (ops.models.SweepHeartbeat, from a Celery task_postrun receiver), and config.gauges
exports them as ledger_sweep_last_finished_timestamp_seconds{sweep=…}. In the database, so
every web process sees what any worker did, on the embedded default as much as with Redis.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.utils import timezone

# The beat schedule's sweeps readiness waits for (the dashboard's rollup is not one of them).
SWEEP_TASKS = {
    "reconciliation.tasks.sweep_leases": "leases",
    "reconciliation.tasks.sweep_cases": "cases",
    "ledger.tasks.retry_unsent_operations": "unsent",
}
SWEEPS = tuple(SWEEP_TASKS.values())
STALE_AFTER_INTERVALS = 3


def record_sweep_finished(sweep: str, *, at: dt.datetime | None = None) -> None:
    from ops.models import SweepHeartbeat

    SweepHeartbeat.objects.update_or_create(
        sweep=sweep, defaults={"last_finished_at": at or timezone.now()})


def last_sweep_finished_at(sweep: str | None = None) -> dict[str, dt.datetime | None]:
    """{sweep: when it last finished, or None if never}; one sweep's entry when named."""
    from ops.models import SweepHeartbeat

    names = (sweep,) if sweep else SWEEPS
    found = dict(SweepHeartbeat.objects.filter(sweep__in=names)
                 .values_list("sweep", "last_finished_at"))
    return {name: found.get(name) for name in names}


def sweeps_health(now: dt.datetime | None = None) -> dict[str, dict[str, Any]]:
    now = now or timezone.now()
    limit = dt.timedelta(seconds=settings.LEDGER_SWEEP_INTERVAL_SECONDS * STALE_AFTER_INTERVALS)
    return {
        name: {
            "last_finished_at": finished.isoformat() if finished else None,
            "ok": finished is not None and now - finished <= limit,
        }
        for name, finished in last_sweep_finished_at().items()
    }
