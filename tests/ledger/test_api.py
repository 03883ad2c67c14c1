"""Every status code of the agents' API, and that refusals write nothing."""

from __future__ import annotations

import json

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from ledger.auth import agent_revoke
from ledger.models import AgentCredential, Operation, OperationEvent
from tests.conftest import refund_params, submit_body
from tests.ledger.factories import in_flight, in_state

OP = "wf-81:invoice-17:refund-1:v1"
PROBLEM = "application/problem+json"


def assert_nothing_written():
    assert Operation.objects.count() == 0
    assert OperationEvent.objects.count() == 0


def post(client: APIClient, body: object, **extra: object):
    return client.post("/api/v1/operations", body, format="json", **extra)


def test_fresh_operation_returns_201_with_the_resource(api, sandbox):
    response = post(api, submit_body())

    assert response.status_code == 201
    body = response.json()
    assert body["operation_id"] == OP and body["status"] == "succeeded"
    assert body["customer_status"] == "completed"
    assert body["provider_request_id"].startswith("eff_")
    assert body["value"] == {"amount": 2500, "currency": "EUR"}
    assert body["status_url"].startswith("http://testserver/status/")
    assert "do not submit it again" in body["guidance"]
    operation = Operation.objects.get(operation_id=OP)
    assert operation.status == "succeeded" and operation.attempts == 1
    assert operation.tool_call_ids == ["call_abc"]
    assert list(operation.events.values_list("from_status", "to_status")) == [
        ("", "prepared"), ("prepared", "in_flight"), ("in_flight", "succeeded")]
    assert sandbox.effect_counts() == {OP: 1}


def test_replay_returns_stored_result_without_sending(api, sandbox):
    first = post(api, submit_body()).json()
    requests_before = sandbox.request_counts()["total"]

    response = post(api, submit_body(tool_call_id="call_regenerated"))

    assert response.status_code == 200
    assert response.headers["Idempotent-Replayed"] == "true"
    assert response.json()["result"] == first["result"]
    assert sandbox.request_counts()["total"] == requests_before
    assert sandbox.effect_counts() == {OP: 1}
    assert Operation.objects.get().tool_call_ids == ["call_abc", "call_regenerated"]


def test_replay_with_a_reworded_memo_is_still_a_replay(api, sandbox):
    post(api, submit_body())
    response = post(api, submit_body(params=refund_params(memo="Totally different words")))
    assert response.status_code == 200
    assert sandbox.effect_counts() == {OP: 1}


def test_changed_intent_gets_422_with_the_differing_fields_and_changes_nothing(api, sandbox):
    post(api, submit_body())
    before = Operation.objects.values().get()
    events = OperationEvent.objects.count()

    response = post(api, submit_body(params=refund_params(amount=9999, currency="USD")))

    assert response.status_code == 422
    assert response["Content-Type"] == PROBLEM
    assert response.json()["differences"] == {
        "amount": {"stored": 2500, "submitted": 9999},
        "currency": {"stored": "EUR", "submitted": "USD"},
    }
    assert Operation.objects.values().get() == before
    assert OperationEvent.objects.count() == events
    assert sandbox.effect_counts() == {OP: 1}


def test_another_agents_operation_id_reveals_nothing_it_is_a_new_operation(
    api, second_agent_api, sandbox
):
    # Operation IDs are unique per namespace (tests/trust/test_namespaces.py has the rest).
    post(api, submit_body())
    response = post(second_agent_api, submit_body(params=refund_params(payee="cus_999")))
    assert response.status_code == 201
    assert "already used" not in response.content.decode()
    assert "cus_123" not in response.content.decode()


def test_unknown_outcome_returns_202_with_location_and_retry_after(api, sandbox):
    response = post(api, submit_body(params=refund_params(memo="sandbox:lose-response")))

    assert response.status_code == 202
    assert response["Location"] == f"http://testserver/api/v1/operations/{OP}"
    assert int(response["Retry-After"]) > 0
    body = response.json()
    assert body["status"] == "unknown" and body["customer_status"] == "not_yet_confirmed"
    assert body["guidance"].startswith("Outcome unknown: do not retry with a new operation ID")
    assert body["reconciliation"]["state"] in {"checking", "awaiting_review"}


