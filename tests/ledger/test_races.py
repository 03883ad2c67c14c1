"""Real threads, each with its own database connection, racing for the same operation."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connections
from rest_framework.test import APIClient

from ledger.models import Operation, OperationEvent
from tests.conftest import refund_params, requires_postgres, submit_body

OP = "wf-81:invoice-17:refund-1:v1"


def race(n: int, token: str, body: dict) -> list[tuple[int, str]]:
    barrier = threading.Barrier(n)
    answers: list[tuple[int, str]] = []
    lock = threading.Lock()

    def one() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        try:
            barrier.wait()
            response = client.post("/api/v1/operations", body, format="json")
            with lock:
                answers.append((response.status_code, response.json()["status"]))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return answers


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_twenty_threads_submitting_the_same_operation_cause_exactly_one_effect(
    agent_and_token, sandbox
):
    answers = race(20, agent_and_token[1], submit_body())

    assert len(answers) == 20
    assert sandbox.effect_counts() == {OP: 1}
    assert sandbox.request_counts()["total"] == 1
    operation = Operation.objects.get()
    assert operation.status == "succeeded" and operation.attempts == 1
    # Exactly one thread created it; the others saw it in flight or replayed the result.
    codes = Counter(code for code, _ in answers)
    assert codes[201] == 1
    assert set(codes) <= {201, 200, 202}
    assert all(status in {"succeeded", "in_flight"} for _, status in answers)
    assert list(OperationEvent.objects.values_list("to_status", flat=True).order_by("id")) == [
        "prepared", "in_flight", "succeeded"]


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_racing_a_lost_response_sends_once_and_everyone_sees_unknown(agent_and_token, sandbox):
    body = submit_body(params=refund_params(memo="sandbox:lose-response"))
    answers = race(10, agent_and_token[1], body)

    assert sandbox.effect_counts() == {OP: 1}
    assert sandbox.request_counts()["total"] == 1
    assert {status for _, status in answers} <= {"unknown", "in_flight"}
    assert Operation.objects.get().status == "unknown"


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_racing_different_intents_under_one_id_keeps_the_first_and_refuses_the_rest(
    agent_and_token, sandbox
):
    barrier = threading.Barrier(8)
    codes: list[int] = []

    def one(amount: int) -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent_and_token[1]}")
        try:
            barrier.wait()
            body = submit_body(params=refund_params(amount=amount))
            codes.append(client.post("/api/v1/operations", body, format="json").status_code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one, args=(1000 + i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert sorted(codes) == [201] + [422] * 7
    assert sandbox.effect_counts() == {OP: 1}
