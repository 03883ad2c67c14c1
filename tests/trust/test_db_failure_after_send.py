"""The database fails after the provider call: the outcome in hand is persisted as soon as
the database is back (a short bounded retry on a fresh connection), and an answer that cannot
wait longer is problem+json 503 with Location, Retry-After and "do not retry under a new ID"."""

from __future__ import annotations

import contextlib

import psycopg
import pytest
from django.db import OperationalError, connection

from ledger.models import Operation
from tests.conftest import requires_postgres, submit_body

OP = "wf-81:invoice-17:refund-1:v1"
PROBLEM = "application/problem+json"


class FailOutcomeWrites:
    """Raises OperationalError instead of running the UPDATE that records the outcome, for
    the first `times` attempts (a database restarting under the executor)."""

    def __init__(self, times: int, kill=None) -> None:
        self.times = times
        self.failed = 0
        self.kill = kill

    def __call__(self, execute, sql, params, many, context):
        # The ORM's UPDATE, or the hot path's `WITH moved AS (UPDATE "ledger_operation" …)`.
        if (self.failed < self.times and 'UPDATE "ledger_operation"' in sql
                and params and "succeeded" in params):
            self.failed += 1
            if self.kill is None:
                raise OperationalError("server closed the connection unexpectedly")
            self.kill()
        return execute(sql, params, many, context)


@contextlib.contextmanager
def outcome_writes_failing(times: int, kill=None):
    wrapper = FailOutcomeWrites(times, kill)
    with connection.execute_wrapper(wrapper):
        yield wrapper


def test_outcome_is_persisted_once_the_database_is_back(api, sandbox, settings, caplog):
    settings.LEDGER_PERSIST_RETRY_SECONDS = 10
    with outcome_writes_failing(times=3) as failing:
        response = api.post("/api/v1/operations", submit_body(), format="json")

    assert failing.failed == 3
    assert response.status_code == 201, response.content
    operation = Operation.objects.get()
    assert operation.status == "succeeded" and operation.attempts == 1
    assert list(operation.events.values_list("from_status", "to_status")) == [
        ("", "prepared"), ("prepared", "in_flight"), ("in_flight", "succeeded")]
    assert sandbox.effect_counts() == {OP: 1}
    assert sum("retrying" in r.getMessage() for r in caplog.records) == 3


def test_a_database_down_longer_than_the_retry_answers_503_with_guidance(
    api, sandbox, settings
):
    settings.LEDGER_PERSIST_RETRY_SECONDS = 0.3
    with outcome_writes_failing(times=1000):
        response = api.post("/api/v1/operations", submit_body(), format="json")

    assert response.status_code == 503
    assert response["Content-Type"] == PROBLEM
    assert response["Location"] == f"http://testserver/api/v1/operations/{OP}"
    assert int(response["Retry-After"]) > 0
    body = response.json()
    assert body["code"] == "outcome_not_recorded" and body["status"] == 503
    assert "Do not retry with a new operation ID" in body["detail"]
    # The provider has the effect once; the row waits, claimed, for the reconciler.
    assert sandbox.effect_counts() == {OP: 1}
    operation = Operation.objects.get()
    assert operation.status == "in_flight"
    # The same request with the same ID never sends again while the lease is live.
    with_same_id = api.post("/api/v1/operations", submit_body(), format="json")
    assert with_same_id.status_code == 202
    assert sandbox.effect_counts() == {OP: 1}


def test_any_database_error_in_the_api_is_a_503_problem(api, settings):
    def unavailable(execute, sql, params, many, context):
        raise OperationalError("could not connect to server")

    api.get("/api/v1/operations/a:b")  # authenticate once, then the database goes away
    with connection.execute_wrapper(unavailable):
        response = api.get("/api/v1/operations/a:b")

    assert response.status_code == 503
    assert response["Content-Type"] == PROBLEM
    assert "Retry-After" in response
    assert "new operation ID" in response.json()["detail"]


@requires_postgres
@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_killed_database_connection_between_send_and_persist_is_survived(
    api, sandbox, settings
):
    """A real connection kill: pg_terminate_backend of the executor's own connection, after
    the provider answered and before the outcome is written."""
    settings.LEDGER_PERSIST_RETRY_SECONDS = 10
    params = connection.get_connection_params()
    dsn = {k: v for k, v in params.items() if k in {"host", "port", "user", "password", "dbname"}}
    killed: list[int] = []

    def kill_my_backend() -> None:
        pid = connection.connection.info.backend_pid
        with psycopg.connect(**dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        killed.append(pid)

    with outcome_writes_failing(times=1, kill=kill_my_backend):
        response = api.post("/api/v1/operations", submit_body(), format="json")

    assert killed, "the connection was not killed"
    assert response.status_code == 201, response.content
    operation = Operation.objects.get()
    assert operation.status == "succeeded"
    assert operation.events.filter(to_status="succeeded").count() == 1
    assert sandbox.effect_counts() == {OP: 1}
