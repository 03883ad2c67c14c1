"""Decisions: confirm, reject and re-send with the same key; four-eyes at the threshold; every
decision bound to the params hash it was made on; refusals write nothing."""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

import pytest
import time_machine
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from ledger.models import AgentCredential, Operation, OperationEvent
from reconciliation.models import Case, CaseEvent, Decision, Evidence
from reconciliation.review import services
from sandbox.testing import SandboxClient
from tests.review.factories import review_case

HX = {"HTTP_HX_REQUEST": "true"}
S = Operation.Status


def decide_url(case: Case) -> str:
    return reverse("review:decide", args=[case.pk])


def decision(case: Case, action: str = "confirm", **overrides: str) -> dict[str, str]:
    codes = {"confirm": "provider_dashboard_shows_success", "reject": "provider_has_no_record",
             "resend": "safe_inside_retention"}
    data = {"action": action, "reason_code": codes.get(action, "other"),
            "note": "Checked the provider dashboard: refund re_123 for invoice-1.",
            "params_hash": case.operation.params_hash}
    data.update(overrides)
    return data


def snapshot() -> tuple[Any, ...]:
    return (
        Decision.objects.count(), CaseEvent.objects.count(), OperationEvent.objects.count(),
        Evidence.objects.count(),
        list(Operation.objects.order_by("pk").values_list("status", flat=True)),
        list(Case.objects.order_by("pk").values_list("state", flat=True)),
    )


@pytest.fixture
def claimed(case: Case, reviewer: Any) -> Case:
    services.case_claim(case_id=case.pk, user=reviewer)
    return case


# --- one pair of eyes (below the threshold) ------------------------------------------------

@pytest.mark.parametrize("htmx", [False, True], ids=["plain", "htmx"])
def test_confirm_makes_the_operation_succeeded_and_resolves_the_case(
    htmx: bool, ann: Client, claimed: Case, reviewer: Any
) -> None:
    response = ann.post(decide_url(claimed), decision(claimed), **(HX if htmx else {}))

    if htmx:
        assert response.status_code == 200
        assert (f"Case {claimed.pk} is resolved: the refund is confirmed and the operation "
                "is now succeeded.") in response.content.decode()
        assert "Resolved: confirmed by staff" in response.content.decode()
        assert "Decided by <strong>reviewer-ann</strong>" in response.content.decode()
    else:
        assert response.status_code == 302
        assert response["Location"] == reverse("review:case", args=[claimed.pk])
    operation = Operation.objects.get(pk=claimed.operation_id)
    case = Case.objects.get(pk=claimed.pk)
    assert operation.status == S.SUCCEEDED
    assert case.state == Case.State.RESOLVED and case.claimed_by_id is None
    assert case.resolved_by == "staff:reviewer-ann"
    made = Decision.objects.get()
    assert (made.action, made.status, made.decided_by, made.params_hash) == (
        "confirm", "applied", reviewer, operation.params_hash)
    event = operation.events.get(to_status=S.SUCCEEDED)
    assert (event.from_status, event.actor, event.reason) == (
        S.UNKNOWN, "staff:reviewer-ann", "staff_confirmed")
    assert event.data["decisions"] == [made.pk]
    reasons = list(case.events.values_list("reason", flat=True))
    assert reasons[-2:] == ["decision_made", "staff_confirmed"]
    assert case.events.last().to_state == Case.State.RESOLVED


def test_reject_makes_the_operation_failed(ann: Client, claimed: Case) -> None:
    ann.post(decide_url(claimed), decision(claimed, "reject"))

    operation = Operation.objects.get(pk=claimed.operation_id)
    assert operation.status == S.FAILED
    assert operation.error_class == "reconciliation.staff_rejected"
    assert Case.objects.get(pk=claimed.pk).state == Case.State.RESOLVED
    assert operation.events.last().reason == "staff_rejected"


def test_customer_status_page_follows_the_decision(
    ann: Client, client: Client, claimed: Case
) -> None:
    status_url = reverse("portal:status", args=[claimed.operation.status_token])
    assert "Not yet confirmed" in client.get(status_url).content.decode()

    ann.post(decide_url(claimed), decision(claimed))

    assert "Completed" in client.get(status_url).content.decode()


