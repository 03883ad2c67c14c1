"""The operations explorer: search, filters and keyset pagination over the whole ledger, and
everything one operation's page shows.

A page is one indexed range read, newest first on (created_at, id) — never OFFSET, never a
COUNT of the table — so page 1 and page 10,000 cost the same.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.db.models import Q, QuerySet
from django.utils import timezone

from ledger.models import AgentCredential, Operation, OperationEvent
from ledger.tools import UnknownTool, get_tool
from ops.figures import (
    UNRESOLVED,
    all_tool_versions,
    near_retention_q,
    past_lease_q,
    past_sla_q,
)
from reconciliation.models import Case, CaseEvent, Evidence

S = Operation.Status
PAGE_SIZE = 50
PROBLEMS = {
    "past_lease": "In flight past their lease",
    "past_sla": "Unknown past their SLA",
    "near_retention": "Key near provider retention",
}
SECRET_WORDS = ("secret", "password", "token", "api_key", "apikey", "authorization")


class ExplorerForm(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="Search",
                        help_text="Operation ID (or its beginning), run ID, agent, customer "
                                  "reference, provider reference or subject")
    status = forms.ChoiceField(required=False, choices=[("", "Any status"), *S.choices])
    tool = forms.CharField(required=False, max_length=64)
    provider = forms.CharField(required=False, max_length=64)
    agent = forms.CharField(required=False, max_length=100)
    since = forms.DateTimeField(required=False, label="Created from (UTC)",
                                input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
                                widget=forms.DateTimeInput(attrs={"type": "datetime-local"},
                                                           format="%Y-%m-%dT%H:%M"))
    until = forms.DateTimeField(required=False, label="Created before (UTC)",
                                input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
                                widget=forms.DateTimeInput(attrs={"type": "datetime-local"},
                                                           format="%Y-%m-%dT%H:%M"))
    problem = forms.ChoiceField(required=False, choices=[("", "Any"), *PROBLEMS.items()])
    after = forms.CharField(required=False, max_length=100, widget=forms.HiddenInput)

    def __init__(self, *args: Any, tools: list[str], providers: list[str], agents: list[str],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tool"] = forms.ChoiceField(
            required=False, choices=[("", "Any tool"), *[(t, t) for t in tools]])
        self.fields["provider"] = forms.ChoiceField(
            required=False, choices=[("", "Any provider"), *[(p, p) for p in providers]])
        self.fields["agent"] = forms.ChoiceField(
            required=False, choices=[("", "Any agent"), *[(a, a) for a in agents]])

    def clean_after(self) -> tuple[dt.datetime, int] | None:
        return decode_cursor(self.cleaned_data.get("after") or "")


def encode_cursor(operation: Operation) -> str:
    raw = f"{operation.created_at.isoformat()}|{operation.pk}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(value: str) -> tuple[dt.datetime, int] | None:
    if not value:
        return None
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
        created, pk = raw.split("|", 1)
        moment = dt.datetime.fromisoformat(created)
        if timezone.is_naive(moment):
            raise ValueError("naive")
        return moment, int(pk)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise forms.ValidationError(
            "This page link is not valid; start from the first page.") from None


def search_q(text: str) -> Q:
    """Exact matches on every identifier (each has an index), plus operation-ID prefixes."""
    text = text.strip()
    condition = (Q(operation_id=text) | Q(operation_id__startswith=text) | Q(run_id=text)
                 | Q(customer_ref=text) | Q(provider_request_id=text) | Q(subject=text))
    # The agent by name first (its own small table), so every arm of the OR is one index
    # lookup and PostgreSQL can combine them (BitmapOr) instead of scanning the ledger.
    agent_id = AgentCredential.objects.filter(name=text).values_list("pk", flat=True).first()
    return condition | Q(agent_id=agent_id) if agent_id is not None else condition


def filtered(data: Mapping[str, Any], now: dt.datetime | None = None) -> QuerySet[Operation]:
    now = now or timezone.now()
    rows = Operation.objects.all()
    if data.get("q"):
        rows = rows.filter(search_q(data["q"]))
    for name in ("status", "tool", "provider"):
        if data.get(name):
            rows = rows.filter(**{name: data[name]})
    if data.get("agent"):
        rows = rows.filter(agent__name=data["agent"])
    if data.get("since"):
        rows = rows.filter(created_at__gte=data["since"])
    if data.get("until"):
        rows = rows.filter(created_at__lt=data["until"])
    problem = data.get("problem")
    if problem:
        rows = rows.filter(status__in=UNRESOLVED)
        versions = all_tool_versions()
        rows = rows.filter({"past_lease": past_lease_q(now),
                            "past_sla": past_sla_q(now, versions),
                            "near_retention": near_retention_q(now, versions)}[problem])
    return rows


def _tools() -> set[str]:
    return {name for name, _ in all_tool_versions()}


def _providers() -> set[str]:
    from ledger.tools import catalogue

    return {tool.provider for versions in catalogue().versions.values()
            for tool in versions.values()}


def filter_choices() -> tuple[list[str], list[str], list[str]]:
    """Tools and providers from configuration; agents from their (small) table."""
    agents = list(AgentCredential.objects.order_by("name").values_list("name", flat=True)[:500])
    return sorted(_tools()), sorted(_providers()), agents


@dataclass
class Page:
    rows: list[Operation]
    next_cursor: str | None


def page(rows: QuerySet[Operation], after: tuple[dt.datetime, int] | None,
         size: int = PAGE_SIZE) -> Page:
    if after is not None:
        created, pk = after
        # created_at <= … alone bounds the index range (PostgreSQL cannot seek on the OR);
        # the OR then only breaks ties within one timestamp.
        rows = rows.filter(created_at__lte=created).filter(
            Q(created_at__lt=created) | Q(pk__lt=pk))
    found = list(rows.select_related("agent").order_by("-created_at", "-pk")[: size + 1])
    more = len(found) > size
    found = found[:size]
    return Page(found, encode_cursor(found[-1]) if more and found else None)


# --- one operation ---------------------------------------------------------------------------

@dataclass
class Attempt:
    fencing_token: int
    claimed_at: dt.datetime
    claimed_by: str
    reason: str
    outcome: str = ""
    answered_at: dt.datetime | None = None
    error_class: str = ""
    stale_results: int = 0

    @property
    def seconds(self) -> float | None:
        if self.answered_at is None:
            return None
        return (self.answered_at - self.claimed_at).total_seconds()


@dataclass
class TimelineEntry:
    at: dt.datetime
    source: str
    actor: str
    reason: str
    from_state: str
    to_state: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class OperationPage:
    operation: Operation
    intent: dict[str, Any]
    params: dict[str, Any]
    attempts: list[Attempt]
    timeline: list[TimelineEntry]
    case: Case | None
    evidence: list[Evidence]


def redact(params: Mapping[str, Any], secret_fields: tuple[str, ...]) -> dict[str, Any]:
    """The tool's secret fields, and anything named like a secret, never reach the page."""
    return {
        key: "[redacted]" if key in secret_fields
        or any(word in key.lower() for word in SECRET_WORDS) else value
        for key, value in params.items()
    }