def test_resubmitting_an_unknown_operation_never_sends_again(api, sandbox):
    post(api, submit_body(params=refund_params(memo="sandbox:lose-response")))
    requests_before = sandbox.request_counts()["total"]

    response = post(api, submit_body(params=refund_params(memo="sandbox:lose-response")))

    assert response.status_code == 202
    assert sandbox.request_counts()["total"] == requests_before
    assert sandbox.effect_counts() == {OP: 1}


def test_in_flight_with_live_lease_returns_202_and_does_not_send(api, agent, sandbox):
    in_flight(agent, OP, amount=2500)
    response = post(api, submit_body())
    assert response.status_code == 202
    assert response.json()["status"] == "in_flight"
    assert sandbox.request_counts()["total"] == 0


def test_rejected_operation_returns_201_failed_and_replays_the_failure(api, sandbox):
    response = post(api, submit_body(params=refund_params(memo="sandbox:reject")))
    assert response.status_code == 201
    assert response.json()["status"] == "failed"
    assert response.json()["error_class"] == "http_402.sandbox_rejected"
    replay = post(api, submit_body(params=refund_params(memo="sandbox:reject")))
    assert replay.status_code == 200 and replay.json()["status"] == "failed"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (submit_body(operation_id="no-colon"), "operation_id"),
        (submit_body(operation_id="a:b c"), "operation_id"),
        (submit_body(tool="transfer_funds"), "tool"),
        (submit_body(params=refund_params(amount=25.0)), "params.amount"),
        (submit_body(params=refund_params(amount="2500")), "params.amount"),
        (submit_body(params=refund_params(currency="euro")), "params.currency"),
        (submit_body(params={"invoice": "i"}), "params.amount"),
        (submit_body(params=refund_params(surprise=1)), "params.surprise"),
        ({"tool": "refund", "params": refund_params()}, "operation_id"),
        (submit_body(params=[1, 2]), "params"),
    ],
)
def test_invalid_body_gets_400_with_field_errors_and_writes_nothing(api, sandbox, body, field):
    response = post(api, body)

    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    assert field in json.dumps(response.json()["errors"])
    assert_nothing_written()
    assert sandbox.request_counts()["total"] == 0


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b'{"amount": NaN}', b'{"x": Infinity}', b"\xff\xfe", b"[]", b""],
)
def test_malformed_json_gets_400_and_writes_nothing(api, raw):
    response = api.generic("POST", "/api/v1/operations", raw, content_type="application/json")
    assert response.status_code == 400
    assert response["Content-Type"] == PROBLEM
    assert_nothing_written()


