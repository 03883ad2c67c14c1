"""The Stripe adapter, on the official SDK, against the sandbox's Stripe-compatible API (a real
process, no mocks). Its classification is what the executor and the reconciler trust."""

from __future__ import annotations

import logging

import httpx
import pytest
import stripe
from django.core.exceptions import ImproperlyConfigured

from ledger import executor
from ledger.models import Operation
from ledger.providers.base import (
    Confirmed,
    Found,
    NotFound,
    NotSent,
    Rejected,
    Unavailable,
    Unknown,
    UnknownReason,
)
from ledger.providers.stripe import (
    CAPABILITIES,
    classify_error,
    classify_refund,
    error_class_of,
    refund_fields,
)
from ledger.tools import get_tool
from tests.conftest import STRIPE_SMTP_TOOLS, adapter_named, refund_params
from tests.ledger.factories import prepared

OP = "wf-81:invoice-17:refund-1:v1"
S = Operation.Status
TIMEOUT = 1.0


@pytest.fixture
def adapter(stripe_smtp_tools):
    return adapter_named("stripe-sandbox")


@pytest.fixture
def stripe_refunds(settings):
    """New refunds go through the Stripe adapter."""
    settings.LEDGER_TOOLS_FILE = STRIPE_SMTP_TOOLS


def send(adapter, operation, key=None):
    return adapter.send(operation, key=key or operation.idempotency_key, timeout=TIMEOUT)


def intent_of(found: Found) -> dict:
    return {name: found.fields[name] for name in ("invoice", "amount", "currency", "payee")}


# --- send --------------------------------------------------------------------------------------


def test_send_creates_one_refund_carrying_our_reference_and_the_intent(agent, sandbox, adapter):
    operation = prepared(agent, OP)

    outcome = send(adapter, operation)

    assert isinstance(outcome, Confirmed) and not outcome.replayed
    refund = outcome.result
    assert outcome.provider_request_id == refund["id"] and refund["id"].startswith("re_")
    assert refund["object"] == "refund" and refund["status"] == "succeeded"
    assert (refund["amount"], refund["currency"]) == (2500, "eur")
    assert refund["payment_intent"] == "pi_invoice-17"
    assert refund["metadata"] == {"operation_id": OP, "invoice": "invoice-17",
                                  "payee": "cus_123", "memo": "Refund for the damaged parcel"}
    assert sandbox.effect_counts() == {OP: 1}


def test_same_key_resend_replays_the_original_refund_without_a_second_effect(
    agent, sandbox, adapter
):
    operation = prepared(agent, OP)
    first = send(adapter, operation)

    again = send(adapter, operation)

    assert isinstance(again, Confirmed) and again.replayed
    assert again.result == first.result
    assert sandbox.effect_counts() == {OP: 1}
    assert sandbox.request_counts()["by_reference"] == {OP: 2}
    # The key is what deduplicates: the same request under another key executes again.
    assert isinstance(send(adapter, operation, key="al_another_key"), Confirmed)
    assert sandbox.effect_counts() == {OP: 2}


def test_lost_response_is_unknown_and_the_same_key_recovers_the_refund(agent, sandbox, adapter):
    operation = prepared(agent, OP, memo="sandbox:lose-response")

    outcome = send(adapter, operation)

    assert outcome == Unknown(error_class="stripe.APIConnectionError.RemoteProtocolError",
                             reason=UnknownReason.CONNECTION_RESET)
    [refund] = sandbox.effects(reference=OP)
    replay = send(adapter, operation)
    assert isinstance(replay, Confirmed) and replay.replayed
    assert replay.provider_request_id == refund["id"]
    assert sandbox.effect_counts() == {OP: 1}


