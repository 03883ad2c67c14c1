from __future__ import annotations

from typing import Any

from celery import shared_task

from ops import rollup


@shared_task(ignore_result=True, soft_time_limit=50, time_limit=60)
def rollup_stats() -> dict[str, Any]:
    """Roll the minutes that closed since the last run into the dashboard's counters."""
    report = rollup.rollup_until_current()
    return {"events": report.events, "rows": report.rows,
            "rolled_until": report.rolled_until.isoformat() if report.rolled_until else None}
