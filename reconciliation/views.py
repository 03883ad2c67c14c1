"""The operators' review queue (staff with reconciliation.review_case only).

Every action is a plain POST form that works without JavaScript (redirect after success, the
page re-rendered with the message after a refusal). With htmx the same URL answers with the
partial that changed plus an out-of-band update of the page's persistent role="status" region.
Refusals answer 409 (conflict) or 422 (invalid input); base.html tells htmx to swap those too.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render, resolve_url
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from config.http import HtmxHttpRequest
from reconciliation.forms import (
    ApprovalForm,
    DecisionForm,
    NoteForm,
    QueueFilterForm,
    WithdrawForm,
)
from reconciliation.models import Case, Decision
from reconciliation.review import presentation, selectors, services

if TYPE_CHECKING:
    from django.contrib.auth.models import User

REVIEW_PERMISSION = "reconciliation.review_case"
FILTER_NAMES = ("tool", "provider", "reason", "currency", "min_value", "max_value", "age")

View = Callable[..., HttpResponse]


class ReviewRequest(HtmxHttpRequest):
    """For the type checker: a request that review_required let through, from a signed-in,
    active staff member with the review permission. Never instantiated."""

    user: User
    # Notices for this response's out-of-band live region; set by _notify on htmx requests
    # only, so they are read with getattr.
    _review_notices: list[dict[str, str]]


def may_review(user: Any) -> bool:
    return bool(user.is_authenticated and user.is_active and user.is_staff
                and user.has_perm(REVIEW_PERMISSION))


def review_required(view: View) -> View:
    """Anonymous visitors (an agent's bearer token is not a session) go to the login page;
    signed-in users without staff status and the review permission get 403."""

    @wraps(view)
    def wrapped(request: HtmxHttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            back = request.get_full_path() if request.method == "GET" else reverse("review:queue")
            if request.htmx:
                login = resolve_url(settings.LOGIN_URL)
                return HttpResponseClientRedirect(f"{login}?{urlencode({'next': back})}")
            return redirect_to_login(back)
        if not may_review(request.user):
            raise PermissionDenied("review permission required")
        response = view(request, *args, **kwargs)
        patch_vary_headers(response, ["HX-Request"])
        return response

    return wrapped


# --- telling the reviewer what happened --------------------------------------------------

def _notify(request: ReviewRequest, level: str, text: str) -> None:
    """With htmx the notice goes out of band into the live region of this response; without,
    it waits in the session for the page the redirect leads to."""
    if request.htmx:
        request._review_notices = [*getattr(request, "_review_notices", []),
                                   {"level": level, "text": text}]
    else:
        messages.add_message(request, getattr(messages, level.upper()), text)


def _htmx(request: HttpRequest, template: str, context: dict[str, Any],
          status: int = 200) -> HttpResponse:
    body = render_to_string(template, context, request=request)
    notices = getattr(request, "_review_notices", [])
    body += render_to_string("reconciliation/includes/announcer_oob.html",
                             {"notices": notices}, request=request)
    return HttpResponse(body, status=status)


def _safe_next(request: HttpRequest, fallback: str) -> str:
    target = request.POST.get("next") or ""
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return fallback


# --- the queue -----------------------------------------------------------------------------

def _filter_query(form: QueueFilterForm) -> str:
    """The filters as a query string (without tab and cursor), for tab and pager links."""
    pairs = [(name, form.data.get(name, "")) for name in FILTER_NAMES]
    return urlencode([(k, v) for k, v in pairs if v])


def _int(value: str | None) -> int | None:
    try:
        number = int(value or "")
    except ValueError:
        return None
    return number if number > 0 else None


@require_GET
@review_required
def queue(request: ReviewRequest) -> HttpResponse:
    tab = request.GET.get("tab", selectors.DEFAULT_TAB)
    if tab not in selectors.TABS:
        tab = selectors.DEFAULT_TAB
    form = QueueFilterForm(request.GET)
    filters = form.filters()
    now = timezone.now()
    queryset = selectors.case_queue(user=request.user, tab=tab, filters=filters, now=now)
    page = selectors.case_queue_page(queryset, after=_int(request.GET.get("after")),
                                  before=_int(request.GET.get("before")))
    counts = selectors.case_tab_counts(user=request.user, filters=filters, now=now)
    filter_query = _filter_query(form)
    tab_query = f"tab={tab}" + (f"&{filter_query}" if filter_query else "")
    context = {
        "tab": tab,
        "tabs": [(key, label, *counts[key]) for key, label in selectors.TABS.items()],
        "form": form,
        "page": page,
        "filter_query": filter_query,
        "tab_query": tab_query,
        "now": now,
        "since_event": selectors.review_cursor(),
        "new_count": 0,
        "list_url": request.get_full_path(),
        "refresh_url": f"{reverse('review:queue')}?{tab_query}",
        "filters_active": any(form.data.get(name) for name in FILTER_NAMES),
    }
    if request.htmx and request.htmx.target == "queue-results":
        return render(request, "reconciliation/queue.html#results", context)
    return render(request, "reconciliation/queue.html", context)


@require_GET
@review_required
def new_arrivals(request: ReviewRequest) -> HttpResponse:
    """Polled by the queue: "N new — refresh". Never inserts rows under the reviewer's
    cursor; the reviewer decides when to reload."""
    since = _int(request.GET.get("since")) or 0
    refresh_url = request.GET.get("list") or ""
    if not url_has_allowed_host_and_scheme(refresh_url, allowed_hosts={request.get_host()}):
        refresh_url = reverse("review:queue")
    if not request.htmx:
        return HttpResponseRedirect(refresh_url)
    count, capped = selectors.case_new_arrivals(since_event=since)
    if count == (_int(request.GET.get("shown")) or 0):
        return HttpResponse(status=204)  # nothing new to say: no swap, no announcement
    context = {"new_count": count, "new_capped": capped, "since_event": since,
               "refresh_url": refresh_url}
    return render(request, "reconciliation/queue.html#new-arrivals", context)


# --- the case page -------------------------------------------------------------------------

def _case_or_404(pk: int) -> Case:
    try:
        return selectors.case_get_for_review(pk)
    except Case.DoesNotExist:
        raise Http404("No such case.") from None


def _case_context(request: ReviewRequest, case: Case, **forms: Any) -> dict[str, Any]:
    now = timezone.now()
    operation = case.operation
    panel = presentation.case_evidence(case)
    # Prefetched (to_attr) by case_get_for_review.
    pending_decisions: list[Decision] | None = getattr(case, "pending_decisions", None)
    pending = pending_decisions[0] if pending_decisions else None
    holds = services.holds_claim(case, request.user, now)
    initial = {"params_hash": operation.params_hash}
    context = {
        "case": case,
        "operation": operation,
        "panel": panel,
        "now": now,
        "holds_claim": holds,
        "claim_live": services.claim_is_live(case, now),
        "pending": pending,
        "four_eyes": services.needs_four_eyes(operation),
        "four_eyes_threshold": presentation.four_eyes_threshold_display(operation),
        "is_open": case.state == Case.State.AWAITING_REVIEW,
        "decision_form": forms.get("decision_form") or DecisionForm(
            initial=initial, resend_allowed=panel.resend_allowed,
            amount=operation.value_amount, currency=operation.value_currency),
        "approval_form": forms.get("approval_form") or (
            ApprovalForm(initial=initial, action=pending.action) if pending else None),
        "withdraw_form": forms.get("withdraw_form") or WithdrawForm(),
        "note_form": forms.get("note_form") or NoteForm(),
        "reason_label": presentation.review_reason_label(case.review_reason),
    }
    return context


def _render_case(request: ReviewRequest, case_pk: int, *, status: int = 200,
                 **forms: Any) -> HttpResponse:
    case = _case_or_404(case_pk)
    context = _case_context(request, case, **forms)
    if request.htmx:
        return _htmx(request, "reconciliation/case.html#case-body", context, status=status)
    return render(request, "reconciliation/case.html", context, status=status)


@require_GET
@review_required
def case_detail(request: ReviewRequest, pk: int) -> HttpResponse:
    if request.htmx:
        return _render_case(request, pk)
    case = _case_or_404(pk)
    return render(request, "reconciliation/case.html", _case_context(request, case))


def _after_action(request: ReviewRequest, case_pk: int, *,
                  error: services.ReviewError | None = None, **forms: Any) -> HttpResponse:
    """Success: redirect (no JS) or the fresh case body (htmx). Refusal: the page or body
    re-rendered with the message, 409 or 422."""
    if error is not None:
        _notify(request, "error", error.message)
        return _render_case(request, case_pk, status=error.status_code, **forms)
    if forms:  # invalid form
        return _render_case(request, case_pk, status=422, **forms)
    if request.htmx:
        return _render_case(request, case_pk)
    return HttpResponseRedirect(_safe_next(request, reverse("review:case", args=[case_pk])))


# --- claims ----------------------------------------------------------------------------------

def _claim_response(request: ReviewRequest, case_pk: int, *, error: services.ReviewError | None,
                    ) -> HttpResponse:
    if request.POST.get("from") != "queue":
        return _after_action(request, case_pk, error=error)
    # From a queue row: swap just that row.
    if error is not None:
        _notify(request, "error", error.message)
    if not request.htmx:
        return HttpResponseRedirect(_safe_next(request, reverse("review:queue")))
    case = _case_or_404(case_pk)
    context = {"case": case, "now": timezone.now(), "list_url": _safe_next(
        request, reverse("review:queue"))}
    return _htmx(request, "reconciliation/queue.html#row", context,
                 status=error.status_code if error else 200)


@require_POST
@review_required
def claim(request: ReviewRequest, pk: int) -> HttpResponse:
    try:
        case = services.case_claim(case_id=pk, user=request.user)
    except Case.DoesNotExist:
        raise Http404("No such case.") from None
    except services.ReviewError as error:
        return _claim_response(request, pk, error=error)
    _notify(request, "success",
            f"You hold case {pk} until {services.when(case.claim_expires_at)}.")
    return _claim_response(request, pk, error=None)


@require_POST
@review_required
def release(request: ReviewRequest, pk: int) -> HttpResponse:
    try:
        services.case_release(case_id=pk, user=request.user)
    except Case.DoesNotExist:
        raise Http404("No such case.") from None
    except services.ReviewError as error:
        return _claim_response(request, pk, error=error)
    _notify(request, "info", f"You released case {pk}; anyone can claim it now.")
    return _claim_response(request, pk, error=None)


BULK_LIMIT = 100


@require_POST
@review_required
def bulk_claim(request: ReviewRequest) -> HttpResponse:
    """Claim or release the ticked rows of the queue together (a plain form: no JS needed).
    Each case goes through the same service as its own button; one refusal does not stop the
    others, and the reviewer is told exactly which cases changed and which did not."""
    action = request.POST.get("action")
    back = _safe_next(request, reverse("review:queue"))
    ids = sorted({pk for pk in (_int(v) for v in request.POST.getlist("case")) if pk})
    if action not in ("claim", "release") or not ids:
        _notify(request, "error", "Tick at least one case, then choose Claim or Release.")
        return HttpResponseRedirect(back)
    if len(ids) > BULK_LIMIT:
        _notify(request, "error", f"Tick at most {BULK_LIMIT} cases at a time. Nothing changed.")
        return HttpResponseRedirect(back)
    act = services.case_claim if action == "claim" else services.case_release
    done: list[str] = []
    for pk in ids:
        try:
            act(case_id=pk, user=request.user)
        except Case.DoesNotExist:
            _notify(request, "error", f"Case {pk} does not exist.")
        except services.ReviewError as error:
            _notify(request, "error", f"Case {pk}: {error.message}")
        else:
            done.append(str(pk))
    if done:
        verb = "You now hold" if action == "claim" else "You released"
        noun = "case" if len(done) == 1 else "cases"
        _notify(request, "success", f"{verb} {noun} {', '.join(done)}.")
    return HttpResponseRedirect(back)


# --- decisions ---------------------------------------------------------------------------

@require_POST
@review_required
def decide(request: ReviewRequest, pk: int) -> HttpResponse:
    case = _case_or_404(pk)
    panel_allows_resend = services.resend_allowed(case.operation)
    form = DecisionForm(request.POST, resend_allowed=panel_allows_resend,
                        amount=case.operation.value_amount,
                        currency=case.operation.value_currency)
    if not form.is_valid():
        _notify(request, "error", "The decision was not recorded: check the fields marked.")
        return _after_action(request, pk, decision_form=form)
    data = form.cleaned_data
    try:
        outcome = services.case_decide(
            case_id=pk, user=request.user, action=data["action"],
            reason_code=data["reason_code"], note=data["note"], params_hash=data["params_hash"],
            override_reason=data.get("override_reason") or "",
            amount_checked=data.get("amount_checked"),
        )
    except services.ReviewError as error:
        return _after_action(request, pk, error=error, decision_form=form)
    _notify(request, "success", outcome.message)
    return _after_action(request, pk)


def _decision_or_404(pk: int) -> Decision:
    try:
        return Decision.objects.select_related("case").get(pk=pk)
    except Decision.DoesNotExist:
        raise Http404("No such decision.") from None


@require_POST
@review_required
def approve(request: ReviewRequest, pk: int) -> HttpResponse:
    proposal = _decision_or_404(pk)
    form = ApprovalForm(request.POST, action=proposal.action)
    if not form.is_valid():
        _notify(request, "error", "The approval was not recorded: check the fields marked.")
        return _after_action(request, proposal.case_id, approval_form=form)
    data = form.cleaned_data
    try:
        outcome = services.decision_approve(
            decision_id=pk, user=request.user, reason_code=data["reason_code"],
            note=data["note"], params_hash=data["params_hash"],
        )
    except services.ReviewError as error:
        return _after_action(request, proposal.case_id, error=error, approval_form=form)
    _notify(request, "success", outcome.message)
    return _after_action(request, proposal.case_id)


@require_POST
@review_required
def withdraw(request: ReviewRequest, pk: int) -> HttpResponse:
    proposal = _decision_or_404(pk)
    form = WithdrawForm(request.POST)
    form.is_valid()
    try:
        withdrawn = services.decision_withdraw(decision_id=pk, user=request.user,
                                             note=form.cleaned_data.get("note", ""))
    except services.ReviewError as error:
        return _after_action(request, proposal.case_id, error=error, withdraw_form=form)
    own = withdrawn.decided_by_id == request.user.pk
    _notify(request, "info", "You withdrew your proposal." if own else
            "You declined the proposal; the case is open for a new decision.")
    return _after_action(request, proposal.case_id)


# --- evidence and notes ----------------------------------------------------------------------

@require_POST
@review_required
def check_provider(request: ReviewRequest, pk: int) -> HttpResponse:
    try:
        evidence = services.case_check_provider(case_id=pk, user=request.user)
    except Case.DoesNotExist:
        raise Http404("No such case.") from None
    except services.ReviewError as error:
        return _after_action(request, pk, error=error)
    answer = presentation.CHECK_OUTCOMES.get(evidence.outcome, evidence.outcome.replace("_", " "))
    resolved = Case.objects.filter(pk=pk, state=Case.State.RESOLVED).exists()
    _notify(request, "info", f"Checked the provider: {answer}. "
            + ("That proves the outcome: the case is resolved." if resolved
               else "The answer was added to the evidence."))
    return _after_action(request, pk)


@require_POST
@review_required
def add_note(request: ReviewRequest, pk: int) -> HttpResponse:
    _case_or_404(pk)
    form = NoteForm(request.POST)
    if not form.is_valid():
        _notify(request, "error", "The note is empty or too long.")
        return _after_action(request, pk, note_form=form)
    try:
        services.case_add_note(case_id=pk, user=request.user, text=form.cleaned_data["text"])
    except services.ReviewError as error:
        return _after_action(request, pk, error=error, note_form=form)
    _notify(request, "success", "Note added.")
    return _after_action(request, pk)