@pytest.mark.parametrize("htmx", [False, True], ids=["plain", "htmx"])
def test_deciding_needs_the_claim(htmx: bool, ann: Client, case: Case) -> None:
    before = snapshot()

    response = ann.post(decide_url(case), decision(case), **(HX if htmx else {}))

    assert response.status_code == 409
    assert "Claim this case before deciding" in response.content.decode()
    assert snapshot() == before


def test_deciding_on_someone_elses_claim_names_the_holder(
    bob: Client, claimed: Case
) -> None:
    before = snapshot()

    response = bob.post(decide_url(claimed), decision(claimed), **HX)

    assert response.status_code == 409
    assert "reviewer-ann is working on this case" in response.content.decode()
    assert snapshot() == before


def test_an_expired_claim_does_not_let_one_decide(ann: Client, claimed: Case) -> None:
    before = snapshot()

    with time_machine.travel(timezone.now() + services.CLAIM_DURATION + dt.timedelta(seconds=1)):
        response = ann.post(decide_url(claimed), decision(claimed), **HX)

    assert response.status_code == 409
    assert "Your claim on this case expired" in response.content.decode()
    assert snapshot() == before


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"note": "   "}, "Add a note"),
        ({"reason_code": ""}, "This field is required"),
        ({"reason_code": "provider_has_no_record"}, "does not fit the decision"),
        ({"action": "maybe"}, "Select a valid choice"),
    ],
)
@pytest.mark.parametrize("htmx", [False, True], ids=["plain", "htmx"])
def test_invalid_decisions_are_refused_with_field_errors(
    htmx: bool, ann: Client, claimed: Case, overrides: dict[str, str], message: str
) -> None:
    before = snapshot()

    response = ann.post(decide_url(claimed), decision(claimed, **overrides),
                        **(HX if htmx else {}))

    assert response.status_code == 422
    assert message in response.content.decode()
    assert snapshot() == before
    if htmx:
        assert response.content.decode().lstrip().startswith('<div id="case-body"')


def test_a_decision_made_on_other_params_is_refused(ann: Client, claimed: Case) -> None:
    before = snapshot()

    response = ann.post(decide_url(claimed), decision(claimed, params_hash="sha256:" + "0" * 64),
                        **HX)

    assert response.status_code == 409
    assert "not the ones this decision was made on" in response.content.decode()
    assert snapshot() == before


def test_nobody_decides_a_resolved_case(ann: Client, claimed: Case, reviewer: Any) -> None:
    services.case_decide(case_id=claimed.pk, user=reviewer, **{
        k: v for k, v in decision(claimed).items() if k != "params_hash"},
        params_hash=claimed.operation.params_hash)
    before = snapshot()

    response = ann.post(decide_url(claimed), decision(claimed, "reject"), **HX)

    assert response.status_code == 409
    assert snapshot() == before


# --- re-send with the same key --------------------------------------------------------------

def test_resend_inside_retention_uses_the_same_key_once(
    ann: Client, claimed: Case, sandbox: SandboxClient
) -> None:
    operation = claimed.operation

    response = ann.post(decide_url(claimed), decision(claimed, "resend"), **HX)

    assert response.status_code == 200
    assert "Re-sent with the same key, and the provider confirmed it" in response.content.decode()
    operation.refresh_from_db()
    assert operation.status == S.SUCCEEDED
    assert operation.fencing_token == 2  # the original attempt, then the re-send
    resend = operation.events.get(reason="staff_resend")
    assert (resend.from_status, resend.to_status, resend.fencing_token) == (S.UNKNOWN,
                                                                          S.IN_FLIGHT, 2)
    assert sandbox.effect_counts() == {operation.operation_id: 1}
    evidence = Evidence.objects.get(kind="resend")
    assert evidence.request["idempotency_key"] == operation.idempotency_key
    assert evidence.created_by.username == "reviewer-ann"
    assert Case.objects.get(pk=claimed.pk).state == Case.State.RESOLVED
    assert Decision.objects.get().action == "resend"


def test_resend_is_not_offered_or_accepted_after_retention(
    ann: Client, case: Case, reviewer: Any
) -> None:
    later = timezone.now() + dt.timedelta(hours=23, minutes=30)
    with time_machine.travel(later):
        services.case_claim(case_id=case.pk, user=reviewer)
        page = ann.get(reverse("review:case", args=[case.pk])).content.decode()
        before = snapshot()
        response = ann.post(decide_url(case), decision(case, "resend"), **HX)

    assert 'value="resend" disabled' in page
    assert "Retention passed or too close" in page
    assert response.status_code == 422
    assert "only possible while the provider still remembers" in response.content.decode()
    assert snapshot() == before


