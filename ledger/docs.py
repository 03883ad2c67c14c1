"""The API docs page: Redoc from the sidecar's static files, never a CDN or web fonts."""

from __future__ import annotations

from django.utils.csp import CSP
from django.utils.decorators import method_decorator
from django.views.decorators.csp import csp_override
from drf_spectacular.views import SpectacularRedocView

# Redoc renders with styled-components (runtime <style> tags) and a blob: web worker; this
# page alone allows those. It shows only the public schema, no data.
DOCS_CSP: dict[str, list[str]] = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF, CSP.UNSAFE_INLINE],
    "img-src": [CSP.SELF, "data:"],
    "font-src": [CSP.SELF],
    "worker-src": [CSP.SELF, "blob:"],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "frame-ancestors": [CSP.NONE],
}


@method_decorator(csp_override(DOCS_CSP), name="dispatch")
class ApiDocsView(SpectacularRedocView):
    template_name = "ledger/api_docs.html"
    authentication_classes: list = []
    permission_classes: list = []
