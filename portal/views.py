from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from ledger import selectors


def status_page(request: HttpRequest, token: str) -> HttpResponse:
    operation = selectors.operation_get_by_status_token(token)
    if operation is None:
        raise Http404("No such request.")
    return render(request, "portal/status.html", {"operation": operation})
