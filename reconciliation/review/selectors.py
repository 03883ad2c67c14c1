"""The review queue's reads: tabs, filters, keyset pages, bounded counts, one case to review.

Reads only; everything here scopes to cases awaiting review and selects what the pages show
up front, so a page costs a fixed number of queries however long the queue is.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db.models import Exists, F, OuterRef, Prefetch, Q, QuerySet
from django.utils import timezone

from ledger.tools import latest_tools, tool_names
from reconciliation.models import Case, CaseEvent, Decision

if TYPE_CHECKING:
    from django.contrib.auth.models import User

State = Case.State
DecisionStatus = Decision.Status

BREACHING_WINDOW = dt.timedelta(hours=1)
PAGE_SIZE = 50
# Tab badges count at most this many rows: a COUNT(*) over 100,000 open cases on every page
# view would cost more than the page itself.
COUNT_BOUND = 1000


TABS: dict[str, str] = {
    "mine": "Assigned to me",
    "unclaimed": "Unclaimed",
    "second": "Awaiting second approval",
    "breaching": "Breaching soon",
    "all": "All open",
}
DEFAULT_TAB = "all"
AGE_FILTERS: dict[str, tuple[str, dt.timedelta]] = {
    "1h": ("Older than 1 hour", dt.timedelta(hours=1)),
    "4h": ("Older than 4 hours", dt.timedelta(hours=4)),
    "24h": ("Older than 1 day", dt.timedelta(days=1)),
    "7d": ("Older than 7 days", dt.timedelta(days=7)),
}


@dataclass(frozen=True)
class QueueFilters:
    tool: str = ""
    provider: str = ""
    reason: str = ""
    currency: str = ""  # ISO 4217; the value bounds are in its minor units
    min_value: int | None = None  # minor units
    max_value: int | None = None
    age: str = ""


def _pending_decisions() -> Prefetch:
    return Prefetch(
        "decisions",
        queryset=Decision.objects.filter(status=DecisionStatus.AWAITING_SECOND).select_related(
            "decided_by"),
        to_attr="pending_decisions",
    )


def case_queue(*, user: User, tab: str, filters: QueueFilters,
               now: dt.datetime | None = None) -> QuerySet[Case]:
    """Cases awaiting review for one tab, filtered, in the queue's order (not yet paginated)."""
    now = now or timezone.now()
    queryset = Case.objects.filter(state=State.AWAITING_REVIEW)
    live_claim = Q(claimed_by__isnull=False, claim_expires_at__gt=now)
    if tab == "mine":
        queryset = queryset.filter(live_claim, claimed_by=user)
    elif tab == "unclaimed":
        queryset = queryset.exclude(live_claim)
    elif tab == "second":
        # Proposals waiting for *me*: my own are not mine to approve.
        queryset = queryset.filter(Exists(Decision.objects.filter(
            case=OuterRef("pk"), status=DecisionStatus.AWAITING_SECOND,
        ).exclude(decided_by=user)))
    elif tab == "breaching":
        queryset = queryset.filter(review_deadline_at__lte=now + BREACHING_WINDOW)
    return _filtered(queryset, filters, now)


def _filtered(queryset: QuerySet[Case], filters: QueueFilters,
              now: dt.datetime) -> QuerySet[Case]:
    if filters.tool:
        queryset = queryset.filter(operation__tool=filters.tool)
    if filters.provider:
        queryset = queryset.filter(operation__provider=filters.provider)
    if filters.reason:
        queryset = queryset.filter(review_reason=filters.reason)
    if filters.currency:
        queryset = queryset.filter(operation__value_currency=filters.currency)
    if filters.min_value is not None:
        queryset = queryset.filter(value_amount__gte=filters.min_value)
    if filters.max_value is not None:
        queryset = queryset.filter(value_amount__lte=filters.max_value)
    if filters.age in AGE_FILTERS:
        queryset = queryset.filter(created_at__lte=now - AGE_FILTERS[filters.age][1])
    return queryset


def _ordered(queryset: QuerySet[Case], *, reverse: bool = False) -> QuerySet[Case]:
    """Soonest review deadline, then highest value, then oldest. This matches the partial
    index case_review_idx (review_deadline_at ASC, which PostgreSQL keeps NULLS LAST;
    value_amount DESC, NULLS FIRST), so the database reads the page straight off the index."""
    if not reverse:
        return queryset.order_by(
            F("review_deadline_at").asc(nulls_last=True),
            F("value_amount").desc(nulls_first=True),
            F("pk").asc(),
        )
    return queryset.order_by(
        F("review_deadline_at").desc(nulls_first=True),
        F("value_amount").asc(nulls_last=True),
        F("pk").desc(),
    )


def _tail_after(anchor: Case) -> Q:
    """Among rows with the anchor's deadline: value DESC NULLS FIRST, then pk."""
    value, pk = anchor.value_amount, anchor.pk
    if value is None:
        return Q(value_amount__isnull=False) | Q(value_amount__isnull=True, pk__gt=pk)
    return Q(value_amount__lt=value) | Q(value_amount=value, pk__gt=pk)


