"""GET /api/v1/operations/{id}?wait=N: answer as soon as the operation changes, or after N s.

While it waits the request holds no database connection and no transaction: each check opens a
connection, reads one row (with its case), and closes it again before sleeping. So a thousand
waiting agents cost a thousand sleeping threads, not a thousand PostgreSQL backends, and it
works the same on the embedded SQLite default.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.db import connection

from ledger import selectors
from ledger.models import AgentCredential, Operation
from ledger.pacing import case_of


def observed(operation: Operation) -> tuple[Any, ...]:
    """What counts as a change for a waiting agent: the status, and where its case stands."""
    case = case_of(operation)
    return (operation.status, operation.fencing_token, case.state if case is not None else None)


def release_connection() -> None:
    # Inside an atomic block (a test's wrapping transaction) closing would break the caller;
    # a real request is never inside one here (no ATOMIC_REQUESTS).
    if not connection.in_atomic_block:
        connection.close()


def wait_for_change(*, agent: AgentCredential, operation: Operation,
                    seconds: float) -> Operation:
    deadline = time.monotonic() + min(seconds, float(settings.LEDGER_LONG_POLL_MAX_SECONDS))
    seen = observed(operation)
    interval = float(settings.LEDGER_LONG_POLL_FIRST_INTERVAL_SECONDS)
    ceiling = float(settings.LEDGER_LONG_POLL_INTERVAL_SECONDS)
    while True:
        release_connection()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return operation
        time.sleep(min(interval, remaining))
        interval = min(interval * 2, ceiling)
        current = selectors.operation_get_for_agent(agent=agent,
                                                    operation_id=operation.operation_id)
        if current is None:
            return operation
        operation = current
        if observed(current) != seen:
            return current
