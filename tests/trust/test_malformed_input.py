"""Malformed input is a 4xx that writes nothing, never a 500; a 5xx is problem+json."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from ledger.models import Operation, OperationEvent
from tests.conftest import refund_params, submit_body

PROBLEM = "application/problem+json"


def assert_nothing_written() -> None:
    assert Operation.objects.count() == 0
    assert OperationEvent.objects.count() == 0


def post_raw(api, raw: bytes):
    return api.generic("POST", "/api/v1/operations", raw, content_type="application/json")


def test_json_nested_twenty_thousand_deep_is_a_400(api, sandbox):
    raw = b'{"operation_id": "a:b", "tool": "refund", "params": {"memo": ' + (
        b"[" * 20_000) + (b"]" * 20_000) + b"}}"

    response = post_raw(api, raw)

    assert response.status_code == 400
    assert response["Content-Type"] == PROBLEM
    assert "nested" in response.json()["detail"]
    assert_nothing_written()


def test_moderately_deep_params_are_a_400_too(api, sandbox):
    memo: object = "x"
    for _ in range(40):
        memo = [memo]
    response = api.post("/api/v1/operations", submit_body(params=refund_params(memo=memo)),
                        format="json")
    assert response.status_code == 400
    assert_nothing_written()


@pytest.mark.parametrize(
    ("tool", "field", "escaped"),
    [
        ("refund", "payee", "cus\\u0000123"),
        ("refund", "memo", "a\\u0000b"),
        ("refund", "payee", "cus\\ud800"),
        ("refund", "memo", "\\udfff"),
        ("send_email", "to", "a\\u0000@example.com"),
        ("send_email", "subject", "Hello \\ud800"),
    ],
)
def test_nul_or_lone_surrogate_in_params_is_a_400(api, sandbox, tool, field, escaped):
    params = refund_params() if tool == "refund" else {
        "to": "a@example.com", "template": "welcome", "subject": "Hi"}
    body = json.dumps(submit_body(tool=tool, params=params | {field: "PLACEHOLDER"}))
    raw = body.replace("PLACEHOLDER", escaped).encode()

    response = post_raw(api, raw)

    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    assert field in response.json()["detail"]
    assert_nothing_written()
    assert sandbox.request_counts()["total"] == 0


@pytest.mark.parametrize("field", ["operation_id", "run_id", "customer_ref"])
def test_nul_or_lone_surrogate_in_identifiers_is_a_400(api, sandbox, field):
    body = json.dumps(submit_body(**{field: "PLACEHOLDER"}))
    for escaped in ("a:b\\u0000c", "a:b\\ud800"):
        response = post_raw(api, body.replace("PLACEHOLDER", escaped).encode())
        assert response.status_code == 400, response.content
    assert_nothing_written()


@pytest.mark.parametrize(
    "path",
    ["/api/v1/operations/a:b%00c", "/api/v1/runs/r%00/operations",
     "/api/v1/operations/a:b%1bc"],
)
def test_a_nul_in_an_api_path_is_a_404_problem(api, path):
    response = api.get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == PROBLEM
    assert response.json()["code"] == "not_found"


def test_a_nul_in_a_status_page_path_is_a_404(db):
    response = Client().get("/status/a%00b/")
    assert response.status_code == 404


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("payee", "cus_\u200b123"),  # zero-width space
        ("payee", "cus_\u202e321"),  # right-to-left override
        ("payee", "cus_\u2066123\u2069"),  # isolate
        ("invoice", "invoice\u00ad17"),  # soft hyphen (also refused by the invoice pattern)
        ("payee", "cus_123\ufeff"),  # BOM
    ],
)
def test_invisible_or_bidi_characters_in_intent_fields_are_refused(api, sandbox, field, value):
    response = api.post("/api/v1/operations",
                        submit_body(params=refund_params(**{field: value})), format="json")

    assert response.status_code == 400, response.content
    assert f"params.{field}" in response.json()["errors"]
    assert_nothing_written()


def test_invisible_characters_in_free_text_are_kept(api, sandbox):
    response = api.post("/api/v1/operations",
                        submit_body(params=refund_params(memo="Zoë\u200d👍 thanks")),
                        format="json")
    assert response.status_code == 201
    assert Operation.objects.get().params["memo"] == "Zoë\u200d👍 thanks"


def test_an_unexpected_error_in_the_api_is_problem_json_with_guidance(api, monkeypatch):
    from ledger import executor

    def explode(**kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(executor, "submit", explode)
    api.raise_request_exception = False

    response = api.post("/api/v1/operations", submit_body(), format="json")

    assert response.status_code == 500
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    assert body["status"] == 500 and "new operation ID" in body["detail"]
    assert "boom" not in response.content.decode()


def test_an_unknown_top_level_field_is_refused_not_dropped(api, sandbox):
    response = api.post("/api/v1/operations", submit_body(customerRef="ref-1"), format="json")
    assert response.status_code == 400
    assert "customerRef" in response.json()["errors"]
    assert_nothing_written()


@pytest.mark.parametrize("field", ["operation_id", "tool", "run_id", "tool_call_id",
                                   "customer_ref"])
def test_a_number_where_a_string_belongs_is_refused_not_coerced(api, sandbox, field):
    response = api.post("/api/v1/operations", submit_body(**{field: 0}), format="json")
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert_nothing_written()


def test_a_param_over_its_max_length_is_a_400_not_a_500(api, sandbox):
    # Every error but `enum` built "must be one of …" from the limit too, and a number is no
    # list: a 20 001-character e-mail body was a 500 (Schemathesis).
    params = {"to": "a@example.com", "template": "welcome", "subject": "Hi", "body": "0" * 20_001}

    response = api.post("/api/v1/operations", submit_body(tool="send_email", params=params),
                        format="json")

    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    assert response.json()["errors"]["params.body"] == "must be at most 20000 characters"
    assert_nothing_written()
    assert sandbox.request_counts()["total"] == 0


@pytest.mark.parametrize("wait", ["\u00b2", "\u0663", "9" * 5_000, "31", "-1"])
def test_a_wait_that_is_not_0_to_30_ascii_seconds_is_a_400(api, wait):
    # "²".isdigit() is true and int("²") raises; int() of 5 000 digits raises too.
    response = api.get(f"/api/v1/operations/wf-1:a?wait={wait}")

    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    assert "wait" in response.json()["errors"]
    assert_nothing_written()
