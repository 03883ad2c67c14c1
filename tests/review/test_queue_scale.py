"""The queue stays fast with 100,000 open cases: each page is read off the partial index
case_review_idx by keyset, and no query counts every open case. (Timings: bench/queue_scale.py.)"""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.canonical import params_hash
from ledger.models import AgentCredential, Operation
from reconciliation.models import Case
from reconciliation.review import selectors
from tests.conftest import requires_postgres

OPEN_CASES = 100_000


def seed_open_cases(agent: AgentCredential, count: int) -> None:
    """Bulk rows for volume only: the states are given, not reached through transitions,
    because what is measured here is reading them."""
    rng = random.Random(81)
    now = timezone.now()
    digest = params_hash("refund", {"invoice": "x"})
    operations = [
        Operation(
            operation_id=f"wf-scale:invoice-{n}:refund-1:v1", agent=agent, tool="refund",
            tool_version=1, provider="sandbox", intent_params={}, params={},
            params_hash=digest, status=Operation.Status.UNKNOWN, attempts=1, fencing_token=1,
            idempotency_key=f"scale-{n}", value_amount=rng.randrange(100, 5_000_000),
            value_currency="EUR", subject=f"invoice-{n}", status_token=f"scale-token-{n}",
            key_first_sent_at=now,
        )
        for n in range(count)
    ]
    Operation.objects.bulk_create(operations, batch_size=5000)
    cases = [
        Case(operation=operation, state=Case.State.AWAITING_REVIEW,
             open_reason="timeout_after_send",
             review_reason=rng.choice(["high_value", "anomaly", "deadline_passed"]),
             deadline_at=now,
             review_deadline_at=now + dt.timedelta(seconds=rng.randrange(-3600, 86400)),
             value_amount=operation.value_amount)
        for operation in operations
    ]
    Case.objects.bulk_create(cases, batch_size=5000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE reconciliation_case")
        cursor.execute("ANALYZE ledger_operation")


@requires_postgres
@pytest.mark.postgres_only
def test_queue_pages_stay_fast_with_100k_open_cases(
    ann: Client, agent: AgentCredential, reviewer: Any
) -> None:
    seed_open_cases(agent, OPEN_CASES)
    queryset = selectors.case_queue(user=reviewer, tab="all", filters=selectors.QueueFilters())
    first_page = selectors.case_queue_page(queryset)
    assert len(first_page.cases) == selectors.PAGE_SIZE
    deep_anchor = Case.objects.order_by("review_deadline_at", "-value_amount", "pk").values_list(
        "pk", flat=True)[80_000]

    for params in {
        "first": {},
        "deep": {"tab": "all", "after": deep_anchor},
        "unclaimed": {"tab": "unclaimed"},
        "filtered": {"tab": "all", "reason": "anomaly", "min_value": "1000"},
    }.values():
        with CaptureQueriesContext(connection) as queries:
            response = ann.get(reverse("review:queue"), params)
        assert response.status_code == 200
        assert not any("OFFSET" in q["sql"] for q in queries.captured_queries)
        assert len(queries) <= 14, [q["sql"] for q in queries.captured_queries]

    # Wall-clock figures are bench/queue_scale.py's job; here, the shape of every query.
    # Both the first page and a deep one are read straight off the partial index, the deep
    # one starting at its anchor (an index condition, not a filter over 80,000 rows).
    first_plan = selectors._ordered(queryset)[: selectors.PAGE_SIZE].explain()
    assert "case_review_idx" in first_plan, first_plan
    anchor = Case.objects.get(pk=deep_anchor)
    deep_plan = selectors._ordered(queryset.filter(selectors._after(anchor)))[:51].explain()
    assert "case_review_idx" in deep_plan, deep_plan
    assert "Index Cond: (review_deadline_at >=" in deep_plan, deep_plan