def test_timeout_after_commit_is_unknown_and_a_repeat_is_told_it_is_in_progress(
    agent, sandbox, adapter
):
    operation = prepared(agent, OP, memo="sandbox:timeout")

    outcome = send(adapter, operation)

    assert outcome == Unknown(error_class="stripe.APIConnectionError.ReadTimeout",
                             reason=UnknownReason.TIMEOUT_AFTER_SEND)
    assert sandbox.effect_counts() == {OP: 1}
    repeat = send(adapter, operation)
    assert isinstance(repeat, Unknown) and repeat.in_progress
    assert repeat.error_class == "stripe.APIError.http_409.request_in_progress"
    assert sandbox.effect_counts() == {OP: 1}


def test_drop_before_commit_is_unknown_with_nothing_executed(agent, sandbox, adapter):
    operation = prepared(agent, OP, memo="sandbox:drop-before-commit")

    outcome = send(adapter, operation)

    assert outcome == Unknown(error_class="stripe.APIConnectionError.RemoteProtocolError",
                             reason=UnknownReason.CONNECTION_RESET)
    assert sandbox.effect_counts() == {}
    # Nothing was stored under the key, so the same-key re-send executes, once.
    retry = send(adapter, operation)
    assert isinstance(retry, Confirmed) and not retry.replayed
    assert sandbox.effect_counts() == {OP: 1}


def test_decline_is_rejected_with_a_redacted_class_and_stays_rejected(agent, sandbox, adapter):
    operation = prepared(agent, OP, memo="sandbox:reject")

    outcome = send(adapter, operation)

    assert outcome == Rejected(error_class="stripe.CardError.card_declined",
                               detail={"code": "card_declined", "http_status": 402})
    assert sandbox.effect_counts() == {}
    assert send(adapter, operation) == outcome  # Stripe replays the stored decline


def test_refused_connection_is_not_sent(agent, sandbox, refused_provider, adapter):
    operation = prepared(agent, OP)

    outcome = send(adapter, operation)

    assert outcome == NotSent(error_class="stripe.APIConnectionError.ConnectError")
    assert sandbox.request_counts()["total"] == 0


def test_500_after_commit_is_unknown_and_stripe_replays_the_500(agent, sandbox, adapter):
    operation = prepared(agent, OP, memo="sandbox:500-after-commit")

    outcome = send(adapter, operation)

    assert outcome == Unknown(error_class="stripe.APIError.http_500",
                             reason=UnknownReason.AMBIGUOUS_5XX)
    assert sandbox.effect_counts() == {OP: 1}
    # Stripe v1 stores the 500 under the key: a same-key re-send cannot prove anything here,
    # only a lookup can.
    assert send(adapter, operation) == outcome
    found = adapter.lookup(operation, timeout=TIMEOUT)
    assert isinstance(found, Found) and found.status == "succeeded"
    assert sandbox.effect_counts() == {OP: 1}


def test_rate_limit_is_not_sent_and_the_next_send_executes_once(agent, sandbox, adapter):
    operation = prepared(agent, OP, memo="sandbox:rate-limit")

    outcome = send(adapter, operation)

    assert outcome == NotSent(error_class="stripe.RateLimitError.rate_limit")
    assert sandbox.effect_counts() == {}
    assert isinstance(send(adapter, operation), Confirmed)
    assert sandbox.effect_counts() == {OP: 1}


def test_key_reused_with_other_params_is_unknown_not_rejected(agent, sandbox, adapter):
    original = prepared(agent, OP)
    send(adapter, original)
    other = prepared(agent, "wf-81:invoice-17:refund-2:v1", amount=999)

    outcome = send(adapter, other, key=original.idempotency_key)

    assert outcome == Unknown(
        error_class="stripe.IdempotencyError.idempotency_key_mismatch",
        reason=UnknownReason.KEY_REUSED)
    assert sandbox.effect_counts() == {OP: 1}


def test_a_long_memo_is_shortened_to_what_stripe_stores_not_refused(agent, sandbox, adapter):
    operation = prepared(agent, OP, memo="m" * 1000)

    outcome = send(adapter, operation)

    assert isinstance(outcome, Confirmed)
    assert outcome.result["metadata"]["memo"] == "m" * 500


