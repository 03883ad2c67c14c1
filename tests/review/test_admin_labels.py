"""The admin speaks words, not codes: filters, titles and columns of the reconciliation
models."""

from __future__ import annotations

import html
from typing import Any

from django.test import Client
from django.urls import reverse

from ledger.models import AgentCredential
from reconciliation.models import CaseEvent
from reconciliation.review import services
from tests.review.factories import review_case


def admin_client(admin_user: Any) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


def test_case_titles_name_the_tool_the_operation_and_the_state_in_words(
    agent: AgentCredential
) -> None:
    case = review_case(agent, 4)

    assert str(case) == "Case for refund wf-4:invoice-4:refund-1:v1 (Awaiting review)"
    event = CaseEvent.objects.filter(case=case, to_state="awaiting_review").first()
    assert str(event) == (f"Case {case.pk}: Checking with the provider → Awaiting review "
                          "(high value)")


def test_case_changelist_filters_and_columns_use_labels(admin_user: Any,
                                                       agent: AgentCredential) -> None:
    review_case(agent, 1, reason="anomaly")
    review_case(agent, 2)

    page = html.unescape(admin_client(admin_user).get(
        reverse("admin:reconciliation_case_changelist")).content.decode())

    assert "Provider record differs" in page and "High value" in page
    assert ">anomaly<" not in page and ">high_value<" not in page
    assert "Confirmed by staff" in page  # the resolution filter, in words


def test_case_change_page_title_is_human(admin_user: Any, agent: AgentCredential) -> None:
    case = review_case(agent, 4)

    page = html.unescape(admin_client(admin_user).get(
        reverse("admin:reconciliation_case_change", args=[case.pk])).content.decode())

    assert "Case for refund wf-4:invoice-4:refund-1:v1 (Awaiting review)" in page
    assert "(awaiting_review)" not in page


def test_decision_changelist_shows_reason_labels_and_overrides(
    admin_user: Any, agent: AgentCredential, reviewer: Any
) -> None:
    case = review_case(agent, 1)
    services.case_claim(case_id=case.pk, user=reviewer)
    outcome = services.case_decide(case_id=case.pk, user=reviewer, action="reject",
                         reason_code="provider_has_no_record", note="Nothing there.",
                         params_hash=case.operation.params_hash)

    page = html.unescape(admin_client(admin_user).get(
        reverse("admin:reconciliation_decision_changelist")).content.decode())

    assert "Provider has no record after the consistency window" in page
    assert ">provider_has_no_record<" not in page
    assert str(outcome.decision) == f"Reject: it did not happen on case {case.pk} (applied)"


def test_operation_changelist_shows_amounts_with_their_exponent(
    admin_user: Any, agent: AgentCredential
) -> None:
    review_case(agent, 1, amount=2500, currency="JPY")
    review_case(agent, 2, amount=2500, currency="KWD")

    page = html.unescape(admin_client(admin_user).get(
        reverse("admin:ledger_operation_changelist")).content.decode())

    assert "¥2,500" in page and "2.500\xa0KWD" in page
    assert "25.00 JPY" not in page
