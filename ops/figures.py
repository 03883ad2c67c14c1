"""The "now" figures of the operators' overview, and the alert conditions built on them.

Every query here reads only unresolved operations (through operation_unresolved_idx and the
other partial indexes) or small tables, so the page costs the same with ten thousand or ten
million terminal operations. The same functions feed the Prometheus gauges (config.gauges),
so a banner on /ops/ and an alert from alerts.yml always agree.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from ledger.models import Operation
from ledger.tools import UnknownTool, get_tool
from ops.models import RollupCursor, SweepHeartbeat
from reconciliation.models import Case

S = Operation.Status
UNRESOLVED = (S.PREPARED, S.IN_FLIGHT, S.UNKNOWN)
RETENTION_WARNING = dt.timedelta(hours=2)
# Built by issue 8 (webhooks) on another branch; looked up by name so this page works either way.
WEBHOOK_DELIVERY_MODEL = "ledger.WebhookDelivery"
# The sweeps beat runs (CELERY_BEAT_SCHEDULE): the alert names these.
SWEEPS = {
    "reconciliation.tasks.sweep_leases": "leases",
    "reconciliation.tasks.sweep_cases": "cases",
    "ledger.tasks.retry_unsent_operations": "unsent",
    "ops.tasks.rollup_stats": "ops_rollup",
}


ToolVersion = tuple[str, int]


def unknown_sla_seconds(tool_name: str, version: int | None = None) -> int:
    """The tool version's own SLA for an unknown outcome, or the ledger-wide default."""
    default = int(settings.LEDGER_UNKNOWN_SLA_SECONDS)
    try:
        tool = get_tool(tool_name, version)
    except UnknownTool:
        return default
    return int(getattr(tool, "unknown_sla_seconds", default) or default)


def key_retention_seconds(tool_name: str, version: int) -> int | None:
    """How long the provider of the operation's tool version keeps an idempotency key."""
    try:
        adapter = get_tool(tool_name, version).adapter
    except UnknownTool:
        return None
    return adapter.capabilities.key_retention_seconds


def all_tool_versions() -> set[ToolVersion]:
    """Every version the catalogue declares (configuration-sized)."""
    from ledger.tools import catalogue

    return {(name, version) for name, versions in catalogue().versions.items()
            for version in versions}


def sweep_stale_after() -> dt.timedelta:
    """A sweep that has not finished for this long is not running (10 beats, at least 2 min)."""
    return dt.timedelta(seconds=max(10 * float(settings.LEDGER_SWEEP_INTERVAL_SECONDS), 120.0))


# --- the conditions, as queryset filters (the explorer links reuse them) -------------------

def past_lease_q(now: dt.datetime) -> Q:
    return Q(status=S.IN_FLIGHT, lease_expires_at__lt=now)


def past_sla_q(now: dt.datetime, tool_versions: set[ToolVersion]) -> Q:
    """unknown for longer than its tool's SLA (updated_at is when it became unknown)."""
    default = dt.timedelta(seconds=int(settings.LEDGER_UNKNOWN_SLA_SECONDS))
    condition = Q(status=S.UNKNOWN, updated_at__lt=now - default)
    for tool, version in sorted(tool_versions):
        sla = dt.timedelta(seconds=unknown_sla_seconds(tool, version))
        if sla != default:
            # This version's own SLA replaces the default one for its rows.
            condition = (condition & ~Q(tool=tool, tool_version=version)) | Q(
                status=S.UNKNOWN, tool=tool, tool_version=version, updated_at__lt=now - sla)
    return condition


def near_retention_q(now: dt.datetime, tool_versions: set[ToolVersion]) -> Q:
    """Unresolved, and the provider forgets its key within two hours (or already has)."""
    condition = Q(pk__in=[])
    for tool, version in sorted(tool_versions):
        retention = key_retention_seconds(tool, version)
        if retention:
            cutoff = now + RETENTION_WARNING - dt.timedelta(seconds=retention)
            condition |= Q(tool=tool, tool_version=version, key_first_sent_at__lt=cutoff)
    return Q(status__in=UNRESOLVED) & condition


# --- the figures ---------------------------------------------------------------------------

