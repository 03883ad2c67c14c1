"""Case transitions: one write path, conditional updates, an event per change, idempotent."""

from __future__ import annotations

import itertools

import pytest
from django.db import transaction
from django.utils import timezone

from ledger import executor
from ledger import transitions as ledger_transitions
from ledger.models import Operation, OperationEvent
from reconciliation import transitions
from reconciliation.models import Case, CaseEvent
from tests.conftest import refund_params
from tests.reconciliation.helpers import REFUND_OP, case_reasons, fresh

S = Operation.Status
C = Case.State


def prepared(agent, operation_id: str = REFUND_OP, **params) -> Operation:
    return executor.submit(agent=agent, operation_id=operation_id, tool_name="refund",
                           params=refund_params(**params), execute=False).operation


def unknown(agent, operation_id: str = REFUND_OP, **params) -> Operation:
    """in_flight → unknown through the ledger (no provider involved)."""
    claim = ledger_transitions.operation_claim(prepared(agent, operation_id, **params),
                                               worker="w", lease_seconds=30)
    return ledger_transitions.operation_mark_unknown(
        operation=claim.operation, fencing_token=claim.fencing_token,
        error_class="transport.ReadTimeout", actor="worker:w", reason="timeout_after_send")


def test_the_allowed_table_is_closed_and_resolved_is_terminal():
    states = [None, *C.values]
    for from_state, to_state in itertools.product(states, C.values):
        allowed = to_state in transitions.ALLOWED_TRANSITIONS.get(from_state, frozenset())
        if allowed:
            transitions.check_case_transition(from_state, to_state)
        else:
            with pytest.raises(transitions.InvalidCaseTransition):
                transitions.check_case_transition(from_state, to_state)
    assert transitions.ALLOWED_TRANSITIONS[C.RESOLVED] == frozenset()


def test_an_unknown_operation_gets_a_due_case_in_the_same_commit(agent, settings):
    settings.RECONCILIATION_CASE_DEADLINE_SECONDS = 3600
    operation = unknown(agent, amount=4200)

    case = Case.objects.get(operation=operation)
    assert case.state == C.CHECKING and case.open_reason == "timeout_after_send"
    assert case.value_amount == 4200
    assert case.next_check_at <= timezone.now()  # due at once
    assert round((case.deadline_at - case.created_at).total_seconds()) == 3600
    [opened] = CaseEvent.objects.filter(case=case)
    assert (opened.from_state, opened.to_state, opened.reason) == ("", C.CHECKING, "case_opened")
    assert opened.data["error_class"] == "transport.ReadTimeout"


def test_a_rolled_back_ledger_transaction_leaves_no_case(agent):
    claim = ledger_transitions.operation_claim(prepared(agent), worker="w", lease_seconds=30)
    with pytest.raises(RuntimeError), transaction.atomic():
        ledger_transitions.operation_mark_unknown(
            operation=claim.operation, fencing_token=claim.fencing_token,
            error_class="transport.ReadTimeout", actor="worker:w", reason="timeout_after_send")
        raise RuntimeError("the commit never happens")
    assert not Case.objects.exists() and not CaseEvent.objects.exists()
    assert Operation.objects.get().status == S.IN_FLIGHT


def test_an_operation_unknown_again_adds_an_event_to_its_open_case(agent):
    operation = unknown(agent)
    claim = ledger_transitions.operation_claim(operation, worker="r", lease_seconds=30,
                                               from_status=S.UNKNOWN)
    ledger_transitions.operation_mark_unknown(
        operation=claim.operation, fencing_token=claim.fencing_token, error_class="http_500",
        actor="worker:r", reason="ambiguous_5xx")

    case = Case.objects.get()
    assert case.open_reason == "timeout_after_send"  # why it opened does not change
    assert case_reasons(case) == ["case_opened", "operation_unknown_again"]


def test_escalate_moves_to_review_once_and_is_idempotent(agent, settings):
    settings.RECONCILIATION_REVIEW_SLA_SECONDS = 600
    case = Case.objects.get(operation=unknown(agent))

    first = transitions.case_escalate(case=case, reason="manual", actor="staff:ann")
    again = transitions.case_escalate(case=case, reason="anomaly", actor="reconciler")

    assert first.state == again.state == C.AWAITING_REVIEW
    assert again.review_reason == "manual" and again.next_check_at is None
    assert round((again.review_deadline_at - again.updated_at).total_seconds()) == 600
    assert case_reasons(case) == ["case_opened", "manual"]


def test_escalate_with_an_unknown_reason_writes_nothing(agent):
    case = Case.objects.get(operation=unknown(agent))
    with pytest.raises(ValueError):
        transitions.case_escalate(case=case, reason="because", actor="staff:ann")
    assert Case.objects.get().state == C.CHECKING and case_reasons(case) == ["case_opened"]


