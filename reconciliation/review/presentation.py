"""What the review pages show: labels, the evidence panel, and the words around them.

Reads and wording only; the writes are in reconciliation.review.services.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ledger.models import Operation, OperationEvent
from ledger.money import format_money
from ledger.providers import get_adapter
from ledger.tools import Tool, UnknownTool, get_tool
from reconciliation.models import Case, CaseEvent, Decision, Evidence
from reconciliation.review.services import (
    key_retention_deadline,
    resend_allowed,
    resend_deadline,
    staff_actor,
)

OpStatus = Operation.Status

# Labels for reconciliation.transitions.REVIEW_REASONS (unknown codes are shown humanised).
REVIEW_REASONS: dict[str, str] = {
    "high_value": "High value",
    "anomaly": "Provider record differs",
    "key_retention_passed": "Key retention passed",
    "deadline_passed": "Deadline passed",
    "not_found_not_authoritative": "Absent, not authoritative",
    "no_strategy": "No way to check",
    "manual": "Escalated by staff",
}


CHECK_OUTCOMES = {
    "found_match": "the provider has a record that matches the intent",
    "found_mismatch": "the provider has a record that does NOT match the intent",
    "found_multiple": "the provider has more than one record for it",
    "found_pending": "the provider is still executing it",
    "found_not_succeeded": "the provider has a record that did not succeed",
    "not_found": "the provider has no record",
    "unavailable": "the provider's lookup was unavailable",
}


def review_reason_label(code: str) -> str:
    return REVIEW_REASONS.get(code, code.replace("_", " ").capitalize() or "Escalated")


def review_reason_choices() -> list[tuple[str, str]]:
    return sorted(REVIEW_REASONS.items(), key=lambda item: item[1])


def four_eyes_threshold_display(operation: Operation) -> str:
    try:
        threshold = get_tool(operation.tool).four_eyes_threshold
    except UnknownTool:
        return ""
    if threshold is None:
        return ""
    if not operation.value_currency:
        return ""
    return format_money(threshold, operation.value_currency)

# --- the evidence panel --------------------------------------------------------------------

@dataclass
class Attempt:
    number: int
    fencing_token: int
    started_at: dt.datetime
    started_by: str
    reason: str
    outcome: str = "no answer recorded"
    outcome_at: dt.datetime | None = None
    error_class: str = ""
    stale_results: list[OperationEvent] = field(default_factory=list)


@dataclass
class TimelineEntry:
    at: dt.datetime
    source: str  # "operation" or "case"
    actor: str
    reason: str
    from_state: str
    to_state: str
    data: dict[str, Any]


@dataclass
class EvidencePanel:
    tool: Tool | None
    intent_params: dict[str, Any]
    params: dict[str, Any]
    attempts: list[Attempt]
    lookups: list[Evidence]
    timeline: list[TimelineEntry]
    notes: list[dict[str, Any]]
    key_retention_deadline: dt.datetime | None
    resend_deadline: dt.datetime | None
    resend_allowed: bool
    honours_keys: bool
    decisions: list[Decision]


def _attempts(events: Iterable[OperationEvent]) -> list[Attempt]:
    attempts: dict[int, Attempt] = {}
    for event in events:
        if event.to_status == OpStatus.IN_FLIGHT and event.from_status != OpStatus.IN_FLIGHT:
            attempts[event.fencing_token] = Attempt(
                number=len(attempts) + 1, fencing_token=event.fencing_token,
                started_at=event.created_at, started_by=event.actor, reason=event.reason,
            )
        elif event.reason == "stale_result_ignored" and event.fencing_token in attempts:
            attempts[event.fencing_token].stale_results.append(event)
        elif event.from_status == OpStatus.IN_FLIGHT and event.fencing_token in attempts:
            attempt = attempts[event.fencing_token]
            attempt.outcome = f"{event.to_status} ({event.reason})"
            attempt.outcome_at = event.created_at
            attempt.error_class = str(event.data.get("error_class", ""))
    return list(attempts.values())


def _redacted(tool: Tool | None, params: Mapping[str, Any]) -> dict[str, Any]:
    return tool.redacted(params) if tool else dict(params)


def _timeline(op_events: list[OperationEvent], case_events: list[CaseEvent]
              ) -> list[TimelineEntry]:
    entries = [
        TimelineEntry(at=e.created_at, source="operation", actor=e.actor, reason=e.reason,
                      from_state=e.from_status, to_state=e.to_status, data=e.data)
        for e in op_events
    ] + [
        TimelineEntry(at=e.created_at, source="case", actor=e.actor, reason=e.reason,
                      from_state=e.from_state, to_state=e.to_state, data=e.data)
        for e in case_events
    ]
    return sorted(entries, key=lambda entry: entry.at)


def _notes(case_events: list[CaseEvent], decisions: list[Decision]) -> list[dict[str, Any]]:
    """Free notes and every decision's note, oldest first."""
    notes = [
        {"at": e.created_at, "actor": e.actor, "text": e.data.get("note", ""), "kind": "note"}
        for e in case_events if e.reason == "note_added"
    ] + [
        {"at": d.created_at, "actor": staff_actor(d.decided_by), "text": d.note,
         "kind": f"{d.get_action_display()} ({d.get_status_display().lower()})"}
        for d in decisions
    ]
    return sorted(notes, key=lambda note: note["at"])


def case_evidence(case: Case) -> EvidencePanel:
    """Everything a reviewer needs to decide, read in five queries."""
    operation = case.operation
    try:
        tool: Tool | None = get_tool(operation.tool)
    except UnknownTool:
        tool = None
    op_events = list(operation.events.order_by("created_at", "id"))
    case_events = list(case.events.order_by("created_at", "id"))
    decisions = list(case.decisions.select_related("decided_by", "approves").order_by(
        "created_at", "id"))
    return EvidencePanel(
        tool=tool,
        intent_params=_redacted(tool, operation.intent_params),
        params=_redacted(tool, operation.params),
        attempts=_attempts(op_events),
        lookups=list(case.evidence.select_related("created_by").order_by("created_at", "id")),
        timeline=_timeline(op_events, case_events),
        notes=_notes(case_events, decisions),
        key_retention_deadline=key_retention_deadline(operation),
        resend_deadline=resend_deadline(operation),
        resend_allowed=resend_allowed(operation),
        honours_keys=get_adapter(operation.provider).capabilities.honours_idempotency_keys,
        decisions=decisions,
    )
