"""Enqueue Celery tasks by name after commit, without importing the task modules.

Task modules import the services they run; a service that needs a task run after its commit
asks this registry instead of importing the task module back (that was the executor ↔ tasks
circle). ledger.tasks registers its tasks when it is imported, which LedgerConfig.ready does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from django.db import transaction

logger = logging.getLogger(__name__)


class _Task(Protocol):
    def delay(self, *args: Any) -> Any: ...


_TASKS: dict[str, _Task] = {}


def register(name: str) -> Callable[[Any], Any]:
    def decorate(task: Any) -> Any:
        _TASKS[name] = task
        return task

    return decorate


def enqueue_on_commit(name: str, *args: Any) -> None:
    """Run task `name` once the caller's transaction commits (at once outside one).

    A message that cannot be sent is not lost work: every task enqueued here has a periodic
    sweep that finds its rows (prepared operations, due webhook deliveries)."""
    task = _TASKS[name]

    def send() -> None:
        try:
            task.delay(*args)
        except Exception:
            logger.warning("could not enqueue %s; its sweep will pick the work up", name,
                           exc_info=True)

    transaction.on_commit(send)
