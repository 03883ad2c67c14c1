"""The OpenAPI document matches what the API does; Schemathesis finds nothing against it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from ledger.identity import IDENTIFIER_PATTERN
from tests.conftest import submit_body

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def schema(django_db_blocker):
    from django.test import Client

    with django_db_blocker.unblock():
        return Client().get("/api/schema/?format=json").json()


def component(schema, ref):
    return schema["components"]["schemas"][ref.rsplit("/", 1)[1]]


@pytest.mark.parametrize(
    ("path", "method", "statuses"),
    [
        ("/api/v1/operations", "post", {"400", "401", "403", "413", "415", "422", "429", "503"}),
        ("/api/v1/operations/{operation_id}", "get", {"400", "401", "404", "429", "503"}),
        ("/api/v1/runs/{run_id}/operations", "get", {"400", "401", "429", "503"}),
    ],
)
def test_every_error_is_documented_as_problem_json(schema, path, method, statuses):
    responses = schema["paths"][path][method]["responses"]
    for status in statuses:
        content = responses[status]["content"]
        assert list(content) == [PROBLEM], status
        assert content[PROBLEM]["schema"] == {"$ref": "#/components/schemas/Problem"}
    assert responses["429"]["headers"]["Retry-After"]["required"] is True
    assert responses["503"]["headers"]["Retry-After"]["required"] is True
    assert "WWW-Authenticate" in responses["401"]["headers"]


def test_submission_headers_are_documented(schema):
    responses = schema["paths"]["/api/v1/operations"]["post"]["responses"]
    assert responses["200"]["headers"]["Idempotent-Replayed"]["schema"]["enum"] == ["true"]
    assert set(responses["202"]["headers"]) >= {"Location", "Retry-After"}
    assert "X-Request-ID" in responses["201"]["headers"]


def test_the_submission_body_carries_each_tools_constraints(schema):
    body = schema["paths"]["/api/v1/operations"]["post"]["requestBody"]["content"]
    variants = [component(schema, v["$ref"]) for v in body["application/json"]["schema"]["oneOf"]]
    by_tool = {v["properties"]["tool"]["enum"][0]: v for v in variants}
    assert set(by_tool) == {"refund", "send_email", "create_ticket"}
    refund = by_tool["refund"]["properties"]
    assert refund["params"]["additionalProperties"] is False
    amount = refund["params"]["properties"]["amount"]
    assert (amount["type"], amount["minimum"], amount["maximum"]) == ("integer", 1, 1_000_000_000)
    currency = re.compile(refund["params"]["properties"]["currency"]["pattern"])
    assert currency.fullmatch("EUR") and not currency.fullmatch("euro")
    # Intent strings refuse hidden characters; free text refuses NUL.
    payee = refund["params"]["properties"]["payee"]
    payee_patterns = [payee.get("pattern")] + [p["pattern"] for p in payee.get("allOf", [])]
    assert any(p and "\\u200b" in p for p in payee_patterns)
    assert "\\u0000" in refund["params"]["properties"]["memo"]["pattern"]
    # The validator's pattern, in ECMA spelling (\\x00 → \\u0000).
    assert refund["run_id"]["pattern"] == re.sub(
        r"\\x([0-9a-f]{2})", r"\\u00\1", IDENTIFIER_PATTERN)
    assert refund["operation_id"]["maxLength"] == 200


def body_validator(schema, component_name):
    """A JSON Schema validator for a request body component, its $refs resolved in the
    document (OpenAPI 3.0's schemas are close to Draft 4; no body here is null)."""
    return jsonschema.Draft4Validator(
        {"$ref": f"#/components/schemas/{component_name}", "components": schema["components"]})


def test_the_document_is_valid_openapi_3_0(schema):
    # A 3.1 type list and propertyNames on the outcome's result made it invalid: Schemathesis
    # reads 3.0 schemas as Draft 4 and ignored the key constraint.
    from drf_spectacular.validation import validate_schema

    assert schema["openapi"] == "3.0.3"
    validate_schema(schema)


def test_the_outcome_body_says_failed_needs_an_error_class(schema):
    # One flat object let Schemathesis send {"status": "failed"}, which the API refuses.
    request_body = schema["paths"]["/api/v1/operations/{operation_id}/outcome"]["post"][
        "requestBody"]["content"]["application/json"]["schema"]
    validator = body_validator(schema, request_body["$ref"].rsplit("/", 1)[1])

    assert not validator.is_valid({"fencing_token": 1, "status": "failed"})
    assert not validator.is_valid({"fencing_token": 1, "status": "failed", "error_class": ""})
    assert validator.is_valid({"fencing_token": 1, "status": "failed",
                               "error_class": "card_declined"})
    assert validator.is_valid({"fencing_token": 1, "status": "succeeded"})
    assert validator.is_valid({"fencing_token": 1, "status": "unknown", "error_class": ""})
    assert not validator.is_valid({"fencing_token": 1, "status": "succeeded", "extra": 1})


@pytest.mark.parametrize(("path", "rest"), [
    ("/api/v1/operations/{operation_id}/outcome", {"status": "succeeded"}),
    ("/api/v1/operations/{operation_id}/heartbeat", {}),
])
def test_the_fencing_token_is_bounded_by_what_the_database_holds(schema, path, rest):
    request_body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    validator = body_validator(schema, request_body["schema"]["$ref"].rsplit("/", 1)[1])
    assert validator.is_valid({"fencing_token": 2**63 - 1, **rest})
    assert not validator.is_valid({"fencing_token": 2**63, **rest})


def test_the_long_poll_wait_is_documented_as_0_to_30(schema):
    parameters = schema["paths"]["/api/v1/operations/{operation_id}"]["get"]["parameters"]
    wait = next(p for p in parameters if p["name"] == "wait")
    assert wait["schema"] == {"type": "integer", "minimum": 0, "maximum": 30}


def test_an_optional_param_may_be_null_as_documented(schema, api, sandbox):
    # Tool.validate takes null as "not given"; the catalogue's schema did not say so.
    body = schema["paths"]["/api/v1/operations"]["post"]["requestBody"]["content"]
    variants = [component(schema, v["$ref"]) for v in body["application/json"]["schema"]["oneOf"]]
    email = next(v for v in variants if v["properties"]["tool"]["enum"] == ["send_email"])
    properties = email["properties"]["params"]["properties"]
    assert properties["body"]["nullable"] is True
    assert "nullable" not in properties["to"]

    response = api.post("/api/v1/operations", submit_body(tool="send_email", params={
        "to": "a@example.com", "template": "welcome", "subject": "Hi", "body": None}),
        format="json")
    assert response.status_code == 201, response.content


def test_a_refusal_matches_the_problem_schema(api, schema, sandbox):
    problem_schema = schema["components"]["schemas"]["Problem"]
    answers = [
        api.post("/api/v1/operations", submit_body("no-colon"), format="json"),
        api.get("/api/v1/operations/a:b"),
        api.get("/api/v1/runs/r/operations?limit=0"),
    ]
    for response in answers:
        assert response["Content-Type"] == PROBLEM
        jsonschema.validate(response.json(), problem_schema)


@pytest.mark.skipif(
    os.environ.get("LEDGER_FUZZ") != "1",
    reason="fuzzing is its own CI step (bin/fuzz_api.py); LEDGER_FUZZ=1 runs it here too",
)
def test_schemathesis_finds_no_failures(tmp_path):
    """bin/fuzz_api.py (what CI runs with more examples): every check, no failures."""
    result = subprocess.run(
        [sys.executable, "bin/fuzz_api.py", "--max-examples", "10", "--time-limit", "300",
         "--seed", "11"],
        cwd=ROOT, capture_output=True, text=True, timeout=420,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "No issues found" in result.stdout
