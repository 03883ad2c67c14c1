"""A request ID from X-Request-ID (or made), returned, carried into the Celery tasks the
request causes, and into every log line written meanwhile."""

from __future__ import annotations

import logging
import re
import time

import pytest
from celery.contrib.testing.worker import start_worker

from config.celery import app
from config.logging import JsonFormatter, RequestIdFilter
from config.request_id import current_request_id
from ledger.models import Operation
from tests.conftest import submit_body


class Collect(logging.Handler):
    """A handler configured like the console one: the request-ID filter, then the formatter."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.addFilter(RequestIdFilter())
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def log_lines():
    handler = Collect()
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    yield handler.lines
    root.removeHandler(handler)
    root.setLevel(level)


def test_a_given_request_id_is_returned_and_in_every_log_line(api, sandbox, log_lines):
    response = api.post("/api/v1/operations", submit_body(), format="json",
                        HTTP_X_REQUEST_ID="req-abc.123")

    assert response.status_code == 201
    assert response["X-Request-ID"] == "req-abc.123"
    provider_lines = [line for line in log_lines if "provider send" in line]
    assert provider_lines
    assert all('"request_id": "req-abc.123"' in line for line in log_lines)
    assert current_request_id.get() is None  # unbound after the request


def test_a_request_id_is_made_when_none_or_an_unusable_one_is_sent(client, db):
    made = client.get("/healthz")
    unusable = client.get("/healthz", HTTP_X_REQUEST_ID="bad id\u202e with spaces")

    assert re.fullmatch(r"[0-9a-f]{32}", made["X-Request-ID"])
    assert re.fullmatch(r"[0-9a-f]{32}", unusable["X-Request-ID"])
    assert made["X-Request-ID"] != unusable["X-Request-ID"]


def test_error_answers_carry_the_request_id_too(api):
    response = api.get("/api/v1/operations/a:b%00", HTTP_X_REQUEST_ID="req-404")
    assert response.status_code == 404 and response["X-Request-ID"] == "req-404"


@pytest.mark.django_db(transaction=True)
def test_the_task_a_request_enqueues_carries_its_request_id_into_the_worker(api, sandbox):
    collect = Collect()
    log_lines = collect.lines
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        # Added once the worker has set up its logging (it replaces the root's handlers).
        logging.getLogger().addHandler(collect)
        response = api.post("/api/v1/operations", submit_body(execution="async"),
                            format="json", HTTP_X_REQUEST_ID="req-async-7")
        assert response.status_code == 202
        operation = Operation.objects.get()
        for _ in range(200):
            operation.refresh_from_db()
            if operation.status == "succeeded":
                break
            time.sleep(0.05)

    logging.getLogger().removeHandler(collect)
    assert operation.status == "succeeded"
    sent = [line for line in log_lines if "provider send" in line]
    assert len(sent) == 1 and '"request_id": "req-async-7"' in sent[0]
    # Celery's own line for the finished task is written while the ID is bound.
    finished = [line for line in log_lines
                if "execute_operation" in line and "succeeded in" in line]
    assert len(finished) == 1 and '"request_id": "req-async-7"' in finished[0]