def test_the_api_key_never_reaches_the_logs(agent, sandbox, caplog, settings, monkeypatch):
    monkeypatch.setenv("STRIPE_API_KEY", "sk_test_do_not_log_me")
    settings.LEDGER_TOOLS_FILE = STRIPE_SMTP_TOOLS  # read with the key above
    adapter = adapter_named("stripe-sandbox")
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="stripe")
    operation = prepared(agent, OP, memo="sandbox:reject")

    send(adapter, operation)
    adapter.lookup(operation, timeout=TIMEOUT)

    assert caplog.records
    assert "sk_test_do_not_log_me" not in caplog.text


# --- lookup ------------------------------------------------------------------------------------


def test_lookup_by_refund_id_is_consistent_despite_index_lag(
    agent, sandbox, adapter, stripe_refunds
):
    sandbox.configure(index_lag_seconds=60)
    operation = executor.submit(agent=agent, operation_id=OP, tool_name="refund",
                                params=refund_params()).operation
    assert operation.provider_request_id.startswith("re_")

    found = adapter.lookup(operation, timeout=TIMEOUT)

    assert isinstance(found, Found)
    assert found.provider_request_id == operation.provider_request_id
    assert found.status == "succeeded" and found.matches == 1
    assert intent_of(found) == operation.intent_params
    assert found.fields["reference"] == OP


def test_lookup_by_list_finds_the_refund_once_the_index_caught_up(agent, sandbox, adapter):
    sandbox.configure(index_lag_seconds=30)
    operation = prepared(agent, OP, memo="sandbox:lose-response")
    send(adapter, operation)  # executed, but we never learned the refund's id
    assert operation.provider_request_id == ""

    assert adapter.lookup(operation, timeout=TIMEOUT) == NotFound()
    sandbox.advance_clock(31)
    found = adapter.lookup(operation, timeout=TIMEOUT)

    assert isinstance(found, Found)
    assert found.provider_request_id == sandbox.effects(reference=OP)[0]["id"]
    assert intent_of(found) == operation.intent_params
    assert found.fields["reference"] == OP and found.matches == 1


def test_lookup_by_list_ignores_other_refunds_of_the_same_payment(agent, sandbox, adapter):
    ours = prepared(agent, OP)
    theirs = prepared(agent, "wf-81:invoice-17:refund-2:v1", amount=100)
    send(adapter, theirs)
    send(adapter, ours)
    send(adapter, theirs, key="al_a_second_refund")

    found = adapter.lookup(ours, timeout=TIMEOUT)

    assert isinstance(found, Found) and found.matches == 1
    assert found.fields["amount"] == 2500 and found.fields["reference"] == OP
    assert adapter.lookup(theirs, timeout=TIMEOUT).matches == 2


def test_lookup_of_a_refund_never_made_is_not_found_but_not_authoritative(
    agent, sandbox, adapter
):
    operation = prepared(agent, OP)

    assert adapter.lookup(operation, timeout=TIMEOUT) == NotFound()
    # A list can lag behind a create: the reconciler must escalate rather than fail it.
    assert adapter.capabilities.authoritative_absence is False


def test_lookup_when_the_provider_is_unreachable_is_unavailable(agent, refused_provider, adapter):
    operation = prepared(agent, OP)

    outcome = adapter.lookup(operation, timeout=TIMEOUT)

    assert outcome == Unavailable(error_class="stripe.APIConnectionError.ConnectError")


# --- through the executor ----------------------------------------------------------------------


def test_submit_through_the_stripe_provider_succeeds_with_one_effect(
    agent, sandbox, stripe_refunds
):
    submission = executor.submit(agent=agent, operation_id=OP, tool_name="refund",
                                 params=refund_params(), run_id="run-1")

    operation = Operation.objects.get(pk=submission.operation.pk)
    assert operation.status == S.SUCCEEDED and operation.provider == "stripe-sandbox"
    assert operation.provider_request_id == operation.result["id"]
    assert operation.result["metadata"]["operation_id"] == OP
    assert sandbox.effect_counts() == {OP: 1}
    replay = executor.submit(agent=agent, operation_id=OP, tool_name="refund",
                             params=refund_params(), run_id="run-1")
    assert replay.disposition is executor.Disposition.REPLAYED
    assert sandbox.effect_counts() == {OP: 1}


