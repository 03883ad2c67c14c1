"""Health, readiness and metrics: the endpoints a load balancer and Prometheus call."""

from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views import defaults
from django.views.decorators.http import require_GET
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
    multiprocess,
)

from config.gauges import refresh_gauges
from config.middleware import is_api_path, problem_response


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _broker_reachable() -> bool:
    from config.celery import app

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1,
                                   timeout=settings.LEDGER_READYZ_TIMEOUT_SECONDS)
    except Exception:  # noqa: BLE001 - any broker failure means not ready
        return False
    return True


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """Ready: the database answers, the broker accepts a connection, and every periodic sweep
    finished within three intervals (reconciliation is running somewhere)."""
    from reconciliation.health import sweeps_health

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:  # noqa: BLE001 - any database failure means not ready
        return JsonResponse({"status": "unavailable", "database": "unreachable"}, status=503)
    body: dict[str, Any] = {"database": "ok"}
    body["broker"] = "ok" if _broker_reachable() else "unreachable"
    body["sweeps"] = sweeps_health()
    ready = body["broker"] == "ok" and all(sweep["ok"] for sweep in body["sweeps"].values())
    body = {"status": "ready" if ready else "unavailable", **body}
    return JsonResponse(body, status=200 if ready else 503)


def _metrics_authorised(request: HttpRequest) -> bool:
    token = settings.LEDGER_METRICS_TOKEN
    if not token:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme == "Bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text format. With PROMETHEUS_MULTIPROC_DIR set (gunicorn workers, Celery
    processes), the sum over every process that wrote there; with LEDGER_METRICS_TOKEN set,
    only for `Authorization: Bearer <token>`."""
    if not _metrics_authorised(request):
        response = HttpResponse("Metrics need the bearer token.\n", status=401,
                                content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    refresh_gauges()  # ledger_sweep_last_finished_timestamp_seconds among them
    if settings.PROMETHEUS_MULTIPROC_DIR:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=settings.PROMETHEUS_MULTIPROC_DIR)
        return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


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