def test_resend_service_refuses_outside_retention_even_without_the_form(
    case: Case, reviewer: Any
) -> None:
    with time_machine.travel(timezone.now() + dt.timedelta(days=2)):
        services.case_claim(case_id=case.pk, user=reviewer)
        before = snapshot()
        with pytest.raises(services.ResendNotAllowed):
            services.case_decide(case_id=case.pk, user=reviewer, action="resend",
                               reason_code="safe_inside_retention", note="try again",
                               params_hash=case.operation.params_hash)
    assert snapshot() == before


def test_resend_is_never_offered_for_a_provider_without_keys(
    ann: Client, agent: AgentCredential, reviewer: Any
) -> None:
    from ledger import transitions as ledger_transitions
    from ledger.canonical import params_hash, provider_idempotency_key
    from reconciliation import transitions as case_transitions

    intent = {"queue": "billing", "customer": "cus_1", "title": "Refund question"}
    digest = params_hash("create_ticket", intent)
    operation, _ = ledger_transitions.operation_record(agent=agent, values={
        "operation_id": "wf-1:cus_1:ticket-1:v1", "tool": "create_ticket", "tool_version": 1,
        "provider": "sandbox-nokeys", "intent_params": intent, "params": intent,
        "params_hash": digest, "subject": "cus_1",
        "idempotency_key": provider_idempotency_key(operation_id="wf-1:cus_1:ticket-1:v1",
                                                    params_hash=digest)})
    claim = ledger_transitions.operation_claim(operation, worker="t", lease_seconds=30)
    assert claim is not None
    ledger_transitions.operation_mark_unknown(operation=claim.operation, fencing_token=1,
                                              error_class="x", actor="t", reason="x")
    case = case_transitions.case_escalate(case=Case.objects.get(operation=operation),
                                          reason="no_strategy", actor="t")
    services.case_claim(case_id=case.pk, user=reviewer)

    page = ann.get(reverse("review:case", args=[case.pk])).content.decode()

    assert "ignores idempotency keys" in page
    assert 'value="resend" disabled' in page


# --- four eyes -------------------------------------------------------------------------------

def test_at_the_threshold_a_decision_waits_for_a_second_reviewer(
    ann: Client, big_case: Case, reviewer: Any
) -> None:
    services.case_claim(case_id=big_case.pk, user=reviewer)

    response = ann.post(decide_url(big_case), decision(big_case), **HX)

    html = response.content.decode()
    assert "1 of 2 approvals" in html
    assert "proposed by <strong>reviewer-ann</strong>" in html
    assert "you cannot approve it yourself" in html
    operation = Operation.objects.get(pk=big_case.operation_id)
    assert operation.status == S.UNKNOWN  # nothing takes effect yet
    case = Case.objects.get(pk=big_case.pk)
    assert case.state == Case.State.AWAITING_REVIEW
    assert case.claimed_by_id is None  # stepped back so a second reviewer can claim it
    proposal = Decision.objects.get()
    assert proposal.status == Decision.Status.AWAITING_SECOND
    assert case.events.filter(reason="decision_proposed").count() == 1


def _proposed(case: Case, user: Any, action: str = "confirm") -> Decision:
    services.case_claim(case_id=case.pk, user=user)
    return services.case_decide(case_id=case.pk, user=user, action=action, reason_code="other",
                              note="Provider dashboard shows it.",
                              params_hash=case.operation.params_hash).decision


def approve_url(proposal: Decision) -> str:
    return reverse("review:approve", args=[proposal.pk])


def approval(case: Case, **overrides: str) -> dict[str, str]:
    data = {"reason_code": "provider_record_matches",
            "note": "Independently checked: the provider's record matches.",
            "params_hash": case.operation.params_hash}
    data.update(overrides)
    return data


