"""Pre-aggregated counters: written by a periodic rollup of the event tables (beat, every
OPS_ROLLUP_INTERVAL_SECONDS, 30 s by default) and by the tally flush, never by the executor's own
statements.

The rollup reads the operation events of each closed minute through the index on
OperationEvent.created_at — the work is proportional to what happened in that minute, not to
the size of the ledger — and adds each fact to its minute, hour and day rows in one upsert.
A watermark row, locked for the length of the rollup, makes a second rollup running at the
same time wait and then find nothing left to do, so nothing is counted twice.

What it derives from the events (no extra write on any request):
  fresh            an intent recorded (reason intent_recorded)
  outcome          in_flight or unknown → succeeded / failed (detail)
  unknown_opened   in_flight → unknown for an attempt that was not itself a re-send
  unknown_ended    unknown → succeeded / failed: proven_succeeded, proven_failed or person
  resolution       seconds from the case opening to that resolution (histogram)
  provider_call    one provider answer: detail succeeded / failed / unknown / not_sent
  provider_latency seconds from the claim to the recorded answer (histogram, per provider)
  provider_error   error class of every answer that was not a success (per provider)
From the tally (ledger.tally): replay, conflict.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from ledger.models import Operation, OperationEvent
from ledger.tally import Key as TallyKey
from ops.models import RollupCursor, Stat
from reconciliation.models import Case

S = Operation.Status
G = Stat.Grain

# Prometheus-style histogram bounds (seconds); the last bucket is +Inf.
LATENCY_BOUNDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, math.inf)
RESOLUTION_BOUNDS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
                     14400.0, 43200.0, 86400.0, 259200.0, math.inf)
HISTOGRAMS = {"provider_latency": LATENCY_BOUNDS, "resolution": RESOLUTION_BOUNDS}

# A minute is rolled up once it has been over for this long: the ledger's transactions are
# short (no I/O inside), so an event stamped in that minute has committed by then.
SETTLE = dt.timedelta(seconds=30)
# A first rollup starts this far back; a rollup that fell behind catches up this much a run.
FIRST_LOOKBACK = dt.timedelta(days=1)
MAX_CHUNK = dt.timedelta(hours=6)
# How long each grain is kept (the charts need one hour, one day and 30 days).
KEEP = {G.MINUTE: dt.timedelta(hours=3), G.HOUR: dt.timedelta(days=3),
        G.DAY: dt.timedelta(days=400)}
CURSOR = "events"
STAFF_DECISIONS = frozenset({"staff_confirmed", "staff_rejected"})


def bound_label(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else f"{bound:g}"


def bucket_of(seconds: float, bounds: tuple[float, ...]) -> str:
    for bound in bounds:
        if seconds <= bound:
            return bound_label(bound)
    return "+Inf"


def floor_to(moment: dt.datetime, grain: str) -> dt.datetime:
    moment = moment.astimezone(dt.UTC).replace(second=0, microsecond=0)
    if grain == G.MINUTE:
        return moment
    moment = moment.replace(minute=0)
    return moment if grain == G.HOUR else moment.replace(hour=0)


@dataclass(frozen=True)
class Fact:
    at: dt.datetime
    metric: str
    tool: str = ""
    provider: str = ""
    detail: str = ""
    count: int = 1
    total: float = 0.0


# --- writing -----------------------------------------------------------------------------

def add(facts: Iterable[Fact]) -> int:
    """Add facts to their minute, hour and day rows: one upsert statement per 300 rows."""
    rows: dict[tuple[str, dt.datetime, str, str, str, str], list[float]] = defaultdict(
        lambda: [0, 0.0])
    for fact in facts:
        for grain in (G.MINUTE, G.HOUR, G.DAY):
            key = (str(grain), floor_to(fact.at, grain), fact.metric, fact.tool[:64],
                   fact.provider[:64], fact.detail[:100])
            rows[key][0] += fact.count
            rows[key][1] += fact.total
    items = list(rows.items())
    for start in range(0, len(items), 300):
        _upsert(items[start:start + 300])
    return len(items)


def _upsert(items: list[tuple[tuple[str, dt.datetime, str, str, str, str], list[float]]]) -> None:
    table = connection.ops.quote_name(Stat._meta.db_table)
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s)"] * len(items))
    params: list[Any] = []
    for (grain, bucket, metric, tool, provider, detail), (count, total) in items:
        params += [grain, connection.ops.adapt_datetimefield_value(bucket), metric, tool,
                   provider, detail, int(count), float(total)]
    # Additive on both PostgreSQL and SQLite (3.24+): a counter that exists grows.
    sql = (f"INSERT INTO {table} (grain, bucket, metric, tool, provider, detail, count, total) "
           f"VALUES {values} ON CONFLICT (grain, bucket, metric, tool, provider, detail) "
           f"DO UPDATE SET count = {table}.count + excluded.count, "
           f"total = {table}.total + excluded.total")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def tally_sink(counts: Mapping[TallyKey, int]) -> None:
    """Where ledger.tally hands its per-minute counts (registered in OpsConfig.ready)."""
    add(Fact(at=minute, metric=kind, tool=tool, provider=provider, count=n)
        for (minute, kind, tool, provider), n in counts.items())


# --- the rollup ------------------------------------------------------------------------------

@dataclass(frozen=True)
class RollupReport:
    rolled_from: dt.datetime | None
    rolled_until: dt.datetime | None
    events: int
    rows: int
    caught_up: bool = True


def rollup(*, now: dt.datetime | None = None) -> RollupReport:
    """Roll every closed minute since the watermark into the counters, then prune."""
    now = now or timezone.now()
    end_limit = floor_to(now - SETTLE, G.MINUTE)
    with transaction.atomic():
        cursor, _ = RollupCursor.objects.select_for_update().get_or_create(name=CURSOR)
        start = cursor.rolled_until or floor_to(now - FIRST_LOOKBACK, G.MINUTE)
        end = min(end_limit, start + MAX_CHUNK)
        if end <= start:
            return RollupReport(start, cursor.rolled_until, 0, 0, caught_up=True)
        events, facts = _facts_between(start, end)
        rows = add(facts)
        cursor.rolled_until = end
        cursor.save(update_fields=["rolled_until", "updated_at"])
        _prune(now)
    return RollupReport(start, end, events, rows, caught_up=end >= end_limit)


def rollup_until_current(*, now: dt.datetime | None = None, max_runs: int = 8) -> RollupReport:
    """Roll up chunk after chunk until the watermark reaches the last closed minute."""
    total_events = total_rows = 0
    for _ in range(max_runs):
        report = rollup(now=now)
        total_events += report.events
        total_rows += report.rows
        if report.caught_up:
            break
    return RollupReport(None, report.rolled_until, total_events, total_rows, report.caught_up)


def _prune(now: dt.datetime) -> None:
    for grain, keep in KEEP.items():
        Stat.objects.filter(grain=grain, bucket__lt=now - keep).delete()


_OUTCOME_EVENT = (Q(from_status__in=[S.IN_FLIGHT, S.UNKNOWN])
                  & Q(to_status__in=[S.SUCCEEDED, S.FAILED, S.UNKNOWN, S.PREPARED]))


def _facts_between(start: dt.datetime, end: dt.datetime) -> tuple[int, list[Fact]]:
    events = list(
        OperationEvent.objects.filter(created_at__gte=start, created_at__lt=end)
        .filter(Q(reason="intent_recorded") | _OUTCOME_EVENT)
        .exclude(from_status=F("to_status"))  # facts that are not transitions
        .values_list("operation_id", "operation__tool", "operation__provider", "from_status",
                     "to_status", "reason", "fencing_token", "created_at", "data")
    )
    answered = {e[0] for e in events if e[3] == S.IN_FLIGHT}
    resolved = {e[0] for e in events if e[3] == S.UNKNOWN}
    claims = _claims(answered)
    opened = _cases_opened(resolved)
    facts: list[Fact] = []
    for event in events:
        facts.extend(_facts_for(event, claims, opened))
    return len(events), facts


def _chunks(ids: set[int], size: int = 500) -> Iterator[list[int]]:
    ordered = sorted(ids)
    for start in range(0, len(ordered), size):
        yield ordered[start:start + size]


def _claims(operation_ids: set[int]) -> dict[tuple[int, int], tuple[dt.datetime, str]]:
    """(operation, fencing token) → when that attempt was claimed, and from which status."""
    claims: dict[tuple[int, int], tuple[dt.datetime, str]] = {}
    for chunk in _chunks(operation_ids):
        rows = OperationEvent.objects.filter(
            operation_id__in=chunk, to_status=S.IN_FLIGHT
        ).exclude(from_status=S.IN_FLIGHT).values_list(
            "operation_id", "fencing_token", "created_at", "from_status")
        for operation_id, token, at, from_status in rows:
            claims[(operation_id, token)] = (at, from_status)
    return claims


def _cases_opened(operation_ids: set[int]) -> dict[int, dt.datetime]:
    opened: dict[int, dt.datetime] = {}
    for chunk in _chunks(operation_ids):
        opened.update(Case.objects.filter(operation_id__in=chunk)
                      .values_list("operation_id", "created_at"))
    return opened


_CALL_RESULT = {S.SUCCEEDED: "succeeded", S.FAILED: "failed", S.UNKNOWN: "unknown",
                S.PREPARED: "not_sent"}


def _facts_for(event: tuple, claims: Mapping[tuple[int, int], tuple[dt.datetime, str]],
               opened: Mapping[int, dt.datetime]) -> Iterator[Fact]:
    operation_id, tool, provider, from_status, to_status, reason, token, at, data = event
    if reason == "intent_recorded":
        yield Fact(at, "fresh", tool, provider)
        return
    if to_status in (S.SUCCEEDED, S.FAILED):
        yield Fact(at, "outcome", tool, provider, to_status)
    if from_status == S.IN_FLIGHT and reason != "lease_expired":
        yield from _provider_answer(event, claims)
    if from_status == S.IN_FLIGHT and to_status == S.UNKNOWN:
        claim = claims.get((operation_id, token))
        if claim is None or claim[1] != S.UNKNOWN:  # a re-send that stayed unknown is not new
            yield Fact(at, "unknown_opened", tool, provider)
    if from_status == S.UNKNOWN:
        how = "person" if reason in STAFF_DECISIONS else f"proven_{to_status}"
        yield Fact(at, "unknown_ended", tool, provider, how)
        if operation_id in opened:
            seconds = max((at - opened[operation_id]).total_seconds(), 0.0)
            yield Fact(at, "resolution", tool, provider,
                       bucket_of(seconds, RESOLUTION_BOUNDS), total=seconds)


def _provider_answer(event: tuple, claims: Mapping[tuple[int, int], tuple[dt.datetime, str]]
                     ) -> Iterator[Fact]:
    operation_id, tool, provider, _, to_status, _, token, at, data = event
    yield Fact(at, "provider_call", "", provider, _CALL_RESULT.get(to_status, to_status))
    error_class = (data or {}).get("error_class") if isinstance(data, dict) else None
    if to_status != S.SUCCEEDED and error_class:
        yield Fact(at, "provider_error", "", provider, str(error_class))
    claim = claims.get((operation_id, token))
    if claim is not None:
        seconds = max((at - claim[0]).total_seconds(), 0.0)
        yield Fact(at, "provider_latency", "", provider,
                   bucket_of(seconds, LATENCY_BOUNDS), total=seconds)
