"""Identifiers are taken exactly as sent: a value that would have to be trimmed or that hides a
control or formatting character is refused with a 400 that writes nothing."""

from __future__ import annotations

import json

import pytest

from ledger import executor
from ledger.models import Operation, OperationEvent
from tests.conftest import submit_body

PROBLEM = "application/problem+json"


def assert_nothing_written() -> None:
    assert Operation.objects.count() == 0
    assert OperationEvent.objects.count() == 0


@pytest.mark.parametrize(
    "operation_id",
    [" a:b", "a:b ", " a:b\n", "a:b\n", "\ta:b", "a:b\x00", "a:b\r\n"],
)
def test_operation_id_with_whitespace_or_controls_is_refused_not_trimmed(
    api, sandbox, operation_id
):
    response = api.post("/api/v1/operations", submit_body(operation_id), format="json")

    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    assert "operation_id" in json.dumps(response.json())  # errors, or the parser's detail
    assert_nothing_written()
    assert sandbox.request_counts()["total"] == 0


@pytest.mark.parametrize("field", ["run_id", "tool_call_id", "customer_ref"])
@pytest.mark.parametrize(
    "value",
    [" run-1", "run-1 ", "run-1\n", "\u00a0run-1", "run\x00-1", "run\x1b-1", "run\u202e-1",
     "run\u200b-1", "run\ufeff-1", "run\u2066-1", "   "],
)
def test_agent_identifiers_with_whitespace_or_hidden_characters_are_refused(
    api, sandbox, field, value
):
    response = api.post("/api/v1/operations", submit_body(**{field: value}), format="json")

    assert response.status_code == 400, response.content
    assert response["Content-Type"] == PROBLEM
    assert field in json.dumps(response.json())
    assert_nothing_written()


def test_identifiers_with_inner_spaces_and_non_ascii_letters_are_kept_exactly(api, sandbox):
    response = api.post("/api/v1/operations", submit_body(
        run_id="run 81 – Zoë", tool_call_id="toolu_01ABC", customer_ref="Order #4711 (Zoë)",
    ), format="json")

    assert response.status_code == 201, response.content
    operation = Operation.objects.get()
    assert operation.run_id == "run 81 – Zoë"
    assert operation.tool_call_ids == ["toolu_01ABC"]
    assert operation.customer_ref == "Order #4711 (Zoë)"


def test_the_executor_refuses_the_same_values_for_callers_other_than_the_api(agent, sandbox):
    with pytest.raises(executor.InvalidSubmission) as refused:
        executor.submit(agent=agent, operation_id="wf:1", tool_name="refund",
                        params=submit_body()["params"], customer_ref="ref-1\n")
    assert set(refused.value.errors) == {"customer_ref"}
    assert_nothing_written()
