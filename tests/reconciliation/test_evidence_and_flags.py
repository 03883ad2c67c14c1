"""Late and stale results, a person's checks and re-sends, and flags on contradictions."""

from __future__ import annotations

import pytest
from django.utils import timezone

from ledger import executor
from ledger import transitions as ledger_transitions
from ledger.models import Operation
from ledger.providers.base import Confirmed, Rejected
from reconciliation import services, transitions
from reconciliation.models import Case, Evidence
from tests.conftest import adapter_named, refund_params
from tests.reconciliation.helpers import (
    REFUND_OP,
    case_reasons,
    evidence_of,
    fresh,
    posts,
    sweep,
    unknown_refund,
    unknown_ticket,
)

S = Operation.Status
C = Case.State



def stalled_worker(agent, frozen, sandbox) -> tuple[ledger_transitions.Claim, Confirmed]:
    """A worker that sent (the provider committed) and then stalled past its lease."""
    operation = executor.submit(agent=agent, operation_id=REFUND_OP, tool_name="refund",
                                params=refund_params(), execute=False).operation
    claim = ledger_transitions.operation_claim(operation, worker="stalled", lease_seconds=5)
    answer = adapter_named("sandbox").send(claim.operation, key=claim.operation.idempotency_key,
                                         timeout=1.0)
    assert isinstance(answer, Confirmed)
    frozen.shift(6)
    sandbox.advance_clock(6)
    assert services.sweep_expired_leases() == 1
    return claim, answer


def test_a_stale_result_after_the_reconciler_resent_is_evidence_never_applied(
    agent, sandbox, frozen
):
    claim, answer = stalled_worker(agent, frozen, sandbox)
    sweep()  # the reconciler re-sends (a newer fencing token) and succeeds
    operation, case = fresh(claim.operation)
    assert operation.status == S.SUCCEEDED and operation.fencing_token == claim.fencing_token + 1
    before = (operation.result, operation.provider_request_id, operation.updated_at)

    late = executor.persist_outcome(claim, answer, actor="worker:stalled")

    operation, case = fresh(claim.operation)
    assert late.status == S.SUCCEEDED
    assert (operation.result, operation.provider_request_id, operation.updated_at) == before
    assert operation.events.last().reason == "stale_result_ignored"
    stale = evidence_of(case)[-1]
    assert (stale.kind, stale.outcome, stale.actor) == ("stale_result", "confirmed",
                                                        "worker:stalled")
    assert stale.request["fencing_token"] == claim.fencing_token
    assert stale.request["current_fencing_token"] == claim.fencing_token + 1
    assert not case.flagged  # it agrees with the resolution
    assert sandbox.effect_counts() == {REFUND_OP: 1}


def test_a_stale_result_that_contradicts_the_resolution_flags_the_case(agent, sandbox, frozen):
    claim, _ = stalled_worker(agent, frozen, sandbox)
    sweep()

    executor.persist_outcome(claim, Rejected(error_class="http_402.card_declined"),
                             actor="worker:stalled")

    operation, case = fresh(claim.operation)
    assert operation.status == S.SUCCEEDED and case.resolution == "provider_confirmed"
    assert case.flagged and case_reasons(case)[-1] == "contradicting_evidence"


def test_a_stale_answer_while_still_checking_makes_the_case_due_now(
    agent, sandbox, sandbox_server, refused_provider, settings, frozen
):
    settings.SANDBOX_URL = sandbox_server.url
    claim, answer = stalled_worker(agent, frozen, sandbox)
    settings.SANDBOX_URL = refused_provider
    sweep()  # the reconciler's re-send never left: unknown again, newer token, check later
    case = Case.objects.get(operation=claim.operation)
    assert case.state == C.CHECKING and case.next_check_at > timezone.now()

    executor.persist_outcome(claim, answer, actor="worker:stalled")

    operation, case = fresh(claim.operation)
    assert operation.status == S.UNKNOWN  # never applied over the newer attempt
    assert case.next_check_at == timezone.now()
    assert case_reasons(case)[-1] == "stale_result_received"
    assert [e.kind for e in evidence_of(case)] == ["resend", "stale_result"]
    settings.SANDBOX_URL = sandbox_server.url
    sweep()
    assert Operation.objects.get().status == S.SUCCEEDED
    assert sandbox.effect_counts() == {REFUND_OP: 1}


