"""Every review action answers a plain form POST (redirect back to the case, the message
waiting in the live region) and an htmx POST (the case body plus an out-of-band notice)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from reconciliation.models import Case, CaseEvent, Decision
from reconciliation.review import services

HX = {"HTTP_HX_REQUEST": "true"}


def _claimed(case: Case, user: Any) -> None:
    services.case_claim(case_id=case.pk, user=user)


def _proposal_by_bob(case: Case, bob: Any) -> Decision:
    services.case_claim(case_id=case.pk, user=bob)
    decision = services.case_decide(case_id=case.pk, user=bob, action="confirm",
                                  reason_code="other", note="seen",
                                  params_hash=case.operation.params_hash).decision
    return decision


Setup = Callable[[Case, Case, Any, Any], tuple[str, dict[str, str], Case]]


def claim(case: Case, big: Case, ann: Any, bob: Any) -> tuple[str, dict[str, str], Case]:
    return reverse("review:claim", args=[case.pk]), {}, case


def release(case: Case, big: Case, ann: Any, bob: Any) -> tuple[str, dict[str, str], Case]:
    _claimed(case, ann)
    return reverse("review:release", args=[case.pk]), {}, case


def decide(case: Case, big: Case, ann: Any, bob: Any) -> tuple[str, dict[str, str], Case]:
    _claimed(case, ann)
    return reverse("review:decide", args=[case.pk]), {
        "action": "reject", "reason_code": "provider_has_no_record", "note": "nothing",
        "params_hash": case.operation.params_hash}, case


def approve(case: Case, big: Case, ann: Any, bob: Any) -> tuple[str, dict[str, str], Case]:
    proposal = _proposal_by_bob(big, bob)
    _claimed(big, ann)
    return reverse("review:approve", args=[proposal.pk]), {
        "reason_code": "provider_record_matches", "note": "matches",
        "params_hash": big.operation.params_hash}, big


def withdraw(case: Case, big: Case, ann: Any, bob: Any) -> tuple[str, dict[str, str], Case]:
    proposal = _proposal_by_bob(big, bob)
    _claimed(big, ann)
    return reverse("review:withdraw", args=[proposal.pk]), {"note": "not convinced"}, big


def note(case: Case, big: Case, ann: Any, bob: Any) -> tuple[str, dict[str, str], Case]:
    return reverse("review:note", args=[case.pk]), {"text": "called the provider"}, case


@pytest.mark.parametrize("setup", [claim, release, decide, approve, withdraw, note],
                         ids=lambda f: f.__name__)
def test_action_without_javascript_redirects_to_the_case_with_a_message(
    setup: Setup, ann: Client, case: Case, big_case: Case, reviewer: Any,
    second_reviewer: Any,
) -> None:
    url, data, target = setup(case, big_case, reviewer, second_reviewer)
    events = CaseEvent.objects.count()

    response = ann.post(url, data)

    assert response.status_code == 302
    assert response["Location"] == reverse("review:case", args=[target.pk])
    assert CaseEvent.objects.count() > events
    page = ann.get(response["Location"]).content.decode()
    assert '<div id="announcer" class="announcer" role="status" aria-live="polite"><p class=' \
        in page


@pytest.mark.parametrize("setup", [claim, release, decide, approve, withdraw, note],
                         ids=lambda f: f.__name__)
def test_action_with_htmx_returns_the_case_body_and_a_notice(
    setup: Setup, ann: Client, case: Case, big_case: Case, reviewer: Any,
    second_reviewer: Any,
) -> None:
    url, data, _ = setup(case, big_case, reviewer, second_reviewer)
    events = CaseEvent.objects.count()

    response = ann.post(url, data, **HX)

    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="case-body"')
    assert '<div id="announcer" hx-swap-oob="innerHTML"><p class="notice' in html
    assert "<html" not in html
    assert CaseEvent.objects.count() > events
