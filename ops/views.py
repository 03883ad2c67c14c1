"""The operators' dashboard: /ops/ (overview) and /ops/operations/ (explorer). Staff only.

The overview refreshes its live part every 30 s with htmx while the tab is visible
(static/js/ops.js cancels the poll when it is hidden and refreshes once on return); without
JavaScript it is a plain page with a refresh link.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import render, resolve_url
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers, patch_vary_headers
from django.views.decorators.http import require_GET
from django_htmx.http import HttpResponseClientRedirect

from config.http import HtmxHttpRequest
from ops import explorer
from ops import overview as overview_data
from ops.series import PERIODS

View = Callable[..., HttpResponse]
REFRESH_SECONDS = 30


def staff_required(view: View) -> View:
    """Anonymous visitors go to the login page; signed-in non-staff users get 403."""

    @wraps(view)
    def wrapped(request: HtmxHttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            if request.htmx:
                login = resolve_url(settings.LOGIN_URL)
                return HttpResponseClientRedirect(
                    f"{login}?{urlencode({'next': request.get_full_path()})}")
            return redirect_to_login(request.get_full_path())
        if not (request.user.is_active and request.user.is_staff):
            raise PermissionDenied("staff only")
        response = view(request, *args, **kwargs)
        patch_vary_headers(response, ["HX-Request"])
        add_never_cache_headers(response)
        return response

    return wrapped


@require_GET
@staff_required
def overview(request: HtmxHttpRequest) -> HttpResponse:
    period = request.GET.get("period", "hour")
    if period not in PERIODS:
        period = "hour"
    data = overview_data.build(period)
    context = {
        "nav": "overview", "o": data, "periods": list(PERIODS.values()),
        "refresh_seconds": REFRESH_SECONDS,
        "self_url": f"{reverse('ops:overview')}?period={period}",
        "generated_at": timezone.now(),
    }
    template = "ops/overview.html#live" if request.htmx else "ops/overview.html"
    return render(request, template, context)


@require_GET
@staff_required
def operations(request: HtmxHttpRequest) -> HttpResponse:
    tools, providers, agents = explorer.filter_choices()
    form = explorer.ExplorerForm(request.GET or None, tools=tools, providers=providers,
                                 agents=agents)
    result = None
    status = 200
    if not request.GET or form.is_valid():
        data = form.cleaned_data if request.GET else {}
        result = explorer.page(explorer.filtered(data), data.get("after"))
    else:
        status = 400
    query = request.GET.copy()
    query.pop("after", None)
    context = {
        "nav": "operations", "form": form, "result": result,
        "filter_query": query.urlencode(), "filters_active": bool(query),
        "first_page": bool(not request.GET.get("after")),
    }
    template = "ops/operations.html#results" if request.htmx else "ops/operations.html"
    return render(request, template, context, status=status)


@require_GET
@staff_required
def operation_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    page = explorer.operation_page(pk)
    if page is None:
        raise Http404("no such operation")
    status_path = reverse("portal:status", args=[page.operation.status_token])
    base = str(getattr(settings, "LEDGER_PUBLIC_BASE_URL", "") or "").rstrip("/")
    context = {
        "nav": "operations", "p": page, "op": page.operation,
        "status_url": f"{base}{status_path}" if base else request.build_absolute_uri(status_path),
        "case_url": reverse("review:case", args=[page.case.pk]) if page.case else "",
    }
    return render(request, "ops/operation.html", context)
