"""Content negotiation for an API that renders JSON only (settings.REST_FRAMEWORK)."""

from __future__ import annotations

from typing import Any

from rest_framework.negotiation import DefaultContentNegotiation


class JsonNegotiation(DefaultContentNegotiation):
    """DRF's negotiation, answered at once in the common case: the API renders JSON only, and
    a client that accepts anything or JSON gets what DRF would pick for it (the one renderer,
    its media type) without parsing the Accept header into media types on every request."""

    ANY_JSON = frozenset({None, "*/*", "application/json"})  # None: no Accept header

    def select_renderer(self, request: Any, renderers: Any, format_suffix: Any = None) -> Any:
        if (len(renderers) == 1 and format_suffix is None
                and request.META.get("HTTP_ACCEPT") in self.ANY_JSON
                and not request.query_params.get(self.settings.URL_FORMAT_OVERRIDE)):
            return renderers[0], renderers[0].media_type
        return super().select_renderer(request, renderers, format_suffix)
