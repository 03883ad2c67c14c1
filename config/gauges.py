"""Gauges computed from the database at scrape time (correct with any number of processes)."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone
from prometheus_client import Gauge

from ledger.models import Operation
from ledger.tools import UnknownTool, get_tool

IN_FLIGHT_PAST_LEASE = Gauge("ledger_in_flight_past_lease", "in_flight rows past their lease")
UNKNOWN_PAST_SLA = Gauge("ledger_unknown_past_sla", "unknown rows older than the SLA")
AWAITING_REVIEW = Gauge("ledger_cases_awaiting_review", "cases awaiting a person")
KEYS_NEAR_RETENTION = Gauge(
    "ledger_keys_near_retention", "unresolved operations whose key expires within 2 hours"
)
UNKNOWN_SLA = dt.timedelta(minutes=15)


def refresh_gauges() -> None:
    from reconciliation.models import Case

    now = timezone.now()
    S = Operation.Status
    IN_FLIGHT_PAST_LEASE.set(
        Operation.objects.filter(status=S.IN_FLIGHT, lease_expires_at__lt=now).count()
    )
    UNKNOWN_PAST_SLA.set(
        Operation.objects.filter(status=S.UNKNOWN, updated_at__lt=now - UNKNOWN_SLA).count()
    )
    AWAITING_REVIEW.set(Case.objects.filter(state=Case.State.AWAITING_REVIEW).count())
    near = 0
    unresolved = Operation.objects.filter(status=S.UNKNOWN, key_first_sent_at__isnull=False)
    for tool, version, first_sent in unresolved.values_list("tool", "tool_version",
                                                             "key_first_sent_at"):
        assert first_sent is not None  # filtered on key_first_sent_at__isnull=False
        try:
            retention = get_tool(tool, version).adapter.capabilities.key_retention_seconds
        except UnknownTool:
            continue
        if retention and first_sent + dt.timedelta(seconds=retention) - now < dt.timedelta(hours=2):
            near += 1
    KEYS_NEAR_RETENTION.set(near)
