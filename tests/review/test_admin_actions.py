"""Decisions from the Django admin's Case change form go through the review services: claim,
reason code and note, four eyes."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from ledger.models import Operation
from reconciliation.models import Case, Decision
from reconciliation.review import services


@pytest.fixture
def admin_reviewer(reviewer: Any) -> Client:
    reviewer.user_permissions.add(Permission.objects.get(codename="view_case"))
    client = Client()
    client.force_login(reviewer)
    return client


def change_url(case: Case) -> str:
    return reverse("admin:reconciliation_case_change", args=[case.pk])


def run(client: Client, case: Case, action: str, **data: str) -> Any:
    return client.post(change_url(case), {"CHANGE_FORM-action": action,
                                          "_selected_action": str(case.pk), **data})


def test_the_change_form_offers_the_review_actions(admin_reviewer: Client, case: Case) -> None:
    html = admin_reviewer.get(change_url(case)).content.decode()

    for name in ("claim_for_me", "decide_confirm", "decide_reject", "approve_pending"):
        assert f'value="{name}"' in html


def test_confirm_from_the_admin_asks_for_a_reason_and_a_note_then_decides(
    admin_reviewer: Client, case: Case, reviewer: Any
) -> None:
    form = run(admin_reviewer, case, "decide_confirm")
    assert form.status_code == 200
    assert 'name="note"' in form.content.decode()
    assert Decision.objects.count() == 0

    refused = run(admin_reviewer, case, "decide_confirm", post="yes", reason_code="other",
                  note="", params_hash=case.operation.params_hash)
    assert refused.status_code == 200 and Decision.objects.count() == 0

    done = run(admin_reviewer, case, "decide_confirm", post="yes", reason_code="other",
               note="Seen in the provider's dashboard.", params_hash=case.operation.params_hash)

    assert done.status_code == 302
    decision = Decision.objects.get()
    assert (decision.action, decision.status, decision.decided_by) == ("confirm", "applied",
                                                                        reviewer)
    assert Operation.objects.get(pk=case.operation_id).status == "succeeded"
    assert Case.objects.get(pk=case.pk).state == Case.State.RESOLVED


def test_admin_decisions_respect_someone_elses_claim(
    admin_reviewer: Client, case: Case, second_reviewer: Any
) -> None:
    services.case_claim(case_id=case.pk, user=second_reviewer)

    response = run(admin_reviewer, case, "decide_reject", post="yes",
                   reason_code="provider_has_no_record", note="nothing there",
                   params_hash=case.operation.params_hash)

    assert response.status_code == 302
    assert "reviewer-bob is working on this case" in admin_reviewer.get(
        response["Location"]).content.decode().lower()
    assert Decision.objects.count() == 0
    assert Operation.objects.get(pk=case.operation_id).status == "unknown"


def test_four_eyes_from_the_admin(admin_reviewer: Client, big_case: Case, reviewer: Any,
                                  second_reviewer: Any) -> None:
    services.case_claim(case_id=big_case.pk, user=second_reviewer)
    services.case_decide(case_id=big_case.pk, user=second_reviewer, action="confirm",
                       reason_code="other", note="seen", params_hash=big_case.operation.params_hash)

    page = run(admin_reviewer, big_case, "approve_pending")
    assert "1 of 2 approvals" in page.content.decode()
    run(admin_reviewer, big_case, "approve_pending", post="yes",
        reason_code="provider_record_matches", note="matches",
        params_hash=big_case.operation.params_hash)

    assert [d.status for d in Decision.objects.order_by("pk")] == ["applied", "applied"]
    assert Operation.objects.get(pk=big_case.operation_id).status == "succeeded"


def test_staff_without_the_review_permission_get_no_decision_actions(
    case: Case, staff_without_review: Any
) -> None:
    staff_without_review.user_permissions.add(Permission.objects.get(codename="view_case"))
    client = Client()
    client.force_login(staff_without_review)

    html = client.get(change_url(case)).content.decode()
    run(client, case, "decide_confirm", post="yes", reason_code="other", note="x",
        params_hash=case.operation.params_hash)

    assert 'value="decide_confirm"' not in html
    assert Decision.objects.count() == 0