@pytest.mark.parametrize("htmx", [False, True], ids=["plain", "htmx"])
def test_a_second_reviewer_approves_and_the_decision_takes_effect(
    htmx: bool, bob: Client, big_case: Case, reviewer: Any, second_reviewer: Any
) -> None:
    proposal = _proposed(big_case, reviewer)
    services.case_claim(case_id=big_case.pk, user=second_reviewer)
    page = bob.get(reverse("review:case", args=[big_case.pk])).content.decode()
    assert "1 of 2 approvals" in page and "Approve the proposal to confirm it happened" in page

    response = bob.post(approve_url(proposal), approval(big_case), **(HX if htmx else {}))

    assert response.status_code == (200 if htmx else 302)
    proposal.refresh_from_db()
    second = Decision.objects.get(approves=proposal)
    assert proposal.status == second.status == Decision.Status.APPLIED
    assert second.decided_by == second_reviewer and second.action == "confirm"
    operation = Operation.objects.get(pk=big_case.operation_id)
    assert operation.status == S.SUCCEEDED
    event = operation.events.get(to_status=S.SUCCEEDED)
    assert event.data["decided_by"] == ["reviewer-ann", "reviewer-bob"]
    assert Case.objects.get(pk=big_case.pk).state == Case.State.RESOLVED
    assert big_case.events.filter(reason="decision_approved").count() == 1
    # The confirmation reads as a sentence, and the resolved banner names both reviewers.
    told = html.unescape(response.content.decode() if htmx
                         else bob.get(response["Location"]).content.decode())
    assert (f"You approved reviewer-ann's proposal (2 of 2 approvals). Case {big_case.pk} is "
            "resolved: the refund is confirmed and the operation is now succeeded.") in told
    assert ("Proposed by <strong>reviewer-ann</strong> and approved by "
            "<strong>reviewer-bob</strong>") in told


@pytest.mark.parametrize("htmx", [False, True], ids=["plain", "htmx"])
def test_the_proposer_cannot_approve_their_own_decision(
    htmx: bool, ann: Client, big_case: Case, reviewer: Any
) -> None:
    proposal = _proposed(big_case, reviewer)
    before = snapshot()

    response = ann.post(approve_url(proposal), approval(big_case), **(HX if htmx else {}))

    assert response.status_code == 409
    assert "cannot also approve it" in response.content.decode()
    assert snapshot() == before


def test_nobody_approves_twice(big_case: Case, reviewer: Any, second_reviewer: Any) -> None:
    proposal = _proposed(big_case, reviewer)
    services.case_claim(case_id=big_case.pk, user=second_reviewer)
    services.decision_withdraw(decision_id=proposal.pk, user=second_reviewer,
                             note="not convinced")
    services.case_release(case_id=big_case.pk, user=second_reviewer)
    again = _proposed(big_case, reviewer)
    services.case_claim(case_id=big_case.pk, user=second_reviewer)
    services.decision_approve(decision_id=again.pk, user=second_reviewer, reason_code="other",
                            note="ok now", params_hash=big_case.operation.params_hash)
    before = snapshot()

    with pytest.raises(services.DecisionNotPending):
        services.decision_approve(decision_id=again.pk, user=second_reviewer, reason_code="other",
                                note="again", params_hash=big_case.operation.params_hash)
    assert snapshot() == before


def test_approving_needs_the_claim(bob: Client, big_case: Case, reviewer: Any) -> None:
    proposal = _proposed(big_case, reviewer)
    before = snapshot()

    response = bob.post(approve_url(proposal), approval(big_case), **HX)

    assert response.status_code == 409
    assert "Claim this case before deciding" in response.content.decode()
    assert snapshot() == before


def test_approval_is_bound_to_the_params_hash(
    bob: Client, big_case: Case, reviewer: Any, second_reviewer: Any
) -> None:
    proposal = _proposed(big_case, reviewer)
    services.case_claim(case_id=big_case.pk, user=second_reviewer)
    before = snapshot()

    response = bob.post(approve_url(proposal),
                        approval(big_case, params_hash="sha256:" + "1" * 64), **HX)

    assert response.status_code == 409
    assert snapshot() == before


def test_approval_needs_its_own_reason_and_note(
    bob: Client, big_case: Case, reviewer: Any, second_reviewer: Any
) -> None:
    proposal = _proposed(big_case, reviewer)
    services.case_claim(case_id=big_case.pk, user=second_reviewer)
    before = snapshot()

    response = bob.post(approve_url(proposal), approval(big_case, note=""), **HX)

    assert response.status_code == 422
    assert snapshot() == before


def test_a_second_proposal_waits_for_the_first(
    bob: Client, big_case: Case, reviewer: Any, second_reviewer: Any
) -> None:
    _proposed(big_case, reviewer)
    services.case_claim(case_id=big_case.pk, user=second_reviewer)
    before = snapshot()

    response = bob.post(decide_url(big_case), decision(big_case, "reject"), **HX)

    assert response.status_code == 409
    assert "already waiting for a second approval" in response.content.decode()
    assert snapshot() == before