def attempts_from(events: list[OperationEvent]) -> list[Attempt]:
    attempts: dict[int, Attempt] = {}
    for event in events:
        if event.to_status == S.IN_FLIGHT and event.from_status != S.IN_FLIGHT:
            attempts[event.fencing_token] = Attempt(event.fencing_token, event.created_at,
                                                    event.actor, event.reason)
        elif event.reason == "stale_result_ignored" and event.fencing_token in attempts:
            attempts[event.fencing_token].stale_results += 1
        elif event.from_status == S.IN_FLIGHT and event.fencing_token in attempts:
            attempt = attempts[event.fencing_token]
            attempt.outcome = f"{event.to_status} ({event.reason})"
            attempt.answered_at = event.created_at
            attempt.error_class = str((event.data or {}).get("error_class", ""))
    return list(attempts.values())


def operation_page(pk: int) -> OperationPage | None:
    operation = Operation.objects.select_related("agent").filter(pk=pk).first()
    if operation is None:
        return None
    try:
        secret_fields = tuple(get_tool(operation.tool, operation.tool_version).secret_fields)
    except UnknownTool:
        secret_fields = ()
    events = list(operation.events.order_by("created_at", "id"))
    case = Case.objects.filter(operation=operation).first()
    case_events: list[CaseEvent] = []
    evidence: list[Evidence] = []
    if case is not None:
        case_events = list(case.events.order_by("created_at", "id"))
        evidence = list(case.evidence.select_related("created_by").order_by("created_at", "id"))
    timeline = sorted(
        [TimelineEntry(e.created_at, "operation", e.actor, e.reason, e.from_status, e.to_status,
                       e.data or {}) for e in events]
        + [TimelineEntry(e.created_at, "case", e.actor, e.reason, e.from_state, e.to_state,
                         e.data or {}) for e in case_events],
        key=lambda entry: entry.at)
    return OperationPage(
        operation=operation,
        intent=redact(operation.intent_params, secret_fields),
        params=redact(operation.params, secret_fields),
        attempts=attempts_from(events),
        timeline=timeline,
        case=case,
        evidence=evidence,
    )
