"""The connectors a catalogue can name, beyond the generic HTTP fault matrix: lookup-only,
SMTP without a delivery-log search, SMTP TLS, Stripe's default address, status rules."""

from __future__ import annotations

import time
from email.utils import formatdate
from pathlib import Path

import httpx
import pytest

from ledger import executor
from ledger.catalogue import catalogue_from
from ledger.models import Operation
from ledger.providers.base import Found, NotSent, Rejected, Unknown
from ledger.providers.http import ResponseRules, classify_response, retry_after_seconds
from ledger.tools import get_tool
from reconciliation.models import Case
from reconciliation.reconciler import resend_allowed_until
from tests.catalogue.conftest import ACME_TOOLS, payout_params
from tests.conftest import STRIPE_SMTP_TOOLS
from tests.reconciliation.helpers import fresh, sweep

S = Operation.Status
REQUEST = httpx.Request("POST", "https://api.example/v1/things")


def lookup_only_catalogue(tmp_path: Path) -> str:
    """acme.toml's payout with no [send]: agents execute it, the ledger only looks it up."""
    text = Path(ACME_TOOLS).read_text()
    start, end = text.index("[tools.provider.send]"), text.index("[tools.provider.lookup]")
    path = tmp_path / "lookup-only.toml"
    path.write_text(text[:start] + text[end:])
    return str(path)


def test_a_lookup_only_tool_is_never_sent_by_the_ledger_and_is_found_by_lookup(
    acme, acme_agent, sandbox, sandbox_server, settings, tmp_path
):
    settings.LEDGER_TOOLS_FILE = lookup_only_catalogue(tmp_path)
    tool = get_tool("payout")
    assert tool.client_execution and not tool.adapter.capabilities.can_send

    with pytest.raises(executor.InvalidSubmission) as refused:
        executor.submit(agent=acme_agent, operation_id="c-1:inv-1:payout-1:v1",
                        tool_name="payout", params=payout_params())
    assert "executed by the client" in refused.value.errors["tool"]
    assert not Operation.objects.exists()

    # The agent executed it itself, with the key the ledger would have given it.
    operation = Operation(operation_id="c-1:inv-1:payout-1:v1", tool="payout", tool_version=1,
                          provider=tool.provider, intent_params=tool.intent(payout_params()),
                          params=payout_params(), idempotency_key="key-c-1")
    httpx.post(f"{sandbox_server.url}/generic/payouts", json={
        "reference": operation.operation_id, "supplier": "sup_42", "invoice": "inv-2026-17",
        "amount": 125_000, "currency": "EUR"},
        headers={"Authorization": "Bearer agent", "Idempotency-Key": "key-c-1"})
    found = tool.adapter.lookup(operation, timeout=2)
    assert isinstance(found, Found) and found.status == "succeeded"
    assert found.fields == {"supplier": "sup_42", "invoice": "inv-2026-17",
                            "amount_minor": 125_000, "currency": "EUR",
                            "reference": operation.operation_id}
    assert resend_allowed_until(operation, tool.adapter.capabilities) is None


def smtp_catalogue(tmp_path: Path, *, search: bool, tls: str = "none") -> str:
    text = Path(STRIPE_SMTP_TOOLS).read_text()
    if not search:
        text = text.replace('search_url = "setting:SANDBOX_URL"\n', "")
    text = text.replace('tls = "none"', f'tls = "{tls}"')
    path = tmp_path / "smtp.toml"
    path.write_text(text)
    return str(path)


def email(body: str) -> dict[str, str]:
    return {"to": "cus@example.com", "template": "refund_sent", "subject": "Your refund",
            "body": body}


