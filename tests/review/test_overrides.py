"""A decision may not silently contradict the evidence: rejecting after a lookup found a
matching effect, or confirming after an authoritative "not found" past the consistency
window, is an override — marked as one with a written reason, approved by a second, different
reviewer whatever the amount, and recorded with the evidence it overrode."""

from __future__ import annotations

import html
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from ledger.models import Operation
from reconciliation import transitions as case_transitions
from reconciliation.models import Case, Decision, Evidence
from reconciliation.review import services
from tests.review.test_decisions import HX, decide_url, decision, snapshot

S = Operation.Status


def found_match(case: Case) -> Evidence:
    """What the reconciler keeps after a lookup that found the effect with every intent field
    equal (reconciler.lookup_response for a Found answer with no differences)."""
    operation = case.operation
    return case_transitions.case_record_evidence(
        case=case, kind="lookup", outcome="found_match", actor="reconciler",
        request={"provider": operation.provider, "idempotency_key": operation.idempotency_key},
        response={"found": True, "provider_request_id": "re_123", "status": "succeeded",
                  "matches": 1, "fields": dict(operation.intent_params), "differences": {}})


def proven_absent(case: Case, *, authoritative: bool = True) -> Evidence:
    return case_transitions.case_record_evidence(
        case=case, kind="lookup", outcome="not_found", actor="reconciler",
        request={"provider": case.operation.provider},
        response={"found": False, "absence_is_proof": authoritative})


@pytest.fixture
def claimed(case: Case, reviewer: Any) -> Case:
    services.case_claim(case_id=case.pk, user=reviewer)
    return case


@pytest.mark.parametrize("htmx", [False, True], ids=["plain", "htmx"])
def test_reject_after_a_matching_lookup_is_refused_unless_marked_as_an_override(
    htmx: bool, ann: Client, claimed: Case
) -> None:
    found_match(claimed)
    before = snapshot()

    response = ann.post(decide_url(claimed), decision(claimed, "reject"),
                        **(HX if htmx else {}))

    assert response.status_code == 422
    text = html.unescape(response.content.decode())
    assert "Rejecting contradicts the evidence" in text
    assert "mark the decision as an override" in text
    assert snapshot() == before
    assert Operation.objects.get(pk=claimed.operation_id).status == S.UNKNOWN


def test_an_override_below_the_four_eyes_threshold_still_waits_for_a_second_reviewer(
    ann: Client, claimed: Case, reviewer: Any
) -> None:
    evidence = found_match(claimed)

    response = ann.post(decide_url(claimed), decision(
        claimed, "reject", override="on",
        override_reason="The provider's record is a test refund on another account."), **HX)

    assert response.status_code == 200
    assert "1 of 2 approvals" in response.content.decode()
    assert "it overrides the provider&#x27;s evidence" in response.content.decode()
    proposal = Decision.objects.get()
    assert proposal.status == Decision.Status.AWAITING_SECOND
    assert proposal.overrides_evidence == evidence
    assert proposal.override_reason.startswith("The provider's record is a test refund")
    assert Operation.objects.get(pk=claimed.operation_id).status == S.UNKNOWN  # not yet
    event = claimed.events.get(reason="decision_proposed")
    assert event.data["override"] is True
    assert event.data["override_reason"] == proposal.override_reason
    assert event.data["overridden_evidence"] == {
        "id": evidence.pk, "kind": "lookup", "outcome": "found_match",
        "at": evidence.created_at.isoformat()}