def test_refused_then_resubmitted_sends_the_stored_key_and_executes_once(
    agent, sandbox, sandbox_server, refused_provider, settings, stripe_refunds, adapter
):
    first = executor.submit(agent=agent, operation_id=OP, tool_name="refund",
                            params=refund_params())
    assert first.operation.status == S.PREPARED
    assert first.operation.error_class == "stripe.APIConnectionError.ConnectError"

    settings.SANDBOX_URL = sandbox_server.url
    operation = executor.submit(agent=agent, operation_id=OP, tool_name="refund",
                                params=refund_params()).operation

    assert operation.status == S.SUCCEEDED
    # The executor sent the operation's stored key: a send under it replays that refund.
    replay = send(adapter, operation)
    assert replay.replayed and replay.provider_request_id == operation.provider_request_id
    assert sandbox.effect_counts() == {OP: 1}


def test_lost_response_through_the_executor_ends_unknown_with_the_effect(
    agent, sandbox, stripe_refunds
):
    operation = executor.submit(agent=agent, operation_id=OP, tool_name="refund",
                                params=refund_params(memo="sandbox:lose-response")).operation

    assert operation.status == S.UNKNOWN
    assert operation.error_class == "stripe.APIConnectionError.RemoteProtocolError"
    assert sandbox.effect_counts() == {OP: 1}


def test_decline_through_the_executor_ends_failed(agent, sandbox, stripe_refunds):
    operation = executor.submit(agent=agent, operation_id=OP, tool_name="refund",
                                params=refund_params(memo="sandbox:reject")).operation

    assert operation.status == S.FAILED
    assert operation.error_class == "stripe.CardError.card_declined"


# --- the provider setting ----------------------------------------------------------------------


def test_the_catalogue_chooses_the_provider_and_old_versions_keep_theirs(settings):
    assert get_tool("refund").provider == "sandbox"
    settings.LEDGER_TOOLS_FILE = STRIPE_SMTP_TOOLS
    assert (get_tool("refund").version, get_tool("refund").provider) == (2, "stripe-sandbox")
    assert get_tool("refund", version=1).provider == "sandbox"
    assert get_tool("create_ticket").provider == "sandbox-nokeys"


def test_without_its_api_key_the_stripe_catalogue_is_refused_before_anything_is_written(
    agent, settings, monkeypatch
):
    monkeypatch.delenv("STRIPE_API_KEY")
    settings.LEDGER_TOOLS_FILE = STRIPE_SMTP_TOOLS

    with pytest.raises(ImproperlyConfigured, match="STRIPE_API_KEY is not set"):
        executor.submit(agent=agent, operation_id=OP, tool_name="refund", params=refund_params())

    assert not Operation.objects.exists()


# --- classification (pure) ---------------------------------------------------------------------

PERSONAL = "Ann Example, card 4242, ann@example.com"
REQUEST = httpx.Request("POST", "http://provider.invalid/v1/refunds")


def error(cls, status, error_type, code=None):
    body = {"error": {"type": error_type, "message": PERSONAL, **({"code": code} if code else {})}}
    if cls in (stripe.CardError, stripe.InvalidRequestError):
        return cls(PERSONAL, None, code, "{}", status, body, {})
    return cls(PERSONAL, "{}", status, body, {})


