"""What a customer is told while an outcome is unknown: by when, whether a person is on it,
when we last checked; their own reference (never the internal operation ID); who is speaking
and how to reach them; and nothing about automatic updates unless a script provides them."""

from __future__ import annotations

import datetime as dt
import html
import re

import pytest
import time_machine
from django.test import Client, override_settings
from django.urls import reverse

from ledger.models import AgentCredential, Operation
from reconciliation import services
from reconciliation import transitions as case_transitions
from reconciliation.models import Case
from tests.ledger.factories import in_state
from tests.review.factories import review_case, unknown_operation

S = Operation.Status
HX = {"HTTP_HX_REQUEST": "true"}
START = dt.datetime(2026, 11, 30, 12, 42, tzinfo=dt.UTC)


def page(client: Client, operation: Operation, query: str = "", **extra: str) -> str:
    url = reverse("portal:status", args=[operation.status_token]) + query
    return html.unescape(client.get(url, **extra).content.decode())


def visible(text: str) -> str:
    """The text a reader gets: hidden elements and tags removed."""
    text = re.sub(r"<(\w+)[^>]*\shidden[\s>][\s\S]*?</\1>", " ", text)
    text = re.sub(r"</?(time|strong|span|a|q|em)\b[^>]*>", "", text)  # inline: no gap
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text))


def test_unknown_outcome_says_when_to_expect_an_answer(client: Client,
                                                       agent: AgentCredential) -> None:
    with override_settings(RECONCILIATION_CASE_DEADLINE_SECONDS=900), \
            time_machine.travel(START, tick=False):
        operation = unknown_operation(agent, "wf-1:invoice-1:refund-1:v1")
        text = visible(page(client, operation))

    assert "We expect to confirm this by 12:57 UTC." in text


def test_a_deadline_on_another_day_carries_its_date(client: Client,
                                                    agent: AgentCredential) -> None:
    with override_settings(RECONCILIATION_CASE_DEADLINE_SECONDS=12 * 3600), \
            time_machine.travel(START, tick=False):
        operation = unknown_operation(agent, "wf-1:invoice-1:refund-1:v1")
        text = visible(page(client, operation))

    assert "We expect to confirm this by 1 Dec 2026, 00:42 UTC (" not in text
    assert "We expect to confirm this by 1 Dec 2026, 00:42 UTC." in text


def test_while_a_person_checks_the_page_says_so_and_uses_the_review_deadline(
    client: Client, agent: AgentCredential
) -> None:
    with override_settings(RECONCILIATION_REVIEW_SLA_SECONDS=3600), \
            time_machine.travel(START, tick=False):
        case = review_case(agent, 1)
        text = visible(page(client, case.operation))

    assert "A member of our team is checking it with the payment provider now." in text
    assert "We expect to confirm this by 13:42 UTC." in text


def test_past_its_deadline_the_page_says_it_is_taking_longer(client: Client,
                                                            agent: AgentCredential) -> None:
    with override_settings(RECONCILIATION_CASE_DEADLINE_SECONDS=900), \
            time_machine.travel(START, tick=False):
        operation = unknown_operation(agent, "wf-1:invoice-1:refund-1:v1")
    with time_machine.travel(START + dt.timedelta(hours=1), tick=False):
        text = visible(page(client, operation))

    assert "This is taking longer than we expected." in text
    assert "We expect to confirm this by" not in text


def test_last_checked_shows_the_latest_check(client: Client, agent: AgentCredential,
                                             reviewer: object) -> None:
    with time_machine.travel(START, tick=False):
        operation = unknown_operation(agent, "wf-1:invoice-1:refund-1:v1")
        case = Case.objects.get(operation=operation)
        case_transitions.case_record_evidence(
            case=case, kind="lookup", request={}, response={"found": False},
            outcome="not_found", actor="reconciler")
    with time_machine.travel(START + dt.timedelta(minutes=3), tick=False):
        case_transitions.case_reschedule(case=case, next_check_at=START + dt.timedelta(hours=1),
                                         reason="lookup_not_found", actor="reconciler")
    with time_machine.travel(START + dt.timedelta(minutes=5), tick=False):
        first = visible(page(client, operation))
        polled = visible(page(client, operation, "?n=1&seen=not_yet_confirmed", **HX))

    assert "Last checked 30 Nov 2026, 12:45:00 UTC" in first
    assert "Last checked 30 Nov 2026, 12:45:00 UTC" in polled  # the poll refreshes it too


