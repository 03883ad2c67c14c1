"""The customer's status page: plain words per state, polling that backs off and stops."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from ledger.models import AgentCredential, Operation
from portal.views import POLL_DELAYS
from tests.ledger.factories import in_state

S = Operation.Status
HX = {"HTTP_HX_REQUEST": "true"}

UNKNOWN_WORDS = (
    "We can't confirm yet whether your refund went through. We're checking with the payment "
    "provider. You don't need to do anything, and please don't request it again."
)


def url(operation: Operation, query: str = "") -> str:
    return reverse("portal:status", args=[operation.status_token]) + query


def visible_text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&#x27;", "'")


@pytest.fixture
def unknown(agent: AgentCredential) -> Operation:
    return in_state(agent, S.UNKNOWN)


def test_unknown_shows_not_yet_confirmed_with_reference_and_last_check(
    client: Client, unknown: Operation
) -> None:
    response = client.get(url(unknown))

    assert response.status_code == 200
    text = visible_text(response.content.decode())
    assert "Not yet confirmed" in text
    assert UNKNOWN_WORDS in text
    assert unknown.status_token[:8] in text  # a short reference made for the customer
    assert unknown.operation_id not in response.content.decode()
    assert "Last checked" in text
    assert "fail" not in response.content.decode().lower()


def test_unknown_page_has_a_status_live_region_that_polls(
    client: Client, unknown: Operation
) -> None:
    html = client.get(url(unknown)).content.decode()

    assert re.search(r'id="status-region" role="status" aria-live="polite"', html)
    assert f'hx-trigger="every {POLL_DELAYS[0]}s"' in html
    assert "Check now" in html and "Pause updates" in html


@pytest.mark.parametrize(
    ("tool_status", "heading", "words"),
    [
        (S.PREPARED, "Processing", "We're sending your refund to the payment provider."),
        (S.IN_FLIGHT, "Processing", "We're sending your refund to the payment provider."),
        (S.SUCCEEDED, "Completed", "Your refund went through."),
        (S.FAILED, "Not completed", "Your refund was not made."),
    ],
)
def test_each_state_has_plain_words(
    client: Client, agent: AgentCredential, tool_status: str, heading: str, words: str
) -> None:
    operation = in_state(agent, tool_status)

    text = visible_text(client.get(url(operation)).content.decode())

    assert heading in text
    assert words in text


def test_completed_shows_the_providers_reference_and_does_not_poll(
    client: Client, agent: AgentCredential
) -> None:
    operation = in_state(agent, S.SUCCEEDED)

    html = client.get(url(operation)).content.decode()

    assert "Provider reference" in html and "eff_1" in html
    assert "hx-trigger" not in html
    assert "no longer updates" in html


def test_only_not_completed_offers_to_request_again(
    client: Client, agent: AgentCredential
) -> None:
    failed = in_state(agent, S.FAILED, operation_id="wf-1:inv-1:refund-1:v1")
    unknown = in_state(agent, S.UNKNOWN, operation_id="wf-1:inv-2:refund-1:v1")

    assert "request it again: it will be a new request" in client.get(url(failed)).content.decode()
    unknown_html = client.get(url(unknown)).content.decode()
    assert "please don't request it again" in visible_text(unknown_html)
    assert "it will be a new request" not in unknown_html


def test_wrong_token_is_a_plain_404(client: Client, unknown: Operation) -> None:
    last = unknown.status_token[-1]
    near_miss = unknown.status_token[:-1] + ("B" if last == "A" else "A")
    for token in ("x" * 43, near_miss, "a" * 65):
        response = client.get(reverse("portal:status", args=[token]))
        assert response.status_code == 404
        body = response.content.decode()
        assert unknown.operation_id not in body and "refund" not in body.lower()


def test_status_page_is_not_cached_or_indexed(client: Client, unknown: Operation) -> None:
    response = client.get(url(unknown))

    assert "no-cache" in response["Cache-Control"] or "no-store" in response["Cache-Control"]
    assert "noindex" in response["X-Robots-Tag"]
    assert "HX-Request" in response["Vary"]


def test_page_is_served_with_a_strict_nonce_csp(client: Client, unknown: Operation) -> None:
    response = client.get(url(unknown))

    policy = response["Content-Security-Policy"]
    nonce = re.search(r"'nonce-([^']+)'", policy).group(1)  # type: ignore[union-attr]
    assert f'nonce="{nonce}"' in response.content.decode()
    assert "unsafe-inline" not in policy
    assert "http" not in re.sub(r"https?://testserver", "", response.content.decode().split(
        "<body")[0])  # nothing from a CDN in the head


# --- htmx polling -----------------------------------------------------------------------------

def test_poll_backs_off_with_each_request(client: Client, unknown: Operation) -> None:
    response = client.get(url(unknown, "?n=3&seen=not_yet_confirmed"), **HX)

    assert response.status_code == 200
    html = response.content.decode()
    assert f'hx-trigger="every {POLL_DELAYS[3]}s"' in html
    assert "?n=4&amp;seen=not_yet_confirmed" in html
    assert "<html" not in html


def test_unchanged_poll_updates_details_without_touching_the_live_region(
    client: Client, unknown: Operation
) -> None:
    response = client.get(url(unknown, "?n=1&seen=not_yet_confirmed"), **HX)

    assert response["HX-Reswap"] == "none"
    assert 'id="status-details" class="details" hx-swap-oob="true"' in response.content.decode()


def test_changed_state_is_swapped_into_the_live_region(
    client: Client, agent: AgentCredential
) -> None:
    operation = in_state(agent, S.UNKNOWN)
    from ledger import transitions

    transitions.operation_succeed(operation=operation, fencing_token=None, result={"id": "r1"},
                                  provider_request_id="re_777", actor="test", reason="lookup")

    response = client.get(url(operation, "?n=2&seen=not_yet_confirmed"), **HX)

    assert response.status_code == 286  # htmx stops polling
    assert "HX-Reswap" not in response
    html = response.content.decode()
    assert "Completed" in html and "re_777" in html
    assert "hx-trigger" not in html


def test_check_now_always_swaps_the_region(client: Client, unknown: Operation) -> None:
    response = client.get(url(unknown, "?part=check&seen=not_yet_confirmed"), **HX)

    assert "HX-Reswap" not in response
    assert "Not yet confirmed" in response.content.decode()
    assert f'hx-trigger="every {POLL_DELAYS[0]}s"' in response.content.decode()


def test_pause_and_resume_swap_only_the_controls(client: Client, unknown: Operation) -> None:
    paused = client.get(url(unknown, "?part=poller&paused=1"), **HX).content.decode()
    resumed = client.get(url(unknown, "?part=poller"), **HX).content.decode()

    assert "Resume updates" in paused and "hx-trigger" not in paused
    assert "Pause updates" in resumed and "hx-trigger=" in resumed
    assert 'role="status"' not in paused


def test_pause_link_works_without_javascript(client: Client, unknown: Operation) -> None:
    html = client.get(url(unknown, "?paused=1")).content.decode()

    assert "Automatic updates are paused." in html
    assert 'role="status"' in html
    assert "hx-trigger" not in html


def test_every_hx_get_link_has_an_href(client: Client, unknown: Operation) -> None:
    html = client.get(url(unknown)).content.decode()

    for tag in re.findall(r"<a\b[^>]*>", html):
        assert "href=" in tag, tag


def test_status_page_only_answers_get(client: Client, unknown: Operation) -> None:
    assert client.post(url(unknown)).status_code in {403, 405}


def test_email_and_ticket_use_their_own_noun() -> None:
    from portal.views import WORDING

    assert WORDING["send_email"].noun == "e-mail"
    assert WORDING["create_ticket"].noun == "ticket"


def test_an_unknown_email_says_e_mail(client: Client, agent: AgentCredential) -> None:
    from ledger import transitions
    from ledger.canonical import params_hash, provider_idempotency_key

    intent = {"to": "ann@example.com", "template": "receipt", "subject": "Your receipt"}
    digest = params_hash("send_email", intent)
    operation, _ = transitions.operation_record(agent=agent, values={
        "operation_id": "wf-5:ann:email-1:v1", "tool": "send_email", "tool_version": 1,
        "provider": "sandbox", "intent_params": intent, "params": intent, "params_hash": digest,
        "subject": "ann@example.com",
        "idempotency_key": provider_idempotency_key(operation_id="wf-5:ann:email-1:v1",
                                                    params_hash=digest)})
    claim = transitions.operation_claim(operation, worker="t", lease_seconds=30)
    assert claim is not None
    transitions.operation_mark_unknown(operation=claim.operation, fencing_token=1,
                                       error_class="transport.ReadTimeout", actor="t",
                                       reason="timeout_after_send")

    text = visible_text(client.get(url(operation)).content.decode())

    assert ("We can't confirm yet whether your e-mail went through. We're checking with the "
            "e-mail provider.") in text
    assert "Amount" not in text