def connection_error(cause):
    try:
        raise stripe.APIConnectionError(PERSONAL) from cause
    except stripe.APIConnectionError as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "expected", "error_class"),
    [
        (error(stripe.CardError, 402, "card_error", "card_declined"), Rejected,
         "stripe.CardError.card_declined"),
        (error(stripe.InvalidRequestError, 400, "invalid_request_error", "parameter_missing"),
         Rejected, "stripe.InvalidRequestError.parameter_missing"),
        (error(stripe.InvalidRequestError, 404, "invalid_request_error", "resource_missing"),
         Rejected, "stripe.InvalidRequestError.resource_missing"),
        (error(stripe.AuthenticationError, 401, "invalid_request_error"), Rejected,
         "stripe.AuthenticationError"),
        (error(stripe.PermissionError, 403, "invalid_request_error"), Rejected,
         "stripe.PermissionError"),
        (error(stripe.IdempotencyError, 400, "idempotency_error", "idempotency_key_mismatch"),
         Unknown, "stripe.IdempotencyError.idempotency_key_mismatch"),
        (error(stripe.APIError, 409, "idempotency_error", "idempotency_key_in_use"), Unknown,
         "stripe.APIError.http_409.idempotency_key_in_use"),
        (error(stripe.RateLimitError, 429, "invalid_request_error", "rate_limit"), NotSent,
         "stripe.RateLimitError.rate_limit"),
        (error(stripe.APIError, 500, "api_error"), Unknown, "stripe.APIError.http_500"),
        (error(stripe.APIError, 502, "api_error"), Unknown, "stripe.APIError.http_502"),
        (connection_error(httpx.ConnectError("refused", request=REQUEST)), NotSent,
         "stripe.APIConnectionError.ConnectError"),
        (connection_error(httpx.ConnectTimeout("slow", request=REQUEST)), NotSent,
         "stripe.APIConnectionError.ConnectTimeout"),
        (connection_error(httpx.PoolTimeout("busy", request=REQUEST)), NotSent,
         "stripe.APIConnectionError.PoolTimeout"),
        (connection_error(httpx.WriteTimeout("slow", request=REQUEST)), Unknown,
         "stripe.APIConnectionError.WriteTimeout"),
        (connection_error(httpx.ReadTimeout("late", request=REQUEST)), Unknown,
         "stripe.APIConnectionError.ReadTimeout"),
        (connection_error(httpx.RemoteProtocolError("reset", request=REQUEST)), Unknown,
         "stripe.APIConnectionError.RemoteProtocolError"),
        (connection_error(None), Unknown, "stripe.APIConnectionError"),
    ],
)
def test_sdk_errors_are_classified_with_redacted_classes(exc, expected, error_class):
    outcome = classify_error(exc)

    assert isinstance(outcome, expected)
    assert outcome.error_class == error_class == error_class_of(exc)
    assert "Ann" not in repr(outcome) and "4242" not in repr(outcome)


def test_a_409_means_stripe_is_still_executing_the_key():
    exc = error(stripe.APIError, 409, "idempotency_error", "request_in_progress")
    outcome = classify_error(exc)
    assert isinstance(outcome, Unknown) and outcome.in_progress


def test_an_untrusted_error_code_is_not_copied_into_the_record():
    exc = error(stripe.CardError, 402, "card_error", "Ann's card 4242")
    assert classify_error(exc).error_class == "stripe.CardError.unrecognised"


@pytest.mark.parametrize("status", ["failed", "canceled"])
def test_a_refund_created_as_failed_moved_no_money(status):
    outcome = classify_refund({"id": "re_1", "status": status}, replayed=False)
    assert outcome == Rejected(error_class=f"stripe.Refund.{status}", detail={"refund": "re_1"})


def test_found_fields_count_the_invoice_only_on_its_own_payment():
    refund = {"amount": 2500, "currency": "eur", "payment_intent": "pi_invoice-99",
              "metadata": {"invoice": "invoice-17", "payee": "cus_123", "operation_id": OP}}

    fields = refund_fields(refund)

    assert fields["invoice"] is None  # the reconciler sees a difference and escalates
    assert fields["currency"] == "EUR" and fields["reference"] == OP
    assert refund_fields(refund | {"payment_intent": "pi_invoice-17"})["invoice"] == "invoice-17"


def test_capabilities_are_stripes():
    assert CAPABILITIES.honours_idempotency_keys
    assert CAPABILITIES.key_retention_seconds == 24 * 3600
    assert CAPABILITIES.lookup_by_request_id and CAPABILITIES.lookup_by_reference
    assert not CAPABILITIES.lookup_by_key
    assert not CAPABILITIES.authoritative_absence