@dataclass
class OpenCount:
    status: str
    tool: str
    version: int
    provider: str
    count: int


@dataclass
class Sweep:
    name: str
    last_finished_at: dt.datetime | None
    stale: bool


@dataclass
class NowFigures:
    now: dt.datetime
    open_rows: list[OpenCount]
    in_flight_past_lease: int
    unknown_past_sla: int
    keys_near_retention: int
    awaiting_review: int
    review_overdue: int
    webhooks_failing: int | None
    sweeps: list[Sweep]
    rolled_until: dt.datetime | None
    by_status: dict[str, int] = field(default_factory=dict)

    @property
    def status_rows(self) -> list[tuple[str, str, int]]:
        return [(status, S(status).label, count) for status, count in self.by_status.items()]

    @property
    def stale_sweeps(self) -> list[Sweep]:
        return [sweep for sweep in self.sweeps if sweep.stale]


def open_operations() -> list[OpenCount]:
    """Unresolved operations by status, tool (version) and provider: one scan of the partial
    index."""
    rows = (Operation.objects.filter(status__in=UNRESOLVED)
            .values_list("status", "tool", "tool_version", "provider").annotate(n=Count("id"))
            .order_by("status", "tool", "tool_version", "provider"))
    return [OpenCount(status, tool, version, provider, n)
            for status, tool, version, provider, n in rows]


def overdue_counts(now: dt.datetime, open_rows: list[OpenCount]) -> dict[str, int]:
    """The three operation alert figures in one statement over the unresolved rows."""
    if not open_rows:
        return {"past_lease": 0, "past_sla": 0, "near_retention": 0}
    versions = {(row.tool, row.version) for row in open_rows}
    counts: dict[str, Any] = Operation.objects.filter(status__in=UNRESOLVED).aggregate(
        past_lease=Count("id", filter=past_lease_q(now)),
        past_sla=Count("id", filter=past_sla_q(now, versions)),
        near_retention=Count("id", filter=near_retention_q(now, versions)),
    )
    return {name: int(value or 0) for name, value in counts.items()}


def review_counts(now: dt.datetime) -> tuple[int, int]:
    counts = Case.objects.filter(state=Case.State.AWAITING_REVIEW).aggregate(
        waiting=Count("id"), overdue=Count("id", filter=Q(review_deadline_at__lt=now)))
    return int(counts["waiting"] or 0), int(counts["overdue"] or 0)


def webhook_delivery_model() -> Any:
    """The webhooks outbox (issue 8), if this deployment has it."""
    try:
        return apps.get_model(WEBHOOK_DELIVERY_MODEL)
    except LookupError:
        return None


def webhooks_failing() -> int | None:
    """Deliveries still being retried after a failed attempt, plus those given up on."""
    model = webhook_delivery_model()
    if model is None:
        return None
    return int(model.objects.filter(
        Q(status="pending", attempts__gt=0) | Q(status="gave_up")).count())


def sweeps(now: dt.datetime) -> list[Sweep]:
    seen = dict(SweepHeartbeat.objects.values_list("sweep", "last_finished_at"))
    stale_after = sweep_stale_after()
    return [Sweep(name, seen.get(name), seen.get(name) is None or now - seen[name] > stale_after)
            for name in SWEEPS.values()]


def now_figures(now: dt.datetime | None = None) -> NowFigures:
    now = now or timezone.now()
    open_rows = open_operations()
    overdue = overdue_counts(now, open_rows)
    waiting, review_overdue = review_counts(now)
    by_status: dict[str, int] = {str(status): 0 for status in UNRESOLVED}
    for row in open_rows:
        by_status[row.status] = by_status.get(row.status, 0) + row.count
    return NowFigures(
        now=now,
        open_rows=open_rows,
        in_flight_past_lease=overdue["past_lease"],
        unknown_past_sla=overdue["past_sla"],
        keys_near_retention=overdue["near_retention"],
        awaiting_review=waiting,
        review_overdue=review_overdue,
        webhooks_failing=webhooks_failing(),
        sweeps=sweeps(now),
        rolled_until=RollupCursor.objects.filter(name="events")
        .values_list("rolled_until", flat=True).first(),
        by_status=by_status,
    )
