"""ledger.fast_path answers plain submits exactly as the DRF view does, and leaves everything
else to the view without having counted or written anything.

Each test sends the same kind of request twice: through a client whose middleware has the
fast path (the default) and through one built with LEDGER_API_FAST_PATH off (the view only),
then compares status, headers and body, and checks which of the two actually answered.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache
from django.db import OperationalError
from django.test import override_settings
from rest_framework.test import APIClient

from ledger import executor
from ledger.auth import FailedAuthenticationThrottle, agent_revoke
from ledger.models import Operation, OperationEvent
from tests.conftest import refund_params, submit_body

VARIABLE_HEADERS = {"Date", "X-Request-ID"}
# Per-operation values that differ between two fresh operations made for the comparison.
VOLATILE = {"operation_id", "url", "status_url", "params_hash", "provider_request_id", "result",
            "created_at", "updated_at", "sent_at", "resolved_at"}


def _client(token: str, *, fast: bool) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    with override_settings(LEDGER_API_FAST_PATH=fast):
        client.handler.load_middleware()  # the chain is built now, with or without it
    return client


@pytest.fixture
def pair(agent_and_token: tuple[Any, str]) -> tuple[APIClient, APIClient]:
    token = agent_and_token[1]
    return _client(token, fast=True), _client(token, fast=False)


def answered_by_fast_path(response: Any) -> bool:
    # The view's finalize_response gives the renderer its context (the view, the request);
    # the fast path renders without one.
    return "view" not in response.renderer_context


def headers(response: Any) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k not in VARIABLE_HEADERS}


def post(client: APIClient, body: Any, **extra: Any) -> Any:
    return client.post("/api/v1/operations", body, format="json", **extra)


def assert_same_answer(fast: Any, view: Any, *, normalise: bool = False) -> None:
    assert fast.status_code == view.status_code
    fast_headers, view_headers = headers(fast), headers(view)
    if normalise:
        for name in ("Location", "Content-Length"):  # carry the operation's own values
            fast_headers.pop(name, None), view_headers.pop(name, None)
    assert fast_headers == view_headers
    if normalise:  # same members in the same order, same values but the volatile ones
        fast_body, view_body = fast.json(), view.json()
        assert list(fast_body) == list(view_body)
        assert {k: v for k, v in fast_body.items() if k not in VOLATILE} == {
            k: v for k, v in view_body.items() if k not in VOLATILE}
    else:
        assert fast.content == view.content


# --- what the fast path answers itself ------------------------------------------------------

def test_a_replay_is_answered_byte_for_byte_as_the_view_answers_it(pair, sandbox):
    fast, view = pair
    assert post(view, submit_body()).status_code == 201

    from_fast, from_view = post(fast, submit_body()), post(view, submit_body())

    assert answered_by_fast_path(from_fast) and not answered_by_fast_path(from_view)
    assert from_fast.status_code == 200 and from_fast.headers["Idempotent-Replayed"] == "true"
    assert_same_answer(from_fast, from_view)
    assert sandbox.effect_counts() == {"wf-81:invoice-17:refund-1:v1": 1}


def test_a_fresh_action_is_answered_and_recorded_as_the_view_does_it(pair, sandbox):
    fast, view = pair
    from_fast = post(fast, submit_body("wf-1:inv-1:refund-1:v1"))
    from_view = post(view, submit_body("wf-2:inv-1:refund-1:v1"))

    assert answered_by_fast_path(from_fast) and from_fast.status_code == 201
    assert_same_answer(from_fast, from_view, normalise=True)
    transitions = [list(Operation.objects.get(operation_id=op).events.values_list(
        "from_status", "to_status", "reason")) for op in ("wf-1:inv-1:refund-1:v1",
                                                           "wf-2:inv-1:refund-1:v1")]
    assert transitions[0] == transitions[1]


def test_an_async_submit_gets_202_with_location_and_retry_after_from_either(pair, sandbox):
    fast, view = pair
    from_fast = post(fast, submit_body("wf-1:inv-1:refund-1:v1", execution="async"))
    from_view = post(view, submit_body("wf-2:inv-1:refund-1:v1", execution="async"))

    assert answered_by_fast_path(from_fast) and from_fast.status_code == 202
    assert from_fast.headers["Location"].endswith("/api/v1/operations/wf-1:inv-1:refund-1:v1")
    assert_same_answer(from_fast, from_view, normalise=True)


@pytest.mark.parametrize("second, expected", [
    (submit_body(params=refund_params(amount=9999)), 422),  # same ID, another intent
    (submit_body("wf-9:inv-9:refund-1:v1", params=refund_params(amount=-5)), 400),  # params
    (submit_body("wf-9:inv-9:email-1:v1", tool="no_such_tool"), 400),
])
def test_refusals_from_the_executor_read_the_same(pair, sandbox, second, expected):
    fast, view = pair
    post(view, submit_body())
    operations, events = Operation.objects.count(), OperationEvent.objects.count()

    from_fast, from_view = post(fast, second), post(view, second)

    assert answered_by_fast_path(from_fast) and from_fast.status_code == expected
    assert from_fast["Content-Type"] == "application/problem+json"
    assert_same_answer(from_fast, from_view)
    assert (Operation.objects.count(), OperationEvent.objects.count()) == (operations, events)


def test_a_tool_the_agent_may_not_use_is_403_from_either(make_agent, sandbox):
    _, token = make_agent("narrow", tools=["send_email"])
    fast, view = _client(token, fast=True), _client(token, fast=False)

    from_fast, from_view = post(fast, submit_body()), post(view, submit_body())

    assert answered_by_fast_path(from_fast) and from_fast.status_code == 403
    assert_same_answer(from_fast, from_view)
    assert not Operation.objects.exists()


def test_a_database_outage_during_the_submit_is_the_same_503(pair, monkeypatch):
    fast, view = pair

    def unavailable(**_: Any) -> None:
        raise OperationalError("connection refused")

    monkeypatch.setattr(executor, "submit", unavailable)
    from_fast, from_view = post(fast, submit_body()), post(view, submit_body())

    assert answered_by_fast_path(from_fast) and from_fast.status_code == 503
    assert from_fast.headers["Retry-After"]
    assert_same_answer(from_fast, from_view)


# --- what it leaves to the view ---------------------------------------------------------------

@pytest.mark.parametrize("body, extra, expected", [
    (submit_body(operation_id=" wf-1:inv-1:refund-1:v1"), {}, 400),  # whitespace in the ID
    (submit_body(execution="client"), {}, 202),  # client execution: the claim
    ({**submit_body(), "unknown_field": 1}, {}, 400),
    ("not an object", {}, 400),
    (submit_body(), {"HTTP_ACCEPT": "text/html"}, 406),
    (submit_body(), {"QUERY_STRING": "format=json"}, 201),
])
def test_anything_not_plain_goes_to_the_view(pair, sandbox, body, extra, expected):
    fast, _ = pair
    response = post(fast, body, **extra)
    assert response.status_code == expected
    assert not answered_by_fast_path(response)


def test_a_body_that_is_not_json_goes_to_the_view(pair):
    fast, _ = pair
    for content_type, expected in (("application/json", 400), ("text/plain", 415)):
        response = fast.post("/api/v1/operations", b'{"operation_id": ', content_type=content_type)
        assert response.status_code == expected and not answered_by_fast_path(response)
    assert not Operation.objects.exists()


def test_bad_credentials_are_answered_by_the_view_and_counted_once(pair, agent, sandbox):
    fast, _ = pair
    stranger = APIClient()
    with override_settings(LEDGER_API_FAST_PATH=True):
        stranger.handler.load_middleware()
    stranger.credentials(HTTP_AUTHORIZATION="Bearer al_00000000_nope")

    response = post(stranger, submit_body())

    assert response.status_code == 401 and not answered_by_fast_path(response)
    assert len(cache.get(FailedAuthenticationThrottle.cache_format % "127.0.0.1")) == 1
    agent_revoke(agent=agent)
    assert post(fast, submit_body()).status_code == 401  # a revoked token, at once
    assert not Operation.objects.exists()


def test_an_address_refused_for_failed_attempts_is_refused_even_with_a_good_token(
        pair, settings):
    fast, _ = pair
    settings.LEDGER_AUTH_FAILURE_RATE = "2/min"
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION="Bearer al_00000000_nope")
    for _ in range(2):
        assert post(stranger, submit_body()).status_code == 401

    response = post(fast, submit_body())

    assert response.status_code == 429 and not answered_by_fast_path(response)
    assert not Operation.objects.exists()


def test_the_agent_throttle_counts_each_request_once_whichever_path_answers_it(pair, sandbox):
    from ledger.auth import AgentRateThrottle

    fast, _ = pair
    original = AgentRateThrottle.THROTTLE_RATES
    AgentRateThrottle.THROTTLE_RATES = {**original, "agent": "3/min"}
    try:
        answers = [
            post(fast, submit_body(operation_id=" bad-id")),  # left to the view: counted there
            post(fast, submit_body()),  # answered here: counted here
            post(fast, submit_body()),  # a replay, answered here
            post(fast, submit_body()),  # the fourth in the window
        ]
    finally:
        AgentRateThrottle.THROTTLE_RATES = original
    assert [a.status_code for a in answers] == [400, 201, 200, 429]
    assert [answered_by_fast_path(a) for a in answers] == [False, True, True, False]
    assert answers[3].headers["Retry-After"]


def test_turned_off_every_submit_goes_through_the_view(agent_and_token, sandbox):
    view = _client(agent_and_token[1], fast=False)
    response = post(view, submit_body())
    assert response.status_code == 201 and not answered_by_fast_path(response)


def test_the_middleware_above_it_still_runs_first(agent_and_token, settings):
    # Last in the chain: an HTTPS redirect (LEDGER_PRODUCTION) happens before it answers.
    settings.SECURE_SSL_REDIRECT = True
    fast = _client(agent_and_token[1], fast=True)
    response = post(fast, submit_body())
    assert response.status_code == 301 and response["Location"].startswith("https://")
    assert not Operation.objects.exists()


def test_an_api_error_raised_during_the_submit_is_the_problem_the_view_would_send(
        pair, monkeypatch):
    from rest_framework.exceptions import Throttled

    fast, view = pair

    def busy(**_: Any) -> None:
        raise Throttled(wait=3)

    monkeypatch.setattr(executor, "submit", busy)
    from_fast, from_view = post(fast, submit_body()), post(view, submit_body())

    assert answered_by_fast_path(from_fast) and from_fast.status_code == 429
    assert_same_answer(from_fast, from_view)


def test_it_stands_aside_when_the_view_is_configured_otherwise(agent_and_token, sandbox,
                                                                 monkeypatch):
    # Another throttle on the view: the fast path would not reproduce it, so it does not load.
    from ledger.api import OperationSubmitApi
    from ledger.auth import AgentRateThrottle

    class AnotherThrottle(AgentRateThrottle):
        pass

    monkeypatch.setattr(OperationSubmitApi, "throttle_classes",
                        [AgentRateThrottle, AnotherThrottle])
    client = _client(agent_and_token[1], fast=True)
    response = post(client, submit_body())
    assert response.status_code == 201 and not answered_by_fast_path(response)
