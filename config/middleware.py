"""Request-level guards that run before any view (unusable paths, the request ID, load
shedding; each answers the API's callers in application/problem+json), and the browser
middleware that agents' bearer-token API calls skip."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound
from django.middleware.csp import ContentSecurityPolicyMiddleware as DjangoCspMiddleware
from django.utils.csp import CSP, build_policy
from django_htmx.middleware import HtmxMiddleware

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


# C0 and C1 controls, DEL and lone surrogates.
_UNUSABLE_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _unusable(path: str) -> bool:
    # No URL of this service can contain a control character (a NUL cannot even be stored in
    # PostgreSQL text): such a path names nothing.
    return _UNUSABLE_CHARACTER.search(path) is not None


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


# --- Load shedding ---------------------------------------------------------------------------

# Probes must answer under load: a load balancer that cannot reach them takes the whole
# instance out, which sheds everything.
_NEVER_SHED = ("/healthz", "/readyz", "/metrics", "/static/")


class _Limiter:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.slots = threading.BoundedSemaphore(limit)


_limiter_lock = threading.Lock()
_limiter: _Limiter | None = None


def _current_limiter(limit: int) -> _Limiter:
    global _limiter
    with _limiter_lock:
        if _limiter is None or _limiter.limit != limit:
            _limiter = _Limiter(limit)
        return _limiter


def request_queue_age(header: str | None, now: float) -> float | None:
    """Seconds since a proxy stamped X-Request-Start (`t=<epoch>` in s, ms or µs)."""
    if not header:
        return None
    raw = header.strip().removeprefix("t=")
    try:
        stamp = float(raw)
    except ValueError:
        return None
    while stamp > now * 10:  # milliseconds or microseconds
        stamp /= 1000
    return max(now - stamp, 0.0)


class LoadSheddingMiddleware:
    """When the service is saturated, answer 503 + Retry-After (problem code `overloaded`) in
    bounded time instead of letting the queue, and latency, grow without limit.

    Two bounds, both configurable:
    - LEDGER_MAX_CONCURRENT_REQUESTS requests run at once in one process (threaded workers);
      a request waits at most LEDGER_MAX_QUEUE_WAIT_SECONDS for a slot, then is shed.
    - A request a proxy stamped with X-Request-Start more than LEDGER_MAX_QUEUE_WAIT_SECONDS
      ago (it waited in the proxy's or the listen socket's queue) is shed before any work.
    Probes (/healthz, /readyz, /metrics) are never shed."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        from django.conf import settings

        limit = int(settings.LEDGER_MAX_CONCURRENT_REQUESTS)
        if limit <= 0 or request.path_info.startswith(_NEVER_SHED):
            return self.get_response(request)
        wait = float(settings.LEDGER_MAX_QUEUE_WAIT_SECONDS)
        age = request_queue_age(request.headers.get("X-Request-Start"), time.time())
        if age is not None and age > wait:
            return self._shed(request, "queued_too_long")
        limiter = _current_limiter(limit)
        if not limiter.slots.acquire(timeout=wait):
            return self._shed(request, "saturated")
        try:
            return self.get_response(request)
        finally:
            limiter.slots.release()

    def _shed(self, request: HttpRequest, why: str) -> HttpResponse:
        from django.conf import settings

        from config.metrics_shed import SHED

        SHED.labels(why).inc()
        retry_after = str(settings.LEDGER_OVERLOAD_RETRY_AFTER_SECONDS)
        detail = ("The service is at capacity. Nothing was done with this request; send it "
                  "again, with the same operation ID if it is a submission, after Retry-After "
                  "seconds.")
        if is_api_path(request.path_info):
            return problem_response(503, title="Overloaded", detail=detail, code="overloaded",
                                    headers={"Retry-After": retry_after})
        response = HttpResponse("The service is busy; please reload in a few seconds.",
                                status=503, content_type="text/plain; charset=utf-8")
        response["Retry-After"] = retry_after
        return response


# --- Browser middleware that bearer-token API calls skip ------------------------------------
# A call to /api/ with `Authorization: Bearer …` never has a session, a signed-in user, flash
# messages or htmx headers, so running that middleware is pure cost on the hottest path (a
# replay). Each class here is the Django (or django-htmx) middleware it subclasses — so the
# admin's system checks still find them — and steps aside for those calls only; every other
# request (pages, the admin, an API call without a bearer token) gets the full behaviour. CSRF and
# clickjacking stay as Django ships them (`check --deploy` looks for them by name; DRF's views are
# CSRF-exempt, so the CSRF middleware does next to nothing for them).

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


class ContentSecurityPolicyMiddleware(DjangoCspMiddleware):
    """Django's, except that a policy without a nonce (no template used one: every API answer)
    is built once per configuration instead of for every response; a response whose page used
    the nonce gets its own, as before."""

    _built: dict[int, tuple[Any, str]] = {}

    def process_response(self, request: HttpRequest, response: Any) -> Any:
        if getattr(request, "_csp_nonce", None):  # a page used this request's nonce
            return super().process_response(request, response)
        sentinel = object()
        if (config := getattr(response, "_csp_config", sentinel)) is sentinel:
            config = settings.SECURE_CSP
        if (report_only := getattr(response, "_csp_ro_config", sentinel)) is sentinel:
            report_only = settings.SECURE_CSP_REPORT_ONLY
        for header, chosen in ((CSP.HEADER_ENFORCE, config), (CSP.HEADER_REPORT_ONLY,
                                                                 report_only)):
            if chosen and header not in response:
                response.headers[str(header)] = self._policy(chosen)
        return response

    def _policy(self, config: Any) -> str:
        # Keyed by the configuration object (settings replaced in a test are another object);
        # the object is kept with it, so an id is never reused for a different one.
        built = self._built.get(id(config))
        if built is None or built[0] is not config:
            built = self._built[id(config)] = (config, build_policy(config, None))
        return built[1]
