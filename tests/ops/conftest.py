from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from ledger import transitions
from ledger.models import AgentCredential, Operation
from tests.ledger.factories import in_flight, prepared

S = Operation.Status


@pytest.fixture
def staff(db: None, django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="ops-olga", password="pw-12345678",
                                                 is_staff=True)


@pytest.fixture
def ops_client(staff: Any) -> Client:
    client = Client()
    client.force_login(staff)
    return client


def op_in(agent: AgentCredential, status: str, number: int, **params: Any) -> Operation:
    """One refund operation in `status`, built through the transition functions."""
    operation_id = f"wf-{number}:invoice-{number}:refund-1:v1"
    params.setdefault("invoice", f"invoice-{number}")
    if status == S.PREPARED:
        return prepared(agent, operation_id, **params)
    operation, token = in_flight(agent, operation_id, **params)
    if status == S.IN_FLIGHT:
        return operation
    if status == S.SUCCEEDED:
        return transitions.operation_succeed(
            operation=operation, fencing_token=token, result={"id": f"eff_{number}"},
            provider_request_id=f"eff_{number}", actor="worker:test",
            reason="provider_confirmed", data={"outcome": "Confirmed"})
    if status == S.FAILED:
        return transitions.operation_fail(
            operation=operation, fencing_token=token, error_class="http_402.rejected",
            actor="worker:test", reason="provider_rejected",
            data={"outcome": "Rejected", "error_class": "http_402.rejected"})
    if status == S.UNKNOWN:
        return transitions.operation_mark_unknown(
            operation=operation, fencing_token=token, error_class="transport.ReadTimeout",
            actor="worker:test", reason="timeout_after_send",
            data={"outcome": "Unknown", "error_class": "transport.ReadTimeout"})
    raise ValueError(status)


def ops_in_every_state(agent: AgentCredential, start: int, each: int) -> list[Operation]:
    made = []
    number = start
    for status in (S.PREPARED, S.IN_FLIGHT, S.SUCCEEDED, S.FAILED, S.UNKNOWN):
        for _ in range(each):
            made.append(op_in(agent, status, number))
            number += 1
    return made