def test_the_approved_override_records_the_evidence_it_overrode_on_the_resolution(
    claimed: Case, reviewer: Any, second_reviewer: Any
) -> None:
    evidence = found_match(claimed)
    proposal = services.case_decide(
        case_id=claimed.pk, user=reviewer, action="reject", reason_code="other",
        note="Checked the account.", params_hash=claimed.operation.params_hash,
        override_reason="Matching record belongs to another payee account.").decision

    with pytest.raises(services.SameReviewer):
        services.decision_approve(decision_id=proposal.pk, user=reviewer, reason_code="other",
                                  note="me again", params_hash=claimed.operation.params_hash)
    services.case_claim(case_id=claimed.pk, user=second_reviewer)
    services.decision_approve(decision_id=proposal.pk, user=second_reviewer,
                              reason_code="provider_record_differs", note="Agreed.",
                              params_hash=claimed.operation.params_hash)

    operation = Operation.objects.get(pk=claimed.operation_id)
    assert operation.status == S.FAILED
    failed = operation.events.get(to_status=S.FAILED)
    assert failed.data["override"] is True
    assert failed.data["overridden_evidence"]["id"] == evidence.pk
    assert failed.data["decided_by"] == ["reviewer-ann", "reviewer-bob"]
    resolved = claimed.events.get(to_state=Case.State.RESOLVED)
    assert resolved.data["overridden_evidence"]["outcome"] == "found_match"
    assert claimed.events.get(reason="decision_approved").data["override"] is True


def test_confirm_after_authoritative_absence_is_an_override(
    ann: Client, claimed: Case
) -> None:
    proven_absent(claimed)
    before = snapshot()

    refused = ann.post(decide_url(claimed), decision(claimed, "confirm"), **HX)

    assert refused.status_code == 422
    assert "Confirming contradicts the evidence" in html.unescape(refused.content.decode())
    assert snapshot() == before
    ann.post(decide_url(claimed), decision(claimed, "confirm", override="on",
                                           override_reason="Bank statement shows the debit."),
             **HX)
    assert Decision.objects.get().status == Decision.Status.AWAITING_SECOND


def test_an_override_needs_its_written_reason(ann: Client, claimed: Case) -> None:
    found_match(claimed)
    before = snapshot()

    response = ann.post(decide_url(claimed), decision(claimed, "reject", override="on"), **HX)

    assert response.status_code == 422
    assert "Write why you decide against the evidence." in response.content.decode()
    assert snapshot() == before


def test_absence_that_proves_nothing_needs_no_override(ann: Client, claimed: Case) -> None:
    proven_absent(claimed, authoritative=False)

    response = ann.post(decide_url(claimed), decision(claimed, "confirm"), **HX)

    assert response.status_code == 200
    assert Operation.objects.get(pk=claimed.operation_id).status == S.SUCCEEDED
    assert "override" not in Decision.objects.get().case.events.get(
        reason="decision_made").data


def test_agreeing_with_the_evidence_is_applied_at_once(ann: Client, claimed: Case) -> None:
    found_match(claimed)

    ann.post(decide_url(claimed), decision(claimed, "confirm"), **HX)

    assert Operation.objects.get(pk=claimed.operation_id).status == S.SUCCEEDED


def test_the_latest_definitive_evidence_is_the_one_that_counts(
    ann: Client, claimed: Case
) -> None:
    found_match(claimed)
    proven_absent(claimed)  # newer: the provider has lost it? The newest proof decides.

    ann.post(decide_url(claimed), decision(claimed, "reject"), **HX)

    assert Operation.objects.get(pk=claimed.operation_id).status == S.FAILED


def test_an_approval_is_refused_when_newer_evidence_contradicts_the_proposal(
    big_case: Case, reviewer: Any, second_reviewer: Any
) -> None:
    services.case_claim(case_id=big_case.pk, user=reviewer)
    proposal = services.case_decide(
        case_id=big_case.pk, user=reviewer, action="reject", reason_code="other",
        note="Nothing at the provider.", params_hash=big_case.operation.params_hash).decision
    found_match(big_case)  # the provider's index caught up after the proposal
    services.case_claim(case_id=big_case.pk, user=second_reviewer)
    before = snapshot()

    with pytest.raises(services.EvidenceContradicted, match="decline it"):
        services.decision_approve(decision_id=proposal.pk, user=second_reviewer,
                                  reason_code="other", note="ok",
                                  params_hash=big_case.operation.params_hash)

    assert snapshot() == before


def test_the_case_page_offers_the_override_only_against_definitive_evidence(
    ann: Client, claimed: Case
) -> None:
    url = reverse("review:case", args=[claimed.pk])
    assert 'name="override"' not in ann.get(url).content.decode()

    found_match(claimed)

    page = ann.get(url).content.decode()
    assert 'name="override"' in page and 'name="override_reason"' in page
    assert "The evidence supports Confirm." in page
