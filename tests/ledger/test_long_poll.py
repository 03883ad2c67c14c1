"""GET /api/v1/operations/{id}?wait=N, and Retry-After/guidance that follow the situation."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections
from django.utils import timezone
from rest_framework.test import APIClient

from ledger import transitions
from ledger.models import Operation
from ledger.pacing import AWAITING_REVIEW_RETRY_AFTER
from ledger.tools import get_tool
from reconciliation import services
from reconciliation.models import Case
from tests.conftest import requires_postgres
from tests.ledger.client_helpers import OP, claim
from tests.reconciliation.helpers import sweep, unknown_refund

S = Operation.Status
URL = f"/api/v1/operations/{OP}"


def iso(moment) -> str:
    return moment.astimezone(timezone.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def succeed_later(operation: Operation, token: int, delay: float) -> threading.Thread:
    def run() -> None:
        try:
            time.sleep(delay)
            transitions.operation_succeed(
                operation=operation, fencing_token=token, result={"id": "eff_1"},
                provider_request_id="eff_1", actor="test", reason="provider_confirmed")
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("wait", ["31", "-1", "abc", "1.5", "100000000000000000000"])
def test_wait_outside_0_to_30_seconds_is_a_400_problem(api, wait):
    claim(api)

    response = api.get(URL, {"wait": wait})

    assert response.status_code == 400
    assert response["Content-Type"].startswith("application/problem+json")
    assert response.json()["code"] == "invalid" and "wait" in response.json()["errors"]


def test_wait_on_a_terminal_operation_answers_at_once(api, sandbox):
    api.post("/api/v1/operations", {"operation_id": OP, "tool": "refund", "params": {
        "invoice": "invoice-17", "amount": 2500, "currency": "EUR", "payee": "cus_123"}},
        format="json")
    started = time.monotonic()

    response = api.get(URL, {"wait": "30"})

    assert response.status_code == 200 and response.json()["status"] == "succeeded"
    assert time.monotonic() - started < 30
    assert "Retry-After" not in response


def test_wait_without_a_change_answers_the_current_state_after_the_wait(api):
    claim(api)

    response = api.get(URL, {"wait": "1"})

    assert response.status_code == 200 and response.json()["status"] == "in_flight"
    assert int(response["Retry-After"]) > 0


def test_another_agents_operation_is_not_found_even_when_waiting(api, second_agent_api):
    claim(api)

    assert second_agent_api.get(URL, {"wait": "5"}).status_code == 404


@pytest.mark.django_db(transaction=True)
def test_long_poll_returns_the_new_state_as_soon_as_it_changes(api):
    resource = claim(api)
    operation = Operation.objects.get()
    started = time.monotonic()
    changer = succeed_later(operation, resource["claim"]["fencing_token"], delay=0.5)

    response = api.get(URL, {"wait": "20"})
    elapsed = time.monotonic() - started
    changer.join(timeout=30)

    assert response.status_code == 200 and response.json()["status"] == "succeeded"
    assert elapsed < 20  # answered by the change, not by the end of the wait


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_a_waiting_long_poll_holds_no_database_connection(agent_and_token):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {agent_and_token[1]}")
    resource = claim(api)
    operation = Operation.objects.get()
    answers: list[str] = []

    def wait() -> None:
        waiting = APIClient()
        waiting.credentials(HTTP_AUTHORIZATION=f"Bearer {agent_and_token[1]}")
        try:
            answers.append(waiting.get(URL, {"wait": "30"}).json()["status"])
        finally:
            connections.close_all()

    def backends() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity "
                           "WHERE datname = current_database()")
            return int(cursor.fetchone()[0])

    # This test's own connection (and any an earlier test's thread left behind).
    baseline = backends()
    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)
    samples = []
    for _ in range(10):
        samples.append(backends())
        time.sleep(0.2)
    transitions.operation_succeed(
        operation=operation, fencing_token=resource["claim"]["fencing_token"],
        result={"id": "eff_1"}, provider_request_id="eff_1", actor="test",
        reason="provider_confirmed")
    waiter.join(timeout=40)

    assert answers == ["succeeded"]
    # No backend for the waiting request, except for the instant of a re-check (a few ms
    # every 0.5 s).
    assert sum(1 for n in samples if n <= baseline) >= 8, (baseline, samples)
    assert max(samples) <= baseline + 1


# --- Retry-After and guidance follow the situation --------------------------------------------

def test_in_flight_retry_after_runs_to_the_end_of_the_lease(api, frozen):
    response = api.post("/api/v1/operations", {
        "operation_id": OP, "tool": "refund", "execution": "client", "params": {
            "invoice": "invoice-17", "amount": 2500, "currency": "EUR", "payee": "cus_123"}},
        format="json")
    lease = get_tool("refund").lease_seconds
    operation = Operation.objects.get()

    assert response.status_code == 202 and response["Retry-After"] == str(lease)
    frozen.shift(20)
    read = api.get(URL)
    assert read["Retry-After"] == str(lease - 20)
    assert iso(operation.lease_expires_at) in read.json()["guidance"]
    assert read.json()["guidance"].startswith("In progress: do not retry")


def test_reconciling_retry_after_is_the_seconds_until_the_cases_next_check(
    api, frozen, sandbox
):
    claim(api)  # a client that dies before sending: lookups find nothing for a while
    frozen.shift(get_tool("refund").lease_seconds + 1)
    sandbox.advance_clock(get_tool("refund").lease_seconds + 1)
    services.sweep_expired_leases()
    sweep()
    case = Case.objects.get()
    assert case.state == Case.State.CHECKING

    response = api.get(URL)

    due_in = (case.next_check_at - timezone.now()).total_seconds()
    assert int(response["Retry-After"]) == max(1, min(300, int(-(-due_in // 1))))
    assert iso(case.next_check_at) in response.json()["guidance"]
    assert response.json()["guidance"].startswith("Outcome unknown: do not retry")


def test_awaiting_a_person_retry_after_is_minutes_and_guidance_names_the_deadline(
    api, agent, sandbox
):
    unknown_refund(agent, "lose-response", operation_id=OP, amount=150_000)
    sweep()
    case = Case.objects.get()
    assert case.state == Case.State.AWAITING_REVIEW

    response = api.get(URL)

    assert int(response["Retry-After"]) == AWAITING_REVIEW_RETRY_AFTER >= 60
    assert iso(case.review_deadline_at) in response.json()["guidance"]
    assert "person" in response.json()["guidance"]


@pytest.mark.django_db(transaction=True)
def test_long_poll_also_answers_when_the_case_goes_to_a_person(api, agent, sandbox):
    from reconciliation import transitions as case_transitions

    unknown_refund(agent, "lose-response", operation_id=OP)
    case = Case.objects.get()

    def escalate_later() -> None:
        try:
            time.sleep(0.5)
            case_transitions.case_escalate(case=case, reason="manual", actor="staff:ann")
        finally:
            connections.close_all()

    escalator = threading.Thread(target=escalate_later)
    escalator.start()
    started = time.monotonic()
    response = api.get(URL, {"wait": "20"})
    elapsed = time.monotonic() - started
    escalator.join(timeout=30)

    body = response.json()
    assert body["status"] == "unknown"
    assert body["reconciliation"]["state"] == "awaiting_review"
    assert int(response["Retry-After"]) == AWAITING_REVIEW_RETRY_AFTER
    assert elapsed < 20


def test_a_deployment_cap_holds_a_long_poll_no_longer_than_the_cap(api, settings, monkeypatch):
    claim(api)
    settings.LEDGER_LONG_POLL_MAX_SECONDS = 0.3
    slept: list[float] = []
    real_sleep = time.sleep
    monkeypatch.setattr("ledger.long_poll.time.sleep",
                        lambda seconds: (slept.append(seconds), real_sleep(seconds)))

    response = api.get(URL, {"wait": "30"})

    assert response.status_code == 200 and response.json()["status"] == "in_flight"
    assert slept and sum(slept) <= 0.3 + 1e-9
    assert int(response["Retry-After"]) > 0