def test_smtp_without_a_delivery_log_search_sends_an_ambiguous_mail_to_review_never_again(
    agent, sandbox, settings, tmp_path
):
    settings.LEDGER_TOOLS_FILE = smtp_catalogue(tmp_path, search=False)
    capabilities = get_tool("send_email").adapter.capabilities
    assert not capabilities.can_lookup and not capabilities.honours_idempotency_keys

    operation = executor.submit(agent=agent, operation_id="m-1:cus-7:email-1:v1",
                                tool_name="send_email",
                                params=email("sandbox:lose-response")).operation
    assert operation.status == S.UNKNOWN
    sweep()

    operation, case = fresh(operation)
    assert (case.state, case.review_reason) == (Case.State.AWAITING_REVIEW, "no_strategy")
    assert len(sandbox.messages(reference=operation.operation_id)) == 1  # delivered once


def test_smtp_starttls_against_a_server_without_it_is_not_sent(agent, sandbox, settings,
                                                              tmp_path):
    settings.LEDGER_TOOLS_FILE = smtp_catalogue(tmp_path, search=True, tls="starttls")
    operation = Operation(operation_id="m-2:cus-7:email-1:v1", tool="send_email",
                          tool_version=2, provider="smtp-sandbox",
                          intent_params={"to": "cus@example.com", "template": "refund_sent",
                                         "subject": "Hi"},
                          params=email("hello"), idempotency_key="key-m-2")

    outcome = get_tool("send_email").adapter.send(operation, key="key-m-2", timeout=2)

    assert isinstance(outcome, NotSent) and outcome.error_class.startswith("smtp.starttls.")
    assert sandbox.messages(reference=operation.operation_id) == []


def test_stripe_points_at_the_real_api_unless_told_otherwise(monkeypatch):
    monkeypatch.setenv("STRIPE_TEST_KEY", "sk_test_x")
    tool = catalogue_from({"tools": [{
        "name": "refund", "version": 1, "description": "Refund.", "subject": "invoice",
        "intent_fields": ["invoice", "amount", "currency", "payee"],
        "value": {"amount": "amount", "currency": "currency"},
        "params": {"type": "object", "additionalProperties": False, "properties": {
            "invoice": {"type": "string"}, "amount": {"type": "integer"},
            "currency": {"type": "string"}, "payee": {"type": "string"},
            "memo": {"type": "string"}}},
        "provider": {"connector": "stripe", "api_key": "env:STRIPE_TEST_KEY"},
    }]}).latest["refund"]

    assert tool.adapter._base_url() == "https://api.stripe.com"
    assert "sk_test_x" not in repr(tool.adapter)


def test_listed_rejections_only_reject_those_statuses_anything_else_is_unknown():
    rules = ResponseRules(rejection_statuses=frozenset({400, 402}))
    assert isinstance(classify_response(httpx.Response(402, json={}, request=REQUEST), rules),
                      Rejected)
    teapot = classify_response(httpx.Response(418, json={}, request=REQUEST), rules)
    assert isinstance(teapot, Unknown) and teapot.error_class == "http_418.418"


def test_a_custom_reference_pointer_and_result_pointer_are_read():
    rules = ResponseRules(reference_pointer="/payout/ref", result_pointer="/payout")
    outcome = classify_response(httpx.Response(
        200, json={"payout": {"ref": "po_9", "state": "paid"}}, request=REQUEST), rules)
    assert outcome.provider_request_id == "po_9"
    assert outcome.result == {"ref": "po_9", "state": "paid"}


def test_retry_after_is_read_as_seconds_or_as_an_http_date():
    in_a_minute = formatdate(time.time() + 60, usegmt=True)
    assert retry_after_seconds(httpx.Response(429, headers={"Retry-After": "7"})) == 7.0
    assert 55 <= retry_after_seconds(httpx.Response(429, headers={"Retry-After": in_a_minute})
                                     ) <= 60
    assert retry_after_seconds(httpx.Response(429)) is None
    rate_limited = classify_response(httpx.Response(429, headers={"Retry-After": "3"},
                                                    request=REQUEST))
    assert rate_limited == NotSent(error_class="http_429.rate_limited", retry_after_seconds=3.0)
