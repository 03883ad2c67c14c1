"""The case page: the evidence panel, "check the provider again", notes."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from ledger.models import AgentCredential
from reconciliation.models import Case, CaseEvent, Evidence
from reconciliation.review import presentation, services
from sandbox.testing import SandboxClient
from tests.review.factories import review_case

HX = {"HTTP_HX_REQUEST": "true"}


def page(client: Client, case: Case, **headers: str) -> str:
    return client.get(reverse("review:case", args=[case.pk]), **headers).content.decode()


def test_evidence_panel_shows_intent_attempts_key_and_timeline(ann: Client, case: Case) -> None:
    operation = case.operation

    html = page(ann, case)

    assert operation.operation_id in html
    assert operation.params_hash in html
    for name in ("invoice", "amount", "currency", "payee"):
        assert f'<th scope="row">{name}</th>' in html
    assert "All params as submitted (secrets redacted)" in html
    # The attempt, with its fencing token and what became of it.
    assert re.search(r'<td class="num mono">1</td>', html)
    assert "unknown (timeout after send)" in html
    assert operation.idempotency_key in html
    assert "Retention deadline" in html and "Inside retention" in html
    assert "in flight → unknown" in html and "checking → awaiting review" in html
    assert "Why in review: High value" in html


def test_secret_params_are_redacted(ann: Client, case: Case, monkeypatch: pytest.MonkeyPatch
                                    ) -> None:
    from dataclasses import replace

    from ledger import tools

    secret_refund = replace(tools.get_tool("refund"), secret_fields=("payee",))
    monkeypatch.setattr(presentation, "tool_of", lambda operation: secret_refund)

    html = page(ann, case)

    assert "cus_123" not in html
    assert "[redacted]" in html


def test_stale_results_show_on_their_attempt(ann: Client, case: Case) -> None:
    from ledger import transitions

    transitions.operation_record_stale_result(
        operation=case.operation, fencing_token=1, outcome="Confirmed",
        data={"provider_request_id": "re_late"}, actor="worker:old")

    assert "Late result ignored (Confirmed)" in page(ann, case)


def test_htmx_get_of_the_case_returns_only_its_body(ann: Client, case: Case) -> None:
    html = page(ann, case, **HX)

    assert html.lstrip().startswith('<div id="case-body"')
    assert "<html" not in html


@pytest.mark.parametrize("htmx", [False, True], ids=["plain", "htmx"])
def test_check_the_provider_again_adds_a_lookup_to_the_evidence(
    htmx: bool, ann: Client, case: Case, sandbox: SandboxClient
) -> None:
    # The factory never really sent the refund, so the provider has no record of it.
    response = ann.post(reverse("review:check", args=[case.pk]), **(HX if htmx else {}))

    evidence = Evidence.objects.get(case=case)
    assert evidence.kind == "staff_check"
    assert evidence.actor == "staff:reviewer-ann"
    assert evidence.created_by.username == "reviewer-ann"
    assert evidence.outcome == "not_found"
    if htmx:
        html = response.content.decode()
        assert "Checked the provider: the provider has no record" in html
        assert "staff check" in html
    else:
        assert response.status_code == 302
        assert "the provider has no record" in ann.get(response["Location"]).content.decode()


def test_checking_a_resolved_case_is_refused(ann: Client, case: Case) -> None:
    from reconciliation import transitions

    transitions.case_resolve(case=case, outcome="failed", actor="t", reason="t")

    response = ann.post(reverse("review:check", args=[case.pk]), **HX)

    assert response.status_code == 409
    assert not Evidence.objects.exists()


def test_notes_are_appended_to_the_case(ann: Client, case: Case) -> None:
    url = reverse("review:note", args=[case.pk])

    response = ann.post(url, {"text": "Called the provider; ticket #4411 open."}, **HX)

    assert response.status_code == 200
    event = CaseEvent.objects.get(case=case, reason="note_added")
    assert event.actor == "staff:reviewer-ann"
    assert event.data == {"note": "Called the provider; ticket #4411 open."}
    assert "ticket #4411 open" in page(ann, case)


def test_an_empty_note_is_refused(ann: Client, case: Case) -> None:
    events = CaseEvent.objects.count()

    response = ann.post(reverse("review:note", args=[case.pk]), {"text": "  "}, **HX)

    assert response.status_code == 422
    assert CaseEvent.objects.count() == events


def test_decision_notes_appear_with_the_notes(ann: Client, big_case: Case, reviewer: Any) -> None:
    services.case_claim(case_id=big_case.pk, user=reviewer)
    services.case_decide(case_id=big_case.pk, user=reviewer, action="confirm", reason_code="other",
                       note="The dashboard shows re_991.",
                       params_hash=big_case.operation.params_hash)

    html = page(ann, big_case)

    assert "The dashboard shows re_991." in html
    assert "Confirm: it happened (awaiting second approval)" in html


def test_every_hx_element_on_the_case_page_degrades(ann: Client, agent: AgentCredential,
                                                    reviewer: Any) -> None:
    case = review_case(agent, 3)
    services.case_claim(case_id=case.pk, user=reviewer)

    html = page(ann, case)

    for link in re.findall(r"<a\b[^>]*>", html):
        assert "href=" in link, link
    for form in re.findall(r"<form\b[^>]*>", html):
        if "hx-post" in form:
            assert 'method="post"' in form and "action=" in form, form
    assert 'role="status"' in html
