"""Browser middleware that agents' bearer-token API calls skip.

A call to /api/ with `Authorization: Bearer …` never has a session, a signed-in user, flash
messages or htmx headers, so running that middleware is pure cost on the hottest path (a
replay). Each class here is the Django (or django-htmx) middleware it subclasses — so the
admin's system checks still find them — and steps aside for those calls only; every other
request (pages, the admin, an API call without a bearer token) gets the full behaviour. CSRF and
clickjacking stay as Django ships them (`check --deploy` looks for them by name; DRF's views are
CSRF-exempt, so the CSRF middleware does next to nothing for them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpRequest
from django_htmx.middleware import HtmxMiddleware

API_PREFIX = "/api/"


def is_agent_api_call(request: HttpRequest) -> bool:
    return request.path_info.startswith(API_PREFIX) and request.META.get(
        "HTTP_AUTHORIZATION", ""
    ).startswith("Bearer ")


class _BrowserOnly:
    get_response: Callable[[HttpRequest], Any]
    async_mode: bool = False

    def __call__(self, request: HttpRequest) -> Any:
        if not getattr(self, "async_mode", False) and is_agent_api_call(request):
            return self.get_response(request)
        return super().__call__(request)  # type: ignore[misc]

    def process_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        if is_agent_api_call(request):
            return None
        parent = getattr(super(), "process_view", None)
        return parent(request, *args, **kwargs) if parent else None


class BrowserOnlySessionMiddleware(_BrowserOnly, SessionMiddleware):
    pass


class BrowserOnlyAuthenticationMiddleware(_BrowserOnly, AuthenticationMiddleware):
    pass


class BrowserOnlyMessageMiddleware(_BrowserOnly, MessageMiddleware):
    pass


class BrowserOnlyHtmxMiddleware(_BrowserOnly, HtmxMiddleware):
    pass


