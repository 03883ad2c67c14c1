"""Only staff with reconciliation.review_case reach the queue; everyone else gets the login
page or 403, with and without htmx, and a refused POST writes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from reconciliation.models import Case, CaseEvent, Decision, Evidence
from tests.review.conftest import logged_in

HX = {"HTTP_HX_REQUEST": "true"}


def _pages(case: Case) -> list[str]:
    return [
        reverse("review:queue"),
        reverse("review:queue") + "?tab=mine",
        reverse("review:new_arrivals") + "?since=0",
        reverse("review:case", args=[case.pk]),
    ]


def _actions(case: Case, decision: Decision) -> list[tuple[str, dict[str, str]]]:
    reasoned = {"reason_code": "other", "note": "looked", "params_hash": decision.params_hash}
    return [
        (reverse("review:claim", args=[case.pk]), {}),
        (reverse("review:release", args=[case.pk]), {}),
        (reverse("review:decide", args=[case.pk]), {"action": "confirm", **reasoned}),
        (reverse("review:check", args=[case.pk]), {}),
        (reverse("review:note", args=[case.pk]), {"text": "a note"}),
        (reverse("review:approve", args=[decision.pk]), reasoned),
        (reverse("review:withdraw", args=[decision.pk]), {"note": "no"}),
    ]


@pytest.fixture
def proposal(big_case: Case, second_reviewer: Any) -> Decision:
    """A four-eyes proposal by Bob, so approve/withdraw URLs exist."""
    from reconciliation.review import services

    services.case_claim(case_id=big_case.pk, user=second_reviewer)
    outcome = services.case_decide(
        case_id=big_case.pk, user=second_reviewer, action="confirm", reason_code="other",
        note="seen on the provider dashboard", params_hash=big_case.operation.params_hash)
    return outcome.decision


def _snapshot() -> tuple[int, int, int, list[Any]]:
    return (
        CaseEvent.objects.count(), Decision.objects.count(), Evidence.objects.count(),
        list(Case.objects.order_by("pk").values_list("state", "claimed_by_id")),
    )


def _agent_client(agent_and_token: tuple[Any, str]) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {agent_and_token[1]}")


@pytest.mark.parametrize("htmx", [False, True], ids=["plain", "htmx"])
@pytest.mark.parametrize("who", ["anonymous", "agent_token"])
def test_unauthenticated_visitors_are_sent_to_the_login_page(
    who: str, htmx: bool, case: Case, proposal: Decision, agent_and_token: tuple[Any, str],
) -> None:
    client = Client() if who == "anonymous" else _agent_client(agent_and_token)
    headers = HX if htmx else {}
    before = _snapshot()

    for url in _pages(case):
        response = client.get(url, **headers)
        _assert_login(response, htmx)
    for url, data in _actions(case, proposal):
        response = client.post(url, data, **headers)
        _assert_login(response, htmx)

    assert _snapshot() == before


def _assert_login(response: Any, htmx: bool) -> None:
    login = reverse("admin:login")
    if htmx:
        assert response.status_code == 200
        assert response["HX-Redirect"].startswith(login + "?next=")
    else:
        assert response.status_code == 302
        assert response["Location"].startswith(login + "?next=")
    assert b"invoice" not in response.content


@pytest.mark.parametrize("htmx", [False, True], ids=["plain", "htmx"])
@pytest.mark.parametrize("who", ["outsider", "staff_without_review"])
def test_signed_in_users_without_the_review_permission_get_403(
    who: str, htmx: bool, case: Case, proposal: Decision, request: pytest.FixtureRequest,
) -> None:
    client = logged_in(request.getfixturevalue(who))
    headers = HX if htmx else {}
    before = _snapshot()

    for url in _pages(case):
        assert client.get(url, **headers).status_code == 403, url
    for url, data in _actions(case, proposal):
        response = client.post(url, data, **headers)
        assert response.status_code == 403, url
        assert b"invoice" not in response.content

    assert _snapshot() == before


def test_review_permission_without_staff_status_is_not_enough(
    case: Case, django_user_model: Any
) -> None:
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user(username="eve", password="pw-12345678")
    user.user_permissions.add(Permission.objects.get(codename="review_case"))

    assert logged_in(user).get(reverse("review:queue")).status_code == 403


def test_a_reviewer_sees_the_queue_and_the_case(ann: Client, case: Case) -> None:
    assert ann.get(reverse("review:queue")).status_code == 200
    assert ann.get(reverse("review:case", args=[case.pk])).status_code == 200


def test_unknown_case_is_404(ann: Client) -> None:
    assert ann.get(reverse("review:case", args=[999999])).status_code == 404
    assert ann.post(reverse("review:claim", args=[999999])).status_code == 404


def test_actions_refuse_get(ann: Client, case: Case) -> None:
    assert ann.get(reverse("review:claim", args=[case.pk])).status_code == 405
    assert not Case.objects.filter(claimed_by__isnull=False).exists()


def test_every_form_posts_with_a_csrf_token(case: Case, reviewer: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(reviewer)

    refused = client.post(reverse("review:claim", args=[case.pk]))

    assert refused.status_code == 403
    case.refresh_from_db()
    assert case.claimed_by_id is None
