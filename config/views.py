"""Health, readiness and metrics: the endpoints a load balancer and Prometheus call."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views import defaults
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from config.gauges import refresh_gauges
from config.middleware import is_api_path, problem_response


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:  # noqa: BLE001 - any database failure means not ready
        return JsonResponse({"status": "unavailable", "database": "unreachable"}, status=503)
    return JsonResponse({"status": "ready", "database": "ok"})


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    refresh_gauges()
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return render(request, "home.html")


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500: problem+json for the API, with the guidance an agent needs; the operation
    ID it submitted names the same intent whatever happened."""
    if is_api_path(request.path_info):
        return problem_response(
            500, title="Internal error", code="internal_error",
            detail=(
                "The ledger failed to answer. If you submitted an operation, do not retry it "
                "under a new operation ID: submit the same request again with the same "
                "operation ID, or read the operation, after a short wait."
            ),
            headers={"Retry-After": "5"},
        )
    return defaults.server_error(request)
