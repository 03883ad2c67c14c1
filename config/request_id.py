"""The request ID: taken from X-Request-ID (when it is a sane token) or made, returned in the
response, carried into the Celery tasks the request causes (a task header) and into every
log line written while the request or such a task runs (config.logging)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.http import HttpRequest, HttpResponse

HEADER = "X-Request-ID"
TASK_HEADER = "request_id"
_ACCEPTED = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")

current_request_id: ContextVar[str | None] = ContextVar("request_id", default=None)


def new_request_id() -> str:
    return uuid.uuid4().hex


def accepted(value: str | None) -> str | None:
    """A caller's ID is kept only when it is a plain token (it ends up in every log line)."""
    return value if value and _ACCEPTED.fullmatch(value) else None


@contextmanager
def bound(request_id: str | None) -> Iterator[None]:
    token = current_request_id.set(request_id)
    try:
        yield
    finally:
        current_request_id.reset(token)


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = accepted(request.headers.get(HEADER)) or new_request_id()
        with bound(request_id):
            response = self.get_response(request)
        response[HEADER] = request_id
        return response


# --- Celery: the ID travels as a message header and is bound while the task runs ----------

def on_before_task_publish(headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
    request_id = current_request_id.get()
    if headers is not None and request_id and TASK_HEADER not in headers:
        headers[TASK_HEADER] = request_id


_task_tokens: dict[str, Any] = {}


def on_task_prerun(task_id: str | None = None, task: Any = None, **kwargs: Any) -> None:
    request_id = accepted(getattr(getattr(task, "request", None), TASK_HEADER, None))
    if task_id is not None:
        _task_tokens[task_id] = current_request_id.set(request_id)


def on_task_postrun(task_id: str | None = None, **kwargs: Any) -> None:
    token = _task_tokens.pop(task_id, None) if task_id is not None else None
    if token is not None:
        current_request_id.reset(token)


def connect_celery_signals() -> None:
    from celery import signals

    signals.before_task_publish.connect(on_before_task_publish, weak=False)
    signals.task_prerun.connect(on_task_prerun, weak=False)
    signals.task_postrun.connect(on_task_postrun, weak=False)