def test_without_javascript_the_page_claims_no_automatic_updates(
    client: Client, agent: AgentCredential
) -> None:
    operation = in_state(agent, S.UNKNOWN)

    raw = page(client, operation)
    text = visible(raw)

    assert "Check now" in text
    assert "updates by itself" not in text and "Pause updates" not in text
    # The script reveals both; they are in the page, hidden until it runs.
    assert re.search(r'<p class="poll-note js-only" hidden>.*This page updates by itself', raw)
    assert re.search(r'<a id="poll-toggle" class="button button-secondary js-only" hidden', raw)
    assert re.search(r'<script src="/static/js/status\.js" nonce="[^"]+" defer>', raw)


def test_times_are_marked_for_the_script_to_add_local_time(client: Client,
                                                          agent: AgentCredential) -> None:
    operation = unknown_operation(agent, "wf-1:invoice-1:refund-1:v1")

    raw = page(client, operation)

    assert len(re.findall(r"<time [^>]*datetime=\"[^\"]+\" data-local>", raw)) >= 3


def test_the_internal_operation_id_is_never_the_customers_reference(
    client: Client, agent: AgentCredential
) -> None:
    mine = in_state(agent, S.FAILED, operation_id="wf-9:invoice-9:refund-1:v1")
    theirs = in_state(agent, S.FAILED, operation_id="wf-8:invoice-8:refund-1:v1",
                      customer_ref="ORDER-4711")

    made_for_them = page(client, mine)
    own = page(client, theirs)

    assert "wf-9:invoice-9:refund-1:v1" not in made_for_them
    assert f"quote the reference {mine.status_token[:8]}" in visible(made_for_them)
    assert "wf-8:invoice-8" not in own and "quote the reference ORDER-4711" in visible(own)


@override_settings(LEDGER_ORG_NAME="Fjord Outfitters",
                   LEDGER_ORG_CONTACT="Call us on +47 22 00 00 00, 9–17 on weekdays.")
@pytest.mark.parametrize("status", [S.PREPARED, S.UNKNOWN, S.SUCCEEDED, S.FAILED])
def test_the_organisation_and_its_contact_line_are_on_every_status_page(
    client: Client, agent: AgentCredential, status: str
) -> None:
    operation = in_state(agent, status)

    text = visible(page(client, operation))

    assert "Fjord Outfitters" in text
    assert "Call us on +47 22 00 00 00, 9–17 on weekdays." in text


@pytest.mark.parametrize(("amount", "currency", "shown"), [
    (2500, "JPY", "¥2,500"), (2500, "KWD", "2.500\xa0KWD"), (2500, "EUR", "€25.00")])
def test_amounts_use_the_currency_exponent(client: Client, agent: AgentCredential,
                                           amount: int, currency: str, shown: str) -> None:
    operation = in_state(agent, S.SUCCEEDED, amount=amount, currency=currency)

    assert f"<dd>{shown}</dd>" in page(client, operation)


def test_a_staff_check_counts_as_the_latest_check(client: Client, agent: AgentCredential,
                                                  reviewer: object) -> None:
    with time_machine.travel(START, tick=False):
        case = review_case(agent, 1)
    with time_machine.travel(START + dt.timedelta(minutes=7), tick=False):
        case_transitions.case_record_evidence(
            case=case, kind="staff_check", request={}, response={"found": False},
            outcome="not_found", actor="staff:reviewer-ann")
        text = visible(page(client, case.operation))

    assert "Last checked 30 Nov 2026, 12:49:00 UTC" in text
    assert services  # the review services are what record a staff check in production