def test_a_late_confirmation_with_the_current_token_is_proof(agent, sandbox, frozen):
    claim, answer = stalled_worker(agent, frozen, sandbox)

    executor.persist_outcome(claim, answer, actor="worker:stalled")

    operation, case = fresh(claim.operation)
    assert operation.status == S.SUCCEEDED
    assert (case.state, case.resolution, case.resolved_by) == (
        C.RESOLVED, "late_confirmation", "worker:stalled")
    assert posts(sandbox) == 1


def test_a_staff_rejection_contradicted_by_a_later_lookup_is_flagged_never_flipped(
    agent, sandbox, reviewer
):
    operation = unknown_refund(agent, "lose-response", amount=150_000)  # it did happen
    sweep()  # high value: to review
    case = transitions.case_resolve(case=Case.objects.get(), outcome=S.FAILED,
                                    actor="staff:reviewer-ann", reason="staff_rejected")

    first = services.case_check_now(case=case, actor="", user=reviewer)
    second = services.case_check_now(case=case, actor="", user=reviewer)

    operation, case = fresh(operation)
    assert operation.status == S.FAILED and case.resolution == "staff_rejected"
    assert case.flagged
    assert case_reasons(case).count("contradicting_evidence") == 1
    assert (first.kind, first.outcome, first.created_by) == ("staff_check", "found_match",
                                                             reviewer)
    assert first.actor == "staff:reviewer-ann" and second.outcome == "found_match"


def test_check_now_that_proves_success_resolves_the_case_and_its_operation(
    agent, sandbox, reviewer
):
    operation = unknown_ticket(agent, "lose-response")

    evidence = services.case_check_now(case=Case.objects.get(), actor="", user=reviewer)

    operation, case = fresh(operation)
    assert evidence.outcome == "found_match" and evidence.created_by == reviewer
    assert operation.status == S.SUCCEEDED
    assert (case.resolution, case.resolved_by) == ("lookup_proved_success",
                                                   "staff:reviewer-ann")
    assert case_reasons(case)[-1] == "lookup_proved_success"


def test_check_now_on_a_high_value_case_is_evidence_for_the_person_not_a_verdict(
    agent, sandbox, reviewer
):
    operation = unknown_refund(agent, "lose-response", amount=150_000)  # it did happen
    sweep()  # high value: looked up, to review
    before_state = Case.objects.get().state

    evidence = services.case_check_now(case=Case.objects.get(), actor="", user=reviewer)

    operation, case = fresh(operation)
    assert before_state == case.state == C.AWAITING_REVIEW
    assert evidence.outcome == "found_match"
    assert operation.status == S.UNKNOWN and case.resolution == ""


def test_check_now_that_proves_nothing_changes_nothing(agent, sandbox, reviewer):
    operation = unknown_ticket(agent, "drop-before-commit")  # inside the window: not a proof
    before = Case.objects.values().get()

    evidence = services.case_check_now(case=Case.objects.get(), actor="", user=reviewer)

    operation, case = fresh(operation)
    assert evidence.outcome == "not_found" and evidence.response["absence_is_proof"] is False
    assert operation.status == S.UNKNOWN
    assert Case.objects.values().get() == before
    assert case_reasons(case) == ["case_opened"]


def test_a_person_resends_with_the_same_key_inside_retention(agent, sandbox, reviewer):
    operation = unknown_refund(agent, "drop-before-commit", amount=150_000)
    sweep()  # high value: looked up, not found, to review
    case = Case.objects.get()
    assert case.state == C.AWAITING_REVIEW and sandbox.effect_counts() == {}

    evidence = services.case_resend_same_key(case=case, actor="", user=reviewer)

    operation, case = fresh(operation)
    assert (evidence.kind, evidence.outcome, evidence.created_by) == ("resend", "confirmed",
                                                                      reviewer)
    assert evidence.request["idempotency_key"] == operation.idempotency_key
    assert operation.status == S.SUCCEEDED
    assert (case.state, case.resolved_by) == (C.RESOLVED, "staff:reviewer-ann")
    assert sandbox.effect_counts() == {REFUND_OP: 1}


def test_a_resend_after_retention_is_refused_and_sends_nothing(
    agent, sandbox, reviewer, frozen
):
    operation = unknown_refund(agent, "drop-before-commit", amount=150_000)
    sweep()
    frozen.shift(24 * 3600)
    before = (posts(sandbox), Evidence.objects.count(), operation.events.count())

    with pytest.raises(services.ResendNotAllowed):
        services.case_resend_same_key(case=Case.objects.get(), actor="", user=reviewer)

    assert (posts(sandbox), Evidence.objects.count(), operation.events.count()) == before
    assert Operation.objects.get().status == S.UNKNOWN
