"""Malformed reports on a client-executed operation's claim are a 400 that writes nothing."""

from __future__ import annotations

import pytest

from ledger.models import Operation, OperationEvent
from tests.ledger.client_helpers import OP, claim, heartbeat, report

PROBLEM = "application/problem+json"
# One more than the largest token the database holds (a signed 64-bit column).
TOO_LARGE_TOKEN = 2**63


def events() -> list[tuple[str, str]]:
    return list(OperationEvent.objects.order_by("id").values_list("reason", "to_status"))


@pytest.mark.parametrize("status", ["succeeded", "failed", "unknown"])
def test_an_outcome_with_a_token_the_database_cannot_hold_is_a_400(api, status):
    # Such a token holds no claim, so the report used to be kept as evidence: an event row the
    # database refused (SQLite: OverflowError, PostgreSQL: bigint out of range), a 500.
    # Schemathesis's reports hide fencing_token, so it looked like a matter of `result` keys.
    claim(api)
    before = events()

    response = report(api, OP, fencing_token=TOO_LARGE_TOKEN, status=status,
                      error_class="card_declined", result={"\U0001f600\x1b": 1})

    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    assert "fencing_token" in response.json()["errors"]
    assert events() == before
    assert Operation.objects.get().status == Operation.Status.IN_FLIGHT


def test_a_heartbeat_with_a_token_the_database_cannot_hold_is_a_400(api):
    claim(api)
    before = events()
    lease = Operation.objects.get().lease_expires_at

    response = heartbeat(api, OP, TOO_LARGE_TOKEN)

    assert response.status_code == 400, response.content
    assert "fencing_token" in response.json()["errors"]
    assert events() == before
    assert Operation.objects.get().lease_expires_at == lease


def test_the_largest_token_the_database_holds_is_judged_not_refused(api):
    claim(api)

    response = report(api, OP, fencing_token=TOO_LARGE_TOKEN - 1, status="succeeded")

    assert response.status_code == 409, response.content  # a wrong token: kept as evidence


def test_a_failed_outcome_without_error_class_is_a_400_that_writes_nothing(api):
    resource = claim(api)
    before = events()

    response = report(api, OP, fencing_token=resource["claim"]["fencing_token"],
                      status="failed")

    assert response.status_code == 400, response.content
    assert "error_class" in response.json()["errors"]
    assert events() == before


@pytest.mark.parametrize("body", [
    {"fencing_token": "1", "status": "succeeded"},
    {"fencing_token": 1.0, "status": "succeeded"},
    {"fencing_token": True, "status": "succeeded"},
    {"fencing_token": 1, "status": "unknown", "error_class": 0},
    {"fencing_token": 1, "status": "succeeded", "provider_reference": 17},
])
def test_a_report_is_not_coerced_to_the_types_the_document_gives(api, body):
    # DRF's IntegerField takes "1" and 1.0, its CharField turns 0 into "0": the report was
    # applied although the document says integer and string (Schemathesis).
    claim(api)
    before = events()

    response = report(api, OP, **body)

    assert response.status_code == 400, response.content
    assert events() == before
    assert Operation.objects.get().status == Operation.Status.IN_FLIGHT


def test_a_nul_in_a_result_key_is_a_400_that_writes_nothing(api):
    # The document cannot say it (OpenAPI 3.0 has no propertyNames); the parser refuses it.
    resource = claim(api)
    before = events()

    response = report(api, OP, fencing_token=resource["claim"]["fencing_token"],
                      status="succeeded", result={"id\x00": "eff_1"})

    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    assert events() == before
    assert Operation.objects.get().status == Operation.Status.IN_FLIGHT