def _after(anchor: Case) -> Q:
    """Rows after `anchor` in the queue's order that have a deadline at all (keyset).

    The leading `>=` is redundant but lets PostgreSQL start the index scan at the anchor
    instead of filtering its way there from the first row. Rows without a deadline (last in
    the order) are fetched separately, because OR-ing them in here would cost that start.
    """
    deadline = anchor.review_deadline_at
    if deadline is None:
        return Q(review_deadline_at__isnull=True) & _tail_after(anchor)
    return Q(review_deadline_at__gte=deadline) & (
        Q(review_deadline_at__gt=deadline) | (Q(review_deadline_at=deadline) & _tail_after(anchor))
    )


def _before(anchor: Case) -> Q:
    deadline, value, pk = anchor.review_deadline_at, anchor.value_amount, anchor.pk
    if value is None:
        tail = Q(value_amount__isnull=True, pk__lt=pk)
    else:
        tail = (Q(value_amount__gt=value) | Q(value_amount__isnull=True)
                | Q(value_amount=value, pk__lt=pk))
    if deadline is None:
        return Q(review_deadline_at__isnull=False) | (Q(review_deadline_at__isnull=True) & tail)
    return Q(review_deadline_at__lte=deadline) & (
        Q(review_deadline_at__lt=deadline) | (Q(review_deadline_at=deadline) & tail)
    )


@dataclass
class QueuePage:
    cases: list[Case]
    next_after: int | None = None
    prev_before: int | None = None
    is_first: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def case_queue_page(
    queryset: QuerySet[Case], *, after: int | None = None, before: int | None = None,
    size: int | None = None,
) -> QueuePage:
    """One page by keyset: constant cost however deep the page, no COUNT(*)."""
    size = size or PAGE_SIZE
    queryset = queryset.select_related("operation", "operation__agent", "claimed_by")
    queryset = queryset.prefetch_related(_pending_decisions())
    anchor_pk = after or before
    anchor = Case.objects.filter(pk=anchor_pk).first() if anchor_pk else None
    if anchor is not None and before:
        rows = list(_ordered(queryset.filter(_before(anchor)), reverse=True)[: size + 1])
        has_more_before = len(rows) > size
        rows = list(reversed(rows[:size]))
        return QueuePage(
            cases=rows, next_after=rows[-1].pk if rows else None,
            prev_before=rows[0].pk if rows and has_more_before else None,
            is_first=not has_more_before,
        )
    if anchor is None:
        rows = list(_ordered(queryset)[: size + 1])
    else:
        rows = list(_ordered(queryset.filter(_after(anchor)))[: size + 1])
        if len(rows) <= size and anchor.review_deadline_at is not None:
            undated = queryset.filter(review_deadline_at__isnull=True)
            rows += list(_ordered(undated)[: size + 1 - len(rows)])
    has_next = len(rows) > size
    rows = rows[:size]
    return QueuePage(
        cases=rows,
        next_after=rows[-1].pk if has_next and rows else None,
        prev_before=rows[0].pk if anchor is not None and rows else None,
        is_first=anchor is None,
    )


def bounded_count(queryset: QuerySet[Any], bound: int | None = None) -> tuple[int, bool]:
    """(count, capped): counts at most `bound` rows."""
    bound = bound or COUNT_BOUND
    count = queryset.order_by()[: bound + 1].count()
    return min(count, bound), count > bound


def case_tab_counts(*, user: User, filters: QueueFilters,
                    now: dt.datetime | None = None) -> dict[str, tuple[int, bool]]:
    now = now or timezone.now()
    return {tab: bounded_count(case_queue(user=user, tab=tab, filters=filters, now=now))
            for tab in TABS}


def review_cursor() -> int:
    """The newest case event's id: new arrivals are counted from here."""
    latest = CaseEvent.objects.order_by("-pk").values_list("pk", flat=True).first()
    return latest or 0


def case_new_arrivals(*, since_event: int, bound: int = 99) -> tuple[int, bool]:
    """Cases that entered review after `since_event` and are still waiting (primary-key range
    scan on the event table: cheap however long the history is)."""
    case_ids = (
        CaseEvent.objects.filter(pk__gt=since_event, to_state=State.AWAITING_REVIEW)
        .exclude(from_state=State.AWAITING_REVIEW)
        .values("case_id")
    )
    queryset = Case.objects.filter(pk__in=case_ids, state=State.AWAITING_REVIEW)
    return bounded_count(queryset, bound)


def case_get_for_review(case_id: int) -> Case:
    return (
        Case.objects.select_related("operation", "operation__agent", "claimed_by")
        .prefetch_related(_pending_decisions())
        .get(pk=case_id)
    )


def tool_choices() -> list[tuple[str, str]]:
    return [(name, name.replace("_", " ")) for name in tool_names()]


def provider_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in sorted({tool.provider for tool in latest_tools()})]