def test_oversized_body_is_refused_and_writes_nothing(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    body = submit_body(params=refund_params(memo="x" * 2000))
    response = post(api, body)
    assert response.status_code == 413
    assert_nothing_written()


@pytest.mark.parametrize("header", [None, "Bearer al_deadbeef_nope", "Token abc", "Bearer "])
def test_missing_or_bad_credentials_get_401_and_write_nothing(db, header):
    client = APIClient()
    extra = {"HTTP_AUTHORIZATION": header} if header else {}
    response = post(client, submit_body(), **extra)
    assert response.status_code == 401
    assert response["Content-Type"] == PROBLEM
    assert "Bearer" in response["WWW-Authenticate"]
    assert_nothing_written()


def test_revoked_credential_gets_401(api, agent):
    agent_revoke(agent=agent)
    assert post(api, submit_body()).status_code == 401
    assert_nothing_written()


def test_tool_not_allowed_gets_403_and_writes_nothing(make_agent, sandbox):
    _, token = make_agent("mailer", tools=("send_email",))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = post(client, submit_body())
    assert response.status_code == 403
    assert response["Content-Type"] == PROBLEM
    assert_nothing_written()


def test_throttled_agent_gets_429(api, settings, sandbox):
    cache.clear()
    rates = dict(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"])
    from ledger.auth import AgentRateThrottle

    original = AgentRateThrottle.THROTTLE_RATES
    AgentRateThrottle.THROTTLE_RATES = rates | {"agent": "2/min"}
    try:
        codes = [api.get(f"/api/v1/operations/{OP}").status_code for _ in range(3)]
    finally:
        AgentRateThrottle.THROTTLE_RATES = original
        cache.clear()
    assert codes[:2] == [404, 404]
    assert codes[2] == 429


def test_get_operation_returns_the_resource(api, sandbox):
    post(api, submit_body())
    response = api.get(f"/api/v1/operations/{OP}")
    assert response.status_code == 200
    assert response.json()["status"] == "succeeded"


def test_get_another_agents_operation_is_404(api, second_agent_api, sandbox):
    post(api, submit_body())
    response = second_agent_api.get(f"/api/v1/operations/{OP}")
    assert response.status_code == 404
    assert response["Content-Type"] == PROBLEM


def test_run_lists_operations_in_order_with_the_first_unresolved(api, sandbox):
    post(api, submit_body("wf-9:inv-1:refund-1:v1", run_id="run-9"))
    post(api, submit_body("wf-9:inv-2:refund-1:v1", run_id="run-9",
                          params=refund_params(invoice="inv-2", memo="sandbox:lose-response")))
    post(api, submit_body("wf-9:inv-3:refund-1:v1", run_id="run-9",
                          params=refund_params(invoice="inv-3")))

    body = api.get("/api/v1/runs/run-9/operations").json()

    assert [op["operation_id"] for op in body["operations"]] == [
        "wf-9:inv-1:refund-1:v1", "wf-9:inv-2:refund-1:v1", "wf-9:inv-3:refund-1:v1"]
    assert body["first_unresolved"]["operation_id"] == "wf-9:inv-2:refund-1:v1"


def test_run_of_another_agent_is_empty(api, second_agent_api, sandbox):
    post(api, submit_body())
    body = second_agent_api.get("/api/v1/runs/run-81/operations").json()
    assert body["operations"] == [] and body["first_unresolved"] is None


def test_openapi_schema_and_docs_are_published_without_a_cdn(client):
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/operations" in schema.content
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    content = docs.content.decode().lower()
    assert "cdn" not in content and "googleapis" not in content and "https://" not in content
    assert "/static/drf_spectacular_sidecar/redoc/" in content
    assert "nonce-" in docs["Content-Security-Policy"]


def test_failed_terminal_states_are_never_reported_while_unknown(api, sandbox):
    body = post(api, submit_body(params=refund_params(memo="sandbox:500-after-commit"))).json()
    assert body["status"] == "unknown"
    assert sandbox.effect_counts() == {OP: 1}


def test_credentials_are_stored_hashed(agent_and_token):
    agent, raw = agent_and_token
    stored = AgentCredential.objects.get(pk=agent.pk)
    assert raw not in (stored.token_hash, stored.token_prefix)
    assert raw.startswith(f"al_{stored.token_prefix}_")


def test_state_after_refused_connection_is_prepared_with_guidance(api, refused_provider):
    response = post(api, submit_body())
    assert response.status_code == 202
    assert response.json()["status"] == "prepared"
    assert "safe to submit the same request again" in response.json()["guidance"]


@pytest.mark.parametrize("status", ["succeeded", "failed"])
def test_terminal_rows_made_by_transitions_replay(api, agent, status, sandbox):
    in_state(agent, status, OP)
    response = post(api, submit_body())
    assert response.status_code == 200
    assert response.json()["status"] == status


def test_an_api_answer_carries_the_policy_djangos_csp_middleware_builds_without_a_nonce(
        api, sandbox, settings):
    from django.utils.csp import build_policy

    first = post(api, submit_body())
    replay = post(api, submit_body())
    expected = build_policy(settings.SECURE_CSP, None)
    assert first["Content-Security-Policy"] == replay["Content-Security-Policy"] == expected
    assert "nonce-" not in expected and "script-src 'self'" in expected
    settings.SECURE_CSP = {"default-src": ["'none'"]}  # another configuration, another policy
    assert post(api, submit_body())["Content-Security-Policy"] == "default-src 'none'"
