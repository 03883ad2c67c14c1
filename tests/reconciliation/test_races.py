"""Racers on real threads with their own database connections (PostgreSQL: real row locks and
SKIP LOCKED). Each test starts its racers together on a barrier."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from ledger import transitions as ledger_transitions
from ledger.models import Operation
from reconciliation import services, transitions
from reconciliation.models import Case, CaseEvent, Evidence
from tests.conftest import requires_postgres
from tests.reconciliation.helpers import unknown_refund

pytestmark = [requires_postgres, pytest.mark.django_db(transaction=True)]

S = Operation.Status
C = Case.State


def race(*racers: Callable[[], Any]) -> list[Any]:
    """Run the racers at once; return their results (or the exceptions they raised)."""
    barrier = threading.Barrier(len(racers))
    results: list[Any] = [None] * len(racers)

    def run(index: int, racer: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[index] = racer()
        except Exception as exc:  # the test inspects it
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, r)) for i, r in enumerate(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def test_two_reconcilers_on_the_same_due_cases_handle_each_case_once(agent, sandbox):
    operations = [unknown_refund(agent, "lose-response", operation_id=f"wf-{n}:inv-{n}:r-1:v1")
                  for n in range(12)]

    reports = race(lambda: services.sweep_due_cases(batch_size=2),
                   lambda: services.sweep_due_cases(batch_size=2))

    assert all(isinstance(r, services.SweepReport) and r.errors == 0 for r in reports), reports
    assert sum(r.leased for r in reports) == 12  # every case leased exactly once
    assert all(r.leased > 0 for r in reports)  # and both really worked
    assert set(Operation.objects.values_list("status", flat=True)) == {S.SUCCEEDED}
    resends = Counter(Evidence.objects.filter(kind="resend").values_list("case_id", flat=True))
    assert sorted(resends.values()) == [1] * 12
    requests = sandbox.request_counts()["by_reference"]
    assert requests == {op.operation_id: 2 for op in operations}  # original + one re-send
    assert sandbox.effect_counts() == {op.operation_id: 1 for op in operations}


def test_two_sweepers_leasing_at_once_get_disjoint_batches(agent):
    for n in range(20):
        operation = Operation.objects.get(pk=_prepared(agent, n).pk)
        claim = ledger_transitions.operation_claim(operation, worker="w", lease_seconds=30)
        ledger_transitions.operation_mark_unknown(
            operation=claim.operation, fencing_token=claim.fencing_token, error_class="e",
            actor="w", reason="timeout_after_send")
    now = timezone.now()

    def lease() -> list[int]:
        return [lease.case_id for lease in transitions.case_lease_due(
            now=now, batch_size=15, visibility_seconds=120)]

    first, second = race(lease, lease)

    assert not set(first) & set(second)
    assert sorted(first + second) == sorted(Case.objects.values_list("pk", flat=True))


def test_two_lease_sweepers_move_each_expired_operation_once(agent, frozen):
    for n in range(10):
        ledger_transitions.operation_claim(_prepared(agent, n), worker="w", lease_seconds=5)
    frozen.shift(6)

    moved = race(services.sweep_expired_leases, services.sweep_expired_leases)

    assert sum(moved) == 10
    assert Operation.objects.filter(status=S.UNKNOWN).count() == 10
    assert Case.objects.count() == 10
    assert CaseEvent.objects.filter(reason="case_opened").count() == 10
    for operation in Operation.objects.all():
        assert operation.events.filter(reason="lease_expired").count() == 1


def test_two_opposite_decisions_at_once_exactly_one_wins(agent):
    operation = Operation.objects.get(pk=_prepared(agent, 1).pk)
    claim = ledger_transitions.operation_claim(operation, worker="w", lease_seconds=30)
    ledger_transitions.operation_mark_unknown(
        operation=claim.operation, fencing_token=claim.fencing_token, error_class="e",
        actor="w", reason="timeout_after_send")
    case = Case.objects.get()

    results = race(
        lambda: transitions.case_resolve(case=case, outcome=S.SUCCEEDED, actor="staff:ann",
                                         reason="staff_confirmed"),
        lambda: transitions.case_resolve(case=case, outcome=S.FAILED, actor="staff:bob",
                                         reason="staff_rejected"),
    )

    winners = [r for r in results if isinstance(r, Case)]
    losers = [r for r in results if isinstance(r, Exception)]
    assert len(winners) == 1 and len(losers) == 1, results
    assert isinstance(losers[0], transitions.CaseConflict)
    operation = Operation.objects.get()
    case = Case.objects.get()
    assert case.state == C.RESOLVED
    expected = S.SUCCEEDED if case.resolution == "staff_confirmed" else S.FAILED
    assert operation.status == expected
    assert CaseEvent.objects.filter(case=case, to_state=C.RESOLVED).count() == 1
    assert operation.events.filter(to_status__in=[S.SUCCEEDED, S.FAILED]).count() == 1


def _prepared(agent, n: int) -> Operation:
    from ledger import executor
    from tests.conftest import refund_params

    return executor.submit(agent=agent, operation_id=f"wf-{n}:inv-{n}:refund-1:v1",
                           tool_name="refund", params=refund_params(), execute=False).operation