@pytest.mark.parametrize("outcome", [S.SUCCEEDED, S.FAILED])
def test_case_resolve_resolves_the_case_and_the_operation_together(agent, outcome):
    operation = unknown(agent)
    case = transitions.case_escalate(case=Case.objects.get(operation=operation),
                                     reason="manual", actor="staff:ann")

    resolved = transitions.case_resolve(case=case, outcome=outcome, actor="staff:ann",
                                        reason=f"staff_{outcome}", data={"decision": 7},
                                        params_hash=operation.params_hash)

    operation, case = fresh(operation)
    assert resolved.state == case.state == C.RESOLVED
    assert (case.resolution, case.resolved_by) == (f"staff_{outcome}", "staff:ann")
    assert operation.status == outcome and operation.resolved_at is not None
    last_case_event = CaseEvent.objects.filter(case=case).last()
    assert last_case_event.data == {"outcome": outcome, "decision": 7}
    last_operation_event = operation.events.last()
    assert (last_operation_event.from_status, last_operation_event.to_status) == (
        S.UNKNOWN, outcome)
    assert last_operation_event.actor == "staff:ann"
    # Twice is once.
    events_before = OperationEvent.objects.filter(operation=operation).count()
    transitions.case_resolve(case=case, outcome=outcome, actor="staff:bob", reason="again")
    assert CaseEvent.objects.filter(case=case).count() == 3
    assert OperationEvent.objects.filter(operation=operation).count() == events_before
    assert Case.objects.get().resolved_by == "staff:ann"


def _snapshot(operation: Operation) -> tuple:
    operation, case = fresh(operation)
    return (operation.status, operation.events.count(), case.state,
            CaseEvent.objects.filter(case=case).count())


def test_resolving_the_other_way_is_refused_and_writes_nothing(agent):
    operation = unknown(agent)
    case = Case.objects.get(operation=operation)
    transitions.case_resolve(case=case, outcome=S.FAILED, actor="staff:ann", reason="rejected")
    before = _snapshot(operation)

    with pytest.raises(transitions.CaseConflict):
        transitions.case_resolve(case=case, outcome=S.SUCCEEDED, actor="staff:bob",
                                 reason="confirmed")

    assert _snapshot(operation) == before


def test_a_decision_made_on_other_params_writes_nothing(agent):
    operation = unknown(agent)
    before = _snapshot(operation)
    with pytest.raises(transitions.CaseConflict):
        transitions.case_resolve(case=Case.objects.get(), outcome=S.SUCCEEDED,
                                 actor="staff:ann", reason="confirmed", params_hash="sha256:x")
    assert _snapshot(operation) == before


def test_resolving_while_a_resend_holds_the_operation_rolls_back_the_case_too(agent):
    operation = unknown(agent)
    ledger_transitions.operation_claim(operation, worker="r", lease_seconds=30,
                                       from_status=S.UNKNOWN)
    before = _snapshot(operation)

    with pytest.raises(ledger_transitions.InvalidTransition):
        transitions.case_resolve(case=Case.objects.get(), outcome=S.SUCCEEDED,
                                 actor="staff:ann", reason="confirmed")

    assert _snapshot(operation) == before


def test_an_operation_resolved_by_the_ledger_closes_its_case_in_the_same_commit(agent):
    operation = unknown(agent)
    with pytest.raises(RuntimeError), transaction.atomic():
        ledger_transitions.operation_succeed(
            operation=operation, fencing_token=None, result={"id": "eff_1"},
            provider_request_id="eff_1", actor="worker:late", reason="late_confirmation")
        assert Case.objects.get().state == C.RESOLVED
        raise RuntimeError("roll both back")
    assert Case.objects.get().state == C.CHECKING

    ledger_transitions.operation_succeed(
        operation=Operation.objects.get(), fencing_token=None, result={"id": "eff_1"},
        provider_request_id="eff_1", actor="worker:late", reason="late_confirmation")

    case = Case.objects.get()
    assert (case.state, case.resolution, case.resolved_by) == (
        C.RESOLVED, "late_confirmation", "worker:late")


def test_reschedule_of_a_case_no_longer_checking_writes_nothing(agent):
    case = Case.objects.get(operation=unknown(agent))
    transitions.case_escalate(case=case, reason="manual", actor="staff:ann")

    result = transitions.case_reschedule(case=case, next_check_at=timezone.now(),
                                         actor="reconciler", reason="lookup_not_found")

    assert result.state == C.AWAITING_REVIEW and result.next_check_at is None
    assert result.attempts == 0 and case_reasons(case) == ["case_opened", "manual"]


def test_flag_is_set_once_and_never_changes_the_resolution(agent):
    operation = unknown(agent)
    case = transitions.case_resolve(case=Case.objects.get(), outcome=S.FAILED,
                                    actor="staff:ann", reason="staff_rejected")

    transitions.case_flag(case=case, actor="staff:bob", reason="contradicting_evidence")
    transitions.case_flag(case=case, actor="staff:bob", reason="contradicting_evidence")

    operation, case = fresh(operation)
    assert case.flagged and case.state == C.RESOLVED and operation.status == S.FAILED
    assert case_reasons(case).count("contradicting_evidence") == 1


def test_case_events_and_evidence_are_append_only(agent):
    from ledger.models import AppendOnlyError

    case = Case.objects.get(operation=unknown(agent))
    event = CaseEvent.objects.get(case=case)
    evidence = transitions.case_record_evidence(case=case, kind="lookup", request={},
                                                response={}, outcome="not_found",
                                                actor="reconciler")
    for row in (event, evidence):
        with pytest.raises(AppendOnlyError):
            row.save()
        with pytest.raises(AppendOnlyError):
            row.delete()
