"""Request-level guards that run before any view: unusable paths, the request ID, load
shedding. Each answers the API's callers in application/problem+json."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseNotFound

PROBLEM_CONTENT_TYPE = "application/problem+json"


def is_api_path(path: str) -> bool:
    return path.startswith("/api/")


def problem_response(status: int, *, title: str, detail: str, code: str,
                     headers: dict[str, str] | None = None,
                     extra: dict[str, Any] | None = None) -> HttpResponse:
    """A problem+json answer for code that runs outside DRF (middleware, error handlers)."""
    body = {
        "type": f"https://agent-ledger.invalid/problems/{code}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
        **(extra or {}),
    }
    response = HttpResponse(json.dumps(body), status=status, content_type=PROBLEM_CONTENT_TYPE)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _unusable(path: str) -> bool:
    # No URL of this service can contain a control character (a NUL cannot even be stored in
    # PostgreSQL text): such a path names nothing.
    return any(ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 or 0xD800 <= ord(char) < 0xE000
               for char in path)


class UnusablePathMiddleware:
    """A path with a NUL or another control character is a 404 before any view runs."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if _unusable(request.path_info):
            if is_api_path(request.path_info):
                return problem_response(404, title="Not found", detail="No such resource.",
                                        code="not_found")
            return HttpResponseNotFound("Not found", content_type="text/plain")
        return self.get_response(request)
