"""The customer's status page: one operation, reached only through its unguessable token.

The page polls while the operation is not terminal. The delay grows with every poll (the
server computes it, so the client needs no script of its own) and the last answer, at a
terminal state, is sent with HTTP 286 so htmx stops polling.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from django_htmx.http import HttpResponseStopPolling, reswap

from ledger import selectors
from ledger.models import Operation
from ledger.serializers import CUSTOMER_STATUS

if TYPE_CHECKING:
    from config.http import HtmxHttpRequest

S = Operation.Status

# Seconds to wait before poll number n (0-based); the last value repeats. Quick at first,
# because most operations settle within seconds, then backing off to a minute for the long
# tail of reconciliation.
POLL_DELAYS = (2, 3, 5, 8, 13, 20, 30, 45, 60)


def poll_delay(poll_number: int) -> int:
    return POLL_DELAYS[min(max(poll_number, 0), len(POLL_DELAYS) - 1)]


@dataclass(frozen=True)
class Wording:
    noun: str  # "your refund went through"
    provider: str  # "we're checking with the payment provider"
    done: str  # the completed sentence
    not_done: str  # the not-completed sentence


WORDING = {
    "refund": Wording(
        noun="refund", provider="payment provider",
        done="Your refund went through.",
        not_done="Your refund was not made. No money was moved.",
    ),
    "send_email": Wording(
        noun="e-mail", provider="e-mail provider",
        done="Your e-mail was sent.",
        not_done="Your e-mail was not sent.",
    ),
    "create_ticket": Wording(
        noun="ticket", provider="ticketing service",
        done="Your ticket was created.",
        not_done="Your ticket was not created.",
    ),
}
DEFAULT_WORDING = Wording(
    noun="request", provider="provider",
    done="Your request was completed.",
    not_done="Your request was not completed. Nothing was changed.",
)


# Evidence kinds that mean we asked the provider (a stale result is an answer nobody asked for).
_ASKED_PROVIDER = ("lookup", "staff_check", "resend")


def _last_checked(operation: Operation) -> Any:
    """When we last asked the provider: the reconciler's last check or a reviewer's lookup."""
    try:
        case = operation.reconciliation_case
    except ObjectDoesNotExist:
        return operation.updated_at
    latest_evidence = (
        case.evidence.filter(kind__in=_ASKED_PROVIDER).order_by("-created_at")
        .values_list("created_at", flat=True).first()
    )
    moments = [m for m in (case.last_checked_at, latest_evidence) if m is not None]
    return max(moments) if moments else case.created_at


# How much of the status token makes the customer's short reference. The customer has the
# whole link already; the reference is what they quote to support, who find the operation by
# it (admin search "^status_token"). The internal operation ID is never shown to them.
SHORT_REFERENCE_LENGTH = 8


def customer_reference(operation: Operation) -> str:
    """The customer's own reference if the agent passed one, else a short one made for them."""
    return operation.customer_ref or operation.status_token[:SHORT_REFERENCE_LENGTH]


@dataclass(frozen=True)
class Expectation:
    """What the customer is told about an unknown outcome: by when, and whether a person is
    on it."""

    by: dt.datetime | None
    overdue: bool
    person_checking: bool


def _expectation(operation: Operation, now: dt.datetime) -> Expectation | None:
    if operation.status != S.UNKNOWN:
        return None
    try:
        case = operation.reconciliation_case
    except ObjectDoesNotExist:
        return Expectation(by=None, overdue=False, person_checking=False)
    person = case.state == "awaiting_review"
    by = (case.review_deadline_at if person else None) or case.deadline_at
    return Expectation(by=by, overdue=by is not None and by <= now, person_checking=person)


def plain_time(moment: dt.datetime, now: dt.datetime) -> str:
    """"12:57 UTC" today, "1 Dec 2026, 12:57 UTC" on another day."""
    local, today = timezone.localtime(moment), timezone.localtime(now)
    if local.date() == today.date():
        return f"{local:%H:%M} {local.tzname()}"
    return f"{local.day} {local:%b %Y, %H:%M} {local.tzname()}"


def _int_param(request: HttpRequest, name: str) -> int:
    try:
        return max(0, min(int(request.GET.get(name, "0")), 1000))
    except ValueError:
        return 0


@require_GET
@never_cache
def status_page(request: HtmxHttpRequest, token: str) -> HttpResponse:
    operation = selectors.operation_get_by_status_token(token)
    if operation is None:
        # The same plain 404 for a wrong, guessed or malformed link: nothing to tell apart.
        raise Http404("No such page.")
    customer_status = CUSTOMER_STATUS[S(operation.status)]
    poll_number = _int_param(request, "n")
    paused = request.GET.get("paused") == "1"
    now = timezone.now()
    expectation = _expectation(operation, now)
    context = {
        "operation": operation,
        "customer_status": customer_status,
        "wording": WORDING.get(operation.tool, DEFAULT_WORDING),
        "reference": customer_reference(operation),
        "expectation": expectation,
        "expected_by": plain_time(expectation.by, now) if expectation and expectation.by else "",
        "org_name": settings.LEDGER_ORG_NAME,
        "org_contact": settings.LEDGER_ORG_CONTACT,
        "last_checked_at": _last_checked(operation),
        "terminal": operation.is_terminal,
        "paused": paused,
        "poll_number": poll_number,
        "next_poll": poll_number + 1,
        "delay": poll_delay(poll_number),
    }
    if not request.htmx:
        response = render(request, "portal/status.html", context)
    else:
        response = _partial_response(request, context, customer_status)
    patch_vary_headers(response, ["HX-Request"])
    response["X-Robots-Tag"] = "noindex, nofollow"
    return response


def _partial_response(
    request: HttpRequest, context: dict[str, Any], customer_status: str
) -> HttpResponse:
    part = request.GET.get("part", "poll")
    if part == "poller":  # pause / resume: only the controls change
        return render(request, "portal/status.html#poller", context)
    content = render_to_string("portal/status.html#poll-response", context, request=request)
    # 286 stops the poll at a terminal state; the final state is still swapped in.
    response = HttpResponseStopPolling(content) if context["terminal"] else HttpResponse(content)
    if request.GET.get("seen") == customer_status and part != "check":
        # Only the details and the next poll change: re-inserting the same sentence into the
        # live region would make screen readers announce it again on every poll.
        reswap(response, "none")
    return response
