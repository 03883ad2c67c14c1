"""Is reconciliation running? Every periodic sweep records when it last finished; /readyz
needs each within three sweep intervals, and Prometheus sees the times as
ledger_sweep_last_finished_timestamp_seconds{sweep=…}.

Recorded in the database (one row per sweep), so every web process sees what any worker did,
on the embedded default as much as with Redis.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings
from django.utils import timezone
from prometheus_client import Gauge

from reconciliation.models import SweepRun

# The beat schedule's tasks (settings.CELERY_BEAT_SCHEDULE), by the name readiness reports.
SWEEP_TASKS = {
    "reconciliation.tasks.sweep_leases": "leases",
    "reconciliation.tasks.sweep_cases": "cases",
    "ledger.tasks.retry_unsent_operations": "unsent",
}
SWEEPS = tuple(SWEEP_TASKS.values())
STALE_AFTER_INTERVALS = 3

SWEEP_LAST_FINISHED = Gauge(
    "ledger_sweep_last_finished_timestamp_seconds",
    "When each periodic sweep last finished (Unix time)", ["sweep"],
    multiprocess_mode="livemostrecent",
)


def record_sweep_finished(sweep: str, *, at: dt.datetime | None = None) -> None:
    SweepRun.objects.update_or_create(sweep=sweep,
                                      defaults={"finished_at": at or timezone.now()})


def last_sweep_finished_at(sweep: str | None = None) -> dict[str, dt.datetime | None]:
    """{sweep: when it last finished, or None if never}; one sweep's entry when named."""
    names = (sweep,) if sweep else SWEEPS
    found = dict(SweepRun.objects.filter(sweep__in=names).values_list("sweep", "finished_at"))
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


def refresh_sweep_gauge() -> None:
    for name, finished in last_sweep_finished_at().items():
        if finished is not None:
            SWEEP_LAST_FINISHED.labels(name).set(finished.timestamp())


def on_task_success(sender: Any = None, **kwargs: Any) -> None:
    sweep = SWEEP_TASKS.get(getattr(sender, "name", ""))
    if sweep:
        record_sweep_finished(sweep)


def connect_signals() -> None:
    from celery import signals

    signals.task_success.connect(on_task_success, weak=False)
