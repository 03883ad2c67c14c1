"""Gauges computed from the database at scrape time (correct with any number of processes).

They are the same figures the operators' overview shows (ops.figures), so an alert from
deploy/prometheus/alerts.yml and a banner on /ops/ always agree.
"""

from __future__ import annotations

from prometheus_client import Gauge

from ops.figures import now_figures

IN_FLIGHT_PAST_LEASE = Gauge("ledger_in_flight_past_lease", "in_flight rows past their lease")
UNKNOWN_PAST_SLA = Gauge("ledger_unknown_past_sla",
                         "unknown rows older than their tool's unknown SLA")
AWAITING_REVIEW = Gauge("ledger_cases_awaiting_review", "cases awaiting a person")
REVIEW_OVERDUE = Gauge("ledger_cases_review_overdue",
                       "cases awaiting a person past their review deadline")
KEYS_NEAR_RETENTION = Gauge(
    "ledger_keys_near_retention",
    "unresolved operations whose provider key expires within 2 hours (or has expired)",
)
UNRESOLVED = Gauge("ledger_operations_unresolved", "unresolved operations now",
                   ["status", "tool", "provider"])
WEBHOOKS_FAILING = Gauge("ledger_webhook_deliveries_failing",
                         "webhook deliveries retrying after a failure, or given up")
SWEEP_LAST_FINISHED = Gauge(
    "ledger_sweep_last_finished_timestamp_seconds",
    "Unix time at which each periodic sweep last finished without an error",
    ["sweep"],
)


def refresh_gauges() -> None:
    now = now_figures()
    IN_FLIGHT_PAST_LEASE.set(now.in_flight_past_lease)
    UNKNOWN_PAST_SLA.set(now.unknown_past_sla)
    AWAITING_REVIEW.set(now.awaiting_review)
    REVIEW_OVERDUE.set(now.review_overdue)
    KEYS_NEAR_RETENTION.set(now.keys_near_retention)
    UNRESOLVED.clear()
    by_label: dict[tuple[str, str, str], int] = {}
    for row in now.open_rows:  # one row per tool version; the gauge sums them
        key = (row.status, row.tool, row.provider)
        by_label[key] = by_label.get(key, 0) + row.count
    for (status, tool, provider), count in by_label.items():
        UNRESOLVED.labels(status, tool, provider).set(count)
    if now.webhooks_failing is not None:
        WEBHOOKS_FAILING.set(now.webhooks_failing)
    for sweep in now.sweeps:
        if sweep.last_finished_at is not None:
            SWEEP_LAST_FINISHED.labels(sweep.name).set(sweep.last_finished_at.timestamp())