def test_the_proposer_can_withdraw_without_claiming_the_case(
    ann: Client, big_case: Case, reviewer: Any
) -> None:
    proposal = _proposed(big_case, reviewer)

    response = ann.post(reverse("review:withdraw", args=[proposal.pk]), **HX)

    assert response.status_code == 200
    assert "You withdrew your proposal" in response.content.decode()
    proposal.refresh_from_db()
    assert proposal.status == Decision.Status.WITHDRAWN
    assert big_case.events.filter(reason="decision_withdrawn").count() == 1
    assert Operation.objects.get(pk=big_case.operation_id).status == S.UNKNOWN


def test_a_second_reviewer_declines_with_a_reason(
    bob: Client, big_case: Case, reviewer: Any, second_reviewer: Any
) -> None:
    proposal = _proposed(big_case, reviewer)
    services.case_claim(case_id=big_case.pk, user=second_reviewer)
    url = reverse("review:withdraw", args=[proposal.pk])
    before = snapshot()

    refused = bob.post(url, {"note": ""}, **HX)
    assert refused.status_code == 422
    assert snapshot() == before

    declined = bob.post(url, {"note": "Provider shows no such refund."}, **HX)
    assert declined.status_code == 200
    proposal.refresh_from_db()
    assert proposal.status == Decision.Status.WITHDRAWN
    event = big_case.events.get(reason="decision_declined")
    assert event.actor == "staff:reviewer-bob"
    assert event.data["note"] == "Provider shows no such refund."


def test_four_eyes_reject_and_resend_also_wait(
    big_case: Case, reviewer: Any
) -> None:
    proposal = _proposed(big_case, reviewer, action="reject")

    assert proposal.status == Decision.Status.AWAITING_SECOND
    assert Operation.objects.get(pk=big_case.operation_id).status == S.UNKNOWN


def test_below_the_threshold_one_decision_is_enough(
    agent: AgentCredential, reviewer: Any
) -> None:
    case = review_case(agent, 5, amount=999_999)  # one cent under four-eyes
    services.case_claim(case_id=case.pk, user=reviewer)

    outcome = services.case_decide(case_id=case.pk, user=reviewer, action="confirm",
                                 reason_code="other", note="seen",
                                 params_hash=case.operation.params_hash)

    assert outcome.applied and outcome.operation.status == S.SUCCEEDED


def test_the_same_reviewer_may_decide_again_after_a_resend_that_stayed_unknown(
    ann: Client, agent: AgentCredential, reviewer: Any, sandbox: SandboxClient
) -> None:
    case = review_case(agent, 6, memo="sandbox:timeout")
    services.case_claim(case_id=case.pk, user=reviewer)

    first = services.case_decide(case_id=case.pk, user=reviewer, action="resend",
                               reason_code="safe_inside_retention", note="replay it",
                               params_hash=case.operation.params_hash)
    assert first.operation.status == S.UNKNOWN
    assert "still unknown" in first.message
    services.case_claim(case_id=case.pk, user=reviewer)

    second = services.case_decide(case_id=case.pk, user=reviewer, action="confirm",
                                reason_code="other", note="the provider's dashboard shows it",
                                params_hash=case.operation.params_hash)

    assert second.applied and second.operation.status == S.SUCCEEDED
    assert list(case.decisions.order_by("id").values_list("action", "status")) == [
        ("resend", "applied"), ("confirm", "applied")]


def test_the_database_refuses_a_second_approval_of_one_proposal_by_the_same_person(
    agent: AgentCredential, reviewer: Any, second_reviewer: Any
) -> None:
    from django.db import IntegrityError, transaction

    case = review_case(agent, 7, amount=2_000_000)
    common = {"case": case, "action": "confirm", "reason_code": "other", "note": "n",
              "params_hash": case.operation.params_hash}
    proposal = Decision.objects.create(decided_by=reviewer, status="awaiting_second", **common)
    Decision.objects.create(decided_by=second_reviewer, status="applied", approves=proposal,
                            **common)

    with pytest.raises(IntegrityError), transaction.atomic():
        Decision.objects.create(decided_by=second_reviewer, status="applied", approves=proposal,
                                **common)
    with pytest.raises(IntegrityError), transaction.atomic():
        Decision.objects.create(decided_by=reviewer, status="awaiting_second", **common)
