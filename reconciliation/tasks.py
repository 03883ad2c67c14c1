"""Thin Celery tasks: each takes IDs (or nothing), calls one service, and owns its limits.

The two sweeps run from Celery's own beat schedule (settings.CELERY_BEAT_SCHEDULE). Running
them on several workers at once is safe (see reconciliation.services), so a beat that fires
twice, or a second beat by mistake, costs only a few empty queries.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError

from reconciliation import services

_SWEEP_LIMITS: dict[str, Any] = {
    "soft_time_limit": settings.RECONCILIATION_SWEEP_SOFT_TIME_LIMIT,
    "time_limit": settings.RECONCILIATION_SWEEP_TIME_LIMIT,
}


@shared_task(ignore_result=True, **_SWEEP_LIMITS)
def sweep_leases() -> int:
    """in_flight past its lease → unknown, with a case opened in the same commit."""
    return services.sweep_expired_leases()


@shared_task(ignore_result=True, **_SWEEP_LIMITS)
def sweep_cases() -> dict[str, Any]:
    """Lease due cases (SKIP LOCKED) and reconcile each, within the sweep's time budget."""
    return services.sweep_due_cases().as_dict()


@shared_task(
    ignore_result=True,
    acks_late=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=True,
    retry_jitter=True,
    max_retries=settings.RECONCILIATION_TASK_MAX_RETRIES,
    **_SWEEP_LIMITS,
)
def reconcile_case(case_id: int) -> str:
    """Check one due case now (an operator's "reconcile now"); skipped unless it is due and
    no sweeper holds it."""
    return services.reconcile_case_now(case_id=case_id)
