"""The generic HTTP adapter's classification: the executor trusts it completely."""

from __future__ import annotations

import httpx
import pytest

from ledger.providers.base import Confirmed, Found, NotFound, NotSent, Rejected, Unknown
from ledger.providers.http import classify_response, classify_transport_error
from tests.conftest import adapter_named
from tests.ledger.factories import in_state

REQUEST = httpx.Request("POST", "http://provider.invalid/v1/effects/refund")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (httpx.ConnectError("refused", request=REQUEST), NotSent),
        (httpx.ConnectTimeout("slow connect", request=REQUEST), NotSent),
        (httpx.PoolTimeout("no connection", request=REQUEST), NotSent),
        (httpx.WriteTimeout("slow write", request=REQUEST), Unknown),
        (httpx.ReadTimeout("no answer", request=REQUEST), Unknown),
        (httpx.RemoteProtocolError("reset", request=REQUEST), Unknown),
        (httpx.ReadError("reset", request=REQUEST), Unknown),
        (httpx.WriteError("broken pipe", request=REQUEST), Unknown),
    ],
)
def test_transport_errors_are_not_sent_only_before_the_connection_exists(exc, expected):
    outcome = classify_transport_error(exc)
    assert isinstance(outcome, expected)
    assert outcome.error_class == f"transport.{type(exc).__name__}"


def response(status: int, body: dict | None = None, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body or {}, headers=headers, request=REQUEST)


@pytest.mark.parametrize(
    ("status", "body", "expected", "error_class"),
    [
        (402, {"error": {"type": "card_error", "code": "card_declined"}}, Rejected,
         "http_402.card_declined"),
        (400, {"error": {"type": "invalid_request_error"}}, Rejected,
         "http_400.invalid_request_error"),
        (404, {}, Rejected, "http_404.404"),
        (409, {"error": {"type": "idempotency_error", "code": "request_in_progress"}}, Unknown,
         "http_409.request_in_progress"),
        (422, {"error": {"type": "idempotency_error", "code": "idempotency_key_mismatch"}},
         Unknown, "http_422.idempotency_key_mismatch"),
        (429, {}, NotSent, "http_429.rate_limited"),
        (500, {"error": {"type": "api_error"}}, Unknown, "http_500.api_error"),
        (502, {}, Unknown, "http_502.502"),
        (503, {}, Unknown, "http_503.503"),
    ],
)
def test_responses_are_classified(status, body, expected, error_class):
    outcome = classify_response(response(status, body))
    assert isinstance(outcome, expected)
    assert outcome.error_class == error_class


def test_409_is_flagged_as_in_progress():
    outcome = classify_response(response(409, {"error": {"code": "request_in_progress"}}))
    assert isinstance(outcome, Unknown) and outcome.in_progress


def test_success_carries_the_result_and_the_replay_flag():
    outcome = classify_response(
        response(201, {"id": "eff_1", "status": "succeeded"}, **{"Idempotent-Replayed": "true"}))
    assert outcome == Confirmed(result={"id": "eff_1", "status": "succeeded"},
                                provider_request_id="eff_1", replayed=True)


def test_lookup_against_the_sandbox_finds_by_key_and_reports_absence(agent, sandbox):
    from ledger import executor
    from tests.conftest import refund_params

    submission = executor.submit(agent=agent, operation_id="wf-1:inv-1:refund-1:v1",
                                 tool_name="refund", params=refund_params())
    found = adapter_named("sandbox").lookup(submission.operation, timeout=2)
    assert isinstance(found, Found)
    assert found.fields["amount"] == 2500 and found.fields["reference"] == "wf-1:inv-1:refund-1:v1"
    assert found.provider_request_id == submission.operation.provider_request_id

    never_sent = in_state(agent, "unknown", "wf-1:inv-2:refund-1:v1")
    assert isinstance(adapter_named("sandbox").lookup(never_sent, timeout=2), NotFound)


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [
        (classify_transport_error(httpx.ReadTimeout("x", request=REQUEST)), "timeout_after_send"),
        (classify_transport_error(httpx.WriteTimeout("x", request=REQUEST)), "timeout_after_send"),
        (classify_transport_error(httpx.RemoteProtocolError("x", request=REQUEST)),
         "connection_reset"),
        (classify_response(response(500)), "ambiguous_5xx"),
        (classify_response(response(409, {"error": {"code": "request_in_progress"}})),
         "provider_in_progress"),
        (classify_response(response(422, {"error": {"type": "idempotency_error"}})),
         "key_reused"),
    ],
)
def test_unknown_outcomes_say_why_so_the_case_opens_with_the_right_reason(outcome, reason):
    assert isinstance(outcome, Unknown) and outcome.reason == reason


def test_a_provider_call_is_logged_once_by_the_connector_not_with_httpxs_full_url(
        api, sandbox, caplog):
    import logging

    from tests.conftest import submit_body

    caplog.set_level(logging.INFO)
    assert api.post("/api/v1/operations", submit_body(), format="json").status_code == 201

    sends = [r for r in caplog.records if r.getMessage() == "provider send"]
    assert len(sends) == 1 and sends[0].name == "ledger.providers.http"
    # httpx's own INFO line carries the whole URL (a lookup's query string too): kept quiet.
    assert not [r for r in caplog.records if r.name.startswith(("httpx", "httpcore"))]
