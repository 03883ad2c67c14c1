"""The lease sweeper and the case sweeper's leasing (single process; races are in
test_races.py)."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from django.utils import timezone

from ledger import executor
from ledger import transitions as ledger_transitions
from ledger.models import Operation
from reconciliation import reconciler, services, transitions
from reconciliation.models import Case, CaseEvent, Evidence
from tests.conftest import refund_params
from tests.reconciliation.helpers import unknown_refund

S = Operation.Status
C = Case.State



def claimed(agent, operation_id: str, lease_seconds: int) -> ledger_transitions.Claim:
    operation = executor.submit(agent=agent, operation_id=operation_id, tool_name="refund",
                                params=refund_params(), execute=False).operation
    claim = ledger_transitions.operation_claim(operation, worker="w", lease_seconds=lease_seconds)
    assert claim is not None
    return claim


def unknown_cases(agent, count: int) -> list[Case]:
    cases = []
    for n in range(count):
        claim = claimed(agent, f"wf-{n}:inv-{n}:refund-1:v1", lease_seconds=30)
        operation = ledger_transitions.operation_mark_unknown(
            operation=claim.operation, fencing_token=claim.fencing_token,
            error_class="transport.ReadTimeout", actor="w", reason="timeout_after_send")
        cases.append(Case.objects.get(operation=operation))
    return cases


# --- the lease sweeper -----------------------------------------------------------------------

def test_expired_leases_become_unknown_with_a_case_and_live_ones_are_left(agent, frozen):
    expiring = claimed(agent, "wf-1:inv-1:refund-1:v1", lease_seconds=10)
    alive = claimed(agent, "wf-2:inv-2:refund-1:v1", lease_seconds=60)
    frozen.shift(11)

    assert services.sweep_expired_leases() == 1
    assert services.sweep_expired_leases() == 0  # twice is once

    expired = Operation.objects.get(pk=expiring.operation.pk)
    assert expired.status == S.UNKNOWN and expired.error_class == "lease_expired"
    assert expired.fencing_token == expiring.fencing_token  # no new attempt was made
    assert expired.events.last().reason == "lease_expired"
    assert Case.objects.get(operation=expired).open_reason == "lease_expired"
    assert Operation.objects.get(pk=alive.operation.pk).status == S.IN_FLIGHT
    assert not Case.objects.filter(operation_id=alive.operation.pk).exists()


def test_a_worker_that_answers_after_the_sweeper_read_its_row_wins(agent, frozen):
    claim = claimed(agent, "wf-1:inv-1:refund-1:v1", lease_seconds=10)
    frozen.shift(11)
    stale_copy = Operation.objects.get(pk=claim.operation.pk)
    ledger_transitions.operation_succeed(
        operation=claim.operation, fencing_token=claim.fencing_token, result={"id": "eff_1"},
        provider_request_id="eff_1", actor="worker:w", reason="provider_confirmed")

    # The sweeper works on the copy it read; the conditional update refuses it.
    with pytest.raises(ledger_transitions.TransitionError):
        ledger_transitions.operation_expire_lease(operation=stale_copy)
    assert services.sweep_expired_leases() == 0
    assert Operation.objects.get().status == S.SUCCEEDED and not Case.objects.exists()


# --- leasing due cases -------------------------------------------------------------------

def test_due_cases_are_leased_in_batches_and_hidden_from_the_next_sweeper(agent, frozen):
    cases = unknown_cases(agent, 5)
    not_due = cases[4]
    transitions.case_reschedule(case=not_due, next_check_at=timezone.now() + dt.timedelta(
        seconds=60), actor="reconciler", reason="lookup_not_found")
    transitions.case_escalate(case=cases[3], reason="manual", actor="staff:ann")
    frozen.shift(1)
    now = timezone.now()

    first = transitions.case_lease_due(now=now, batch_size=2, visibility_seconds=120)
    second = transitions.case_lease_due(now=now, batch_size=2, visibility_seconds=120)
    third = transitions.case_lease_due(now=now, batch_size=2, visibility_seconds=120)

    assert [lease.case_id for lease in first] == [cases[0].pk, cases[1].pk]  # oldest due first
    assert [lease.case_id for lease in second] == [cases[2].pk]
    assert third == []
    for case_id in (cases[0].pk, cases[1].pk, cases[2].pk):
        assert Case.objects.get(pk=case_id).next_check_at == now + dt.timedelta(seconds=120)
    # A lease is not a change of the case: no events, no attempts.
    assert CaseEvent.objects.filter(reason__startswith="lease").count() == 0
    # Once the visibility timeout passes, an unfinished case is due again.
    frozen.shift(121)
    again = transitions.case_lease_due(now=timezone.now(), batch_size=10, visibility_seconds=120)
    assert {lease.case_id for lease in again} == {cases[0].pk, cases[1].pk, cases[2].pk,
                                                  not_due.pk}


def test_a_lease_taken_over_by_another_sweeper_is_skipped_without_writing(agent, sandbox, frozen):
    unknown_refund(agent, "lose-response")
    [ours] = transitions.case_lease_due(now=timezone.now(), batch_size=1, visibility_seconds=1)
    frozen.shift(2)
    [theirs] = transitions.case_lease_due(now=timezone.now(), batch_size=1,
                                          visibility_seconds=120)

    assert reconciler.reconcile_case(ours.case_id, lease=ours) == "skipped"
    assert not Evidence.objects.exists() and Operation.objects.get().status == S.UNKNOWN
    assert reconciler.reconcile_case(theirs.case_id, lease=theirs) == S.SUCCEEDED


def test_one_broken_case_does_not_stop_the_sweep(agent, sandbox, monkeypatch):
    unknown_refund(agent, "lose-response", operation_id="wf-1:inv-1:refund-1:v1")
    unknown_refund(agent, "lose-response", operation_id="wf-2:inv-2:refund-1:v1")
    broken = Case.objects.order_by("id").first()
    real = reconciler.reconcile_case

    def flaky(case_id, **kwargs):
        if case_id == broken.pk:
            raise RuntimeError("database hiccup")
        return real(case_id, **kwargs)

    monkeypatch.setattr(reconciler, "reconcile_case", flaky)
    report = services.sweep_due_cases()

    assert report.errors == 1 and report.outcomes == {S.SUCCEEDED: 1}
    assert Case.objects.get(pk=broken.pk).state == C.CHECKING  # due again after its lease


def test_a_check_that_raises_gives_its_case_back_after_the_backoff_not_the_lease(
        agent, sandbox, frozen, monkeypatch, settings):
    settings.RECONCILIATION_CASE_VISIBILITY_SECONDS = 120
    settings.RECONCILIATION_BACKOFF_BASE_SECONDS = 2
    unknown_refund(agent, "lose-response")
    case = Case.objects.get()
    real_check = reconciler._check

    def hiccup(case, operation):
        raise RuntimeError("database hiccup")

    monkeypatch.setattr(reconciler, "_check", hiccup)
    report = services.sweep_due_cases()

    assert report.errors == 1
    after = Case.objects.get()
    assert after.state == C.CHECKING and after.attempts == case.attempts + 1
    # Due again within the backoff (≤ 2 s), not hidden for the 120 s visibility timeout.
    assert after.next_check_at <= timezone.now() + dt.timedelta(seconds=2)
    event = CaseEvent.objects.filter(case=after).latest("id")
    assert (event.reason, event.data["error_class"]) == ("check_failed", "RuntimeError")
    assert not Evidence.objects.exists() and Operation.objects.get().status == S.UNKNOWN

    monkeypatch.setattr(reconciler, "_check", real_check)
    frozen.shift(2)
    assert services.sweep_due_cases().outcomes == {S.SUCCEEDED: 1}


def test_a_failed_check_leaves_alone_a_case_that_is_no_longer_under_its_lease(agent, frozen):
    [case] = unknown_cases(agent, 1)
    [lease] = transitions.case_lease_due(now=timezone.now(), batch_size=1, visibility_seconds=1)
    frozen.shift(2)
    [theirs] = transitions.case_lease_due(now=timezone.now(), batch_size=1,
                                          visibility_seconds=120)
    events = CaseEvent.objects.count()

    assert transitions.case_check_failed(lease=lease, next_check_at=timezone.now(), actor="t",
                                         error_class="RuntimeError") is False
    assert Case.objects.get().next_check_at == theirs.until
    assert CaseEvent.objects.count() == events and Case.objects.get().attempts == case.attempts


def test_the_sweep_stops_leasing_when_its_time_budget_is_spent(agent, frozen):
    unknown_cases(agent, 3)
    report = services.sweep_due_cases(budget_seconds=-1)
    assert report.leased == 0
    assert Case.objects.filter(next_check_at__lte=timezone.now()).count() == 3


# --- timing ------------------------------------------------------------------------------

def test_backoff_grows_exponentially_with_jitter_and_is_capped(settings):
    settings.RECONCILIATION_BACKOFF_BASE_SECONDS = 2
    settings.RECONCILIATION_BACKOFF_MAX_SECONDS = 60
    rng = random.Random(7)
    for attempt, step in [(1, 2), (2, 4), (3, 8), (4, 16), (5, 32), (6, 60), (40, 60)]:
        delays = [reconciler.backoff_seconds(attempt, rng=rng) for _ in range(200)]
        assert step / 2 <= min(delays) and max(delays) <= step
        assert max(delays) - min(delays) > step / 4  # jittered, not constant


def test_a_case_whose_operation_is_being_resent_is_only_rescheduled(agent, sandbox, frozen):
    operation = unknown_refund(agent, "lose-response")
    ledger_transitions.operation_claim(operation, worker="staff:ann", lease_seconds=30,
                                       from_status=S.UNKNOWN, reason="staff_resend")
    requests_before = sandbox.request_counts()["total"]

    assert reconciler.reconcile_case(Case.objects.get().pk) == "rescheduled"

    case = Case.objects.get()
    assert case.state == C.CHECKING
    assert case.next_check_at >= Operation.objects.get().lease_expires_at
    assert CaseEvent.objects.filter(case=case).last().reason == "operation_in_flight"
    assert not Evidence.objects.exists()
    assert sandbox.request_counts()["total"] == requests_before
