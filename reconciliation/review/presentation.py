"""What the review pages show: labels, the evidence panel, and the words around them.

Reads and wording only; the writes are in reconciliation.review.services.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from ledger.models import Operation, OperationEvent
from ledger.money import format_money
from ledger.tools import Tool, UnknownTool, tool_of
from reconciliation.models import Case, CaseEvent, Decision, Evidence
from reconciliation.review.services import (
    _capabilities,
    key_retention_deadline,
    latest_definitive_evidence,
    resend_allowed,
    resend_deadline,
    staff_actor,
)

OpStatus = Operation.Status

# Labels for reconciliation.transitions.REVIEW_REASONS (unknown codes are shown humanised).
REVIEW_REASONS: dict[str, str] = dict(Case.ReviewReason.choices)


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
        threshold = tool_of(operation).four_eyes_thresholds.get(operation.value_currency)
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
    verdict: EvidenceVerdict
    decided_by: list[str]


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
        tool: Tool | None = tool_of(operation)
    except UnknownTool:
        tool = None
    op_events = list(operation.events.order_by("created_at", "id"))
    case_events = list(case.events.order_by("created_at", "id"))
    decisions = list(case.decisions.select_related(
        "decided_by", "approves", "approves__decided_by", "overrides_evidence",
    ).order_by("created_at", "id"))
    lookups = list(case.evidence.select_related("created_by").order_by("created_at", "id"))
    capabilities = _capabilities(operation)
    return EvidencePanel(
        tool=tool,
        intent_params=_redacted(tool, operation.intent_params),
        params=_redacted(tool, operation.params),
        attempts=_attempts(op_events),
        lookups=lookups,
        timeline=_timeline(op_events, case_events),
        notes=_notes(case_events, decisions),
        key_retention_deadline=key_retention_deadline(operation),
        resend_deadline=resend_deadline(operation),
        resend_allowed=resend_allowed(operation),
        honours_keys=bool(capabilities and capabilities.honours_idempotency_keys),
        decisions=decisions,
        verdict=evidence_verdict(case, lookups),
        decided_by=decided_by(case, decisions),
    )


# --- the one-line verdict at the top of the case page ----------------------------------------

@dataclass(frozen=True)
class EvidenceVerdict:
    text: str
    supports: str  # "confirm", "reject" or "" (neither)
    evidence: Evidence | None = None


def _at(evidence: Evidence) -> str:
    """"09:00:36 UTC on 30 Nov 2026": to the second, because lookups come seconds apart."""
    local = timezone.localtime(evidence.created_at)
    return f"{local:%H:%M:%S} {local.tzname()} on {local.day} {local:%b %Y}"


def _noun(operation: Operation) -> str:
    return {"refund": "refund", "send_email": "e-mail", "create_ticket": "ticket"}.get(
        operation.tool, "record")


def _differences(evidence: Evidence) -> str:
    response = evidence.response if isinstance(evidence.response, dict) else {}
    differences = response.get("differences") or {}
    if not isinstance(differences, dict) or not differences:
        return ""
    return ", ".join(sorted(str(name) for name in differences))


def evidence_verdict(case: Case, lookups: list[Evidence]) -> EvidenceVerdict:
    """What the evidence says, in one sentence: the latest definitive answer if there is one
    (the one a decision must not silently contradict), else the latest answer of any kind."""
    operation = case.operation
    noun = _noun(operation)
    definitive = latest_definitive_evidence(case)
    if definitive is not None:
        evidence = definitive.evidence
        kind = "re-send" if evidence.kind == "resend" else "lookup"
        if definitive.supports == Decision.Action.CONFIRM:
            what = (f"The provider has a matching {noun} — {kind} at {_at(evidence)}, all "
                    "intent fields equal" if evidence.outcome == "found_match" else
                    f"The provider confirmed the {noun} — same-key {kind} at {_at(evidence)}")
            return EvidenceVerdict(f"{what}: the evidence supports Confirm.", "confirm",
                                   evidence)
        what = (f"The provider has no {noun} — {kind} at {_at(evidence)}, after the "
                "consistency window, and its lookups are authoritative"
                if evidence.outcome == "not_found" else
                f"The provider rejected the {noun} — same-key {kind} at {_at(evidence)}")
        return EvidenceVerdict(f"{what}: the evidence supports Reject.", "reject", evidence)
    if not lookups:
        return EvidenceVerdict(
            f"Nobody has asked the provider about this {noun} yet: the evidence supports "
            "neither decision. Check the provider first.", "")
    latest = lookups[-1]
    at = _at(latest)
    outcome = latest.outcome
    if outcome in ("found_mismatch", "found_multiple", "found_not_succeeded"):
        fields = _differences(latest)
        differs = f" ({fields} differ)" if fields else ""
        text = (f"The provider's record does not match the intent{differs} — lookup at {at}: "
                "the evidence supports neither decision; find out which record is right.")
    elif outcome == "found_pending":
        text = (f"The provider is still executing the {noun} — lookup at {at}: wait and check "
                "again before deciding.")
    elif outcome == "not_found":
        text = (f"The provider found no {noun} — lookup at {at}, but its absence proves nothing "
                "yet (inside the consistency window, or its lookups are not authoritative): "
                "the evidence supports neither decision.")
    elif outcome == "unavailable":
        text = (f"The provider's lookup was unavailable at {at}: the evidence supports neither "
                "decision. Check again.")
    else:
        text = (f"The provider's last answer ({outcome.replace('_', ' ')}, at {at}) proves "
                "nothing either way: the evidence supports neither decision.")
    return EvidenceVerdict(text, "", latest)


def decided_by(case: Case, decisions: list[Decision]) -> list[str]:
    """Who decided a resolved case: the proposer and the approver for four eyes, else one."""
    applied = [d for d in decisions if d.status == Decision.Status.APPLIED]
    if not applied:
        return []
    last = applied[-1]
    if last.approves is not None:
        return [last.approves.decided_by.get_username(), last.decided_by.get_username()]
    return [last.decided_by.get_username()]
