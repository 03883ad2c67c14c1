"""The admin shows cases, events, evidence and decisions read-only; its actions go through
the same transitions and services as everything else."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from ledger.models import Operation
from reconciliation.models import Case, CaseEvent, Evidence
from tests.reconciliation.helpers import case_reasons, unknown_ticket

S = Operation.Status


@pytest.fixture
def admin_client_for(client):
    def login(user):
        client.force_login(user)
        return client

    return login


@pytest.fixture
def open_case(agent, sandbox) -> Case:
    unknown_ticket(agent, "lose-response")
    return Case.objects.get()


def test_lists_with_filters_and_search_render(admin_client, open_case):
    for url in ("/admin/reconciliation/case/", "/admin/reconciliation/caseevent/",
                "/admin/reconciliation/evidence/", "/admin/reconciliation/decision/"):
        assert admin_client.get(url).status_code == 200, url
    page = admin_client.get("/admin/reconciliation/case/",
                            {"state": "checking", "q": "wf-90", "operation__tool": "create_ticket"})
    assert page.status_code == 200
    assert page.context["cl"].result_count == 1


def test_a_case_is_read_only_and_cannot_be_added_or_deleted(admin_client, open_case):
    page = admin_client.get(f"/admin/reconciliation/case/{open_case.pk}/change/")
    assert page.status_code == 200
    assert b'name="state"' not in page.content
    admin_client.post(f"/admin/reconciliation/case/{open_case.pk}/change/",
                      {"state": "resolved", "review_reason": "manual"})
    assert Case.objects.get().state == Case.State.CHECKING
    assert admin_client.get("/admin/reconciliation/case/add/").status_code == 403
    assert admin_client.get(f"/admin/reconciliation/case/{open_case.pk}/delete/"
                            ).status_code == 403


def _action(client, action: str, case: Case):
    return client.post("/admin/reconciliation/case/", {
        "action": action, "_selected_action": [case.pk]}, follow=True)


def test_escalate_action_goes_through_the_transition(admin_client_for, reviewer, open_case):
    reviewer.user_permissions.add(*Permission.objects.filter(
        codename__in=["view_case", "change_case"]))
    client = admin_client_for(reviewer)

    assert _action(client, "escalate_to_review", open_case).status_code == 200

    case = Case.objects.get()
    assert (case.state, case.review_reason) == (Case.State.AWAITING_REVIEW, "manual")
    assert CaseEvent.objects.filter(case=case).last().actor == "staff:reviewer-ann"


def test_check_now_action_stores_evidence_by_the_person(admin_client_for, reviewer, open_case):
    reviewer.user_permissions.add(*Permission.objects.filter(
        codename__in=["view_case", "change_case"]))

    _action(admin_client_for(reviewer), "check_provider_now", open_case)

    evidence = Evidence.objects.get()
    assert (evidence.kind, evidence.created_by) == ("staff_check", reviewer)
    assert Operation.objects.get().status == S.SUCCEEDED  # a full match is proof


def test_actions_need_the_review_permission(admin_client_for, staff_without_review, open_case):
    staff_without_review.user_permissions.add(*Permission.objects.filter(
        codename__in=["view_case", "change_case"]))
    client = admin_client_for(staff_without_review)

    page = client.get("/admin/reconciliation/case/")
    assert b"escalate_to_review" not in page.content
    _action(client, "escalate_to_review", open_case)

    assert Case.objects.get().state == Case.State.CHECKING
    assert case_reasons(open_case) == ["case_opened"]
