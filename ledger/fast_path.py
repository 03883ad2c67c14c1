"""POST /api/v1/operations answered without DRF's per-request machinery.

An agent's submit is the ledger's hottest call, and a replay of it is mostly framework: DRF
wraps the request, negotiates, authenticates, checks permissions and throttles, parses,
resolves the URL and runs the view-level middleware, then renders — more CPU than the
ledger's own work (bench/peers.py, README "Production server"). This middleware, last in
settings.MIDDLEWARE (so every middleware above it — request IDs, load shedding, security
headers, CSP — has run as for any request), answers the plain case with the same pieces the
view uses: the same credential check (ledger.auth.agent_from_header), the same parser
(api_support.parse_json), the same field check (serializers.submit_fields_fast), the same
throttle and the same answer (ledger.api.submit_answer), rendered as DRF renders it.

Anything it does not answer exactly as the view would — no or bad credentials, an address
refused for failed attempts, another content type or Accept, a body that is not plainly
valid, client execution, a throttled agent — goes on to the view untouched (nothing has been
counted or written), which answers it as before. tests/ledger/test_fast_path.py compares the
two answer for answer. LEDGER_API_FAST_PATH=0 turns it off.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import MiddlewareNotUsed, PermissionDenied
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponseBase
from rest_framework.exceptions import APIException
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from ledger import api
from ledger.api_support import StrictJSONParser, parse_json, problem_exception_handler
from ledger.auth import (
    AgentRateThrottle,
    AgentTokenAuthentication,
    IsAgent,
    agent_from_header,
)
from ledger.negotiation import JsonNegotiation
from ledger.serializers import submit_fields_fast

SUBMIT_PATH = "/api/v1/operations"
# Content types StrictJSONParser reads as they stand (it decodes UTF-8 whatever they say).
JSON_CONTENT_TYPES = frozenset({"application/json", "application/json; charset=utf-8",
                                "application/json;charset=utf-8"})

# What the view is configured with; the fast path reproduces exactly this and nothing else.
_REPRODUCED = {
    "authentication_classes": [AgentTokenAuthentication],
    "permission_classes": [IsAgent],
    "throttle_classes": [AgentRateThrottle],
    "parser_classes": [StrictJSONParser],
    "renderer_classes": [JSONRenderer],
    "content_negotiation_class": JsonNegotiation,
}


def _view_matches() -> bool:
    view = api.OperationSubmitApi
    return all(getattr(view, name) == value for name, value in _REPRODUCED.items())


class SubmitFastPathMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        if not settings.LEDGER_API_FAST_PATH or not _view_matches():
            raise MiddlewareNotUsed
        self.get_response = get_response
        view = api.OperationSubmitApi()
        self.headers = dict(view.default_response_headers)  # what finalize_response adds
        self.renderer = JSONRenderer()

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.method == "POST" and request.path_info == SUBMIT_PATH:
            answer = self._answer(request)
            if answer is not None:
                return answer
        return self.get_response(request)

    def _answer(self, request: HttpRequest) -> HttpResponseBase | None:
        meta = request.META
        if meta.get("CONTENT_TYPE") not in JSON_CONTENT_TYPES \
                or meta.get("HTTP_ACCEPT") not in JsonNegotiation.ANY_JSON \
                or meta.get("QUERY_STRING"):
            return None
        length = meta.get("CONTENT_LENGTH") or ""
        if not length.isdigit() or not 0 < int(length) <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
            return None
        agent = agent_from_header(request)
        if agent is None:
            return None
        try:
            body = parse_json(request.body)
        except APIException:
            return None
        data = submit_fields_fast(body)
        if data is None or not AgentRateThrottle().allow_agent(agent):
            return None  # the view answers (and counts) a throttled agent as before
        # From here on the request has been counted: it is answered here, whatever happens.
        try:
            response = api.submit_answer(request, agent, body, data)
        except (APIException, Http404, PermissionDenied, OperationalError, InterfaceError) as exc:
            # What the view's exception handling makes of them (the database being down, for
            # one); anything else is a server error either way.
            handled = problem_exception_handler(exc, {})
            if handled is None:
                raise
            response = handled
        return self._finalize(response)

    def _finalize(self, response: Response) -> Response:
        """What APIView.finalize_response does for this view, then rendered."""
        response.accepted_renderer = self.renderer
        response.accepted_media_type = self.renderer.media_type
        response.renderer_context = {}  # type: ignore[attr-defined]  # set by DRF the same way
        for key, value in self.headers.items():
            response[key] = value
        response.render()
        return response
