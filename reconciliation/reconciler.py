"""The reconciler: DESIGN §5 for one case, in that order.

1. Same-key re-send while the stored key is inside the provider's retention minus a safety
   margin (never for high-value tools). A 409 means the provider is still executing: look later.
2. Lookup by provider request ID, key or reference; every intent field, the reference and the
   status must match. Match → succeeded. Found but different, or found twice → anomaly → review.
   Not found inside the consistency window → poll again with backoff and jitter; after it →
   failed where absence is authoritative, review where it is not.
3. Review when neither is possible, when the key's retention or the case deadline has passed
   (no request is sent then), on an anomaly, and always at or above the high-value threshold.

No database transaction or row lock is held across a provider call: a re-send is claimed (one
commit), sent, and its outcome persisted with the fencing token (a second commit). Nothing here
ever derives a new key: the only key sent is the one stored on the operation.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ledger import executor, metrics
from ledger import transitions as ledger_transitions
from ledger.models import Operation
from ledger.providers.base import (
    Capabilities,
    Confirmed,
    Found,
    LookupOutcome,
    NotFound,
    NotSent,
    ProviderAdapter,
    Rejected,
    SendOutcome,
    Unavailable,
    Unknown,
    UnknownReason,
)
from ledger.tools import Tool, tool_of
from reconciliation import transitions
from reconciliation.models import Case, Evidence

logger = logging.getLogger(__name__)

ACTOR = "reconciler"
C = Case.State
S = Operation.Status

# Provider statuses that mean "accepted, still executing": look again later.
PENDING_STATUSES = frozenset({"pending", "processing", "in_progress"})


# --- verdicts: what one answer from the provider proves ------------------------------------

@dataclass(frozen=True)
class Verdict:
    outcome: str  # found_match, found_mismatch, found_multiple, found_pending, not_found, ...
    proves_success: bool = False
    proves_absence: bool = False
    anomaly: bool = False
    differences: dict[str, dict[str, Any]] = field(default_factory=dict)


def judge_lookup(operation: Operation, tool: Tool, answer: LookupOutcome, *,
                 absence_is_proof: bool) -> Verdict:
    """absence_is_proof: the consistency window has closed and the provider's lookups are
    authoritative, so "not found" means it did not happen."""
    match answer:
        case Unavailable():
            return Verdict("unavailable")
        case NotFound():
            return Verdict("not_found", proves_absence=absence_is_proof)
        case Found():
            differences = field_differences(operation, tool, answer)
            if answer.matches > 1:
                return Verdict("found_multiple", anomaly=True, differences=differences)
            if differences:
                return Verdict("found_mismatch", anomaly=True, differences=differences)
            if answer.status in PENDING_STATUSES:
                return Verdict("found_pending")
            if answer.status != "succeeded":
                return Verdict("found_not_succeeded", anomaly=True,
                               differences={"status": {"expected": "succeeded",
                                                       "found": answer.status}})
            return Verdict("found_match", proves_success=True)
    raise TypeError(f"unexpected lookup outcome {answer!r}")


def field_differences(operation: Operation, tool: Tool, found: Found) -> dict[str, dict[str, Any]]:
    """Every intent field (payee, amount, currency, invoice / to, template, subject / …) and
    our reference, compared with what the provider holds."""
    expected = {name: operation.intent_params.get(name) for name in tool.intent_fields}
    expected["reference"] = operation.operation_id
    return {
        name: {"expected": value, "found": found.fields.get(name)}
        for name, value in expected.items()
        if found.fields.get(name) != value
    }


def verdict_for_send(outcome_name: str) -> Verdict:
    """What a provider's answer to a send (with our key) proves about the original attempt."""
    if outcome_name == "Confirmed":
        return Verdict("confirmed", proves_success=True)
    if outcome_name == "Rejected":
        return Verdict("rejected", proves_absence=True)
    return Verdict(outcome_name.lower())


def contradicts(*, resolved_as: str, send_outcome: str | None = None,
                verdict: Verdict | None = None) -> bool:
    """Does new evidence disagree with the operation's resolution (succeeded or failed)?"""
    verdict = verdict or verdict_for_send(send_outcome or "")
    if resolved_as == S.SUCCEEDED:
        return verdict.proves_absence or verdict.anomaly
    if resolved_as == S.FAILED:
        return verdict.proves_success or verdict.anomaly or verdict.outcome == "found_pending"
    return False


# --- timing ----------------------------------------------------------------------------------

def backoff_seconds(attempt: int, *, rng: random.Random | None = None) -> float:
    """Exponential backoff with "equal jitter": half the step fixed, half random, so checks
    of many cases that failed together spread out instead of hitting the provider at once."""
    base = float(settings.RECONCILIATION_BACKOFF_BASE_SECONDS)
    cap = float(settings.RECONCILIATION_BACKOFF_MAX_SECONDS)
    step = min(cap, base * 2 ** max(0, min(attempt - 1, 30)))
    return step / 2 + (rng or random).uniform(0, step / 2)


def resend_allowed_until(operation: Operation, caps: Capabilities) -> dt.datetime | None:
    """Until when a same-key re-send is safe; None when the provider takes no keys (or does
    not say how long it keeps them), and always for a client-executed operation: the agent
    made that call, the ledger does not hold it, so nothing re-sends on the agent's behalf."""
    if operation.execution == Operation.Execution.CLIENT:
        return None
    if not caps.can_send or not caps.honours_idempotency_keys or not caps.key_retention_seconds:
        return None
    if tool_of(operation).withholds(operation.params):
        return None  # its secret fields were never stored: a re-send cannot repeat them
    if operation.key_first_sent_at is None:
        return None
    margin = settings.RECONCILIATION_KEY_RETENTION_MARGIN_SECONDS
    return operation.key_first_sent_at + dt.timedelta(
        seconds=caps.key_retention_seconds - margin)


def consistency_window_closes_at(operation: Operation, tool: Tool,
                                 caps: Capabilities) -> dt.datetime:
    """A lookup can miss a committed effect until the provider's index caught up with the last
    request we may have sent (which itself may have taken up to the request timeout)."""
    sent_at = operation.sent_at or operation.updated_at
    if operation.execution == Operation.Execution.CLIENT:
        # The agent may have sent at any moment of its claim (heartbeats extend it): count from
        # when the claim ended, which is when the operation became unknown.
        sent_at = max(sent_at, operation.updated_at)
    return sent_at + dt.timedelta(
        seconds=executor.request_timeout(tool) + caps.lookup_consistency_seconds)


# --- the strategy ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    strategy: str  # resend, lookup, escalate
    reason: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def plan_for(case: Case, operation: Operation, tool: Tool, caps: Capabilities,
             now: dt.datetime, *, last_resend_ambiguous: bool = False) -> Plan:
    # Retention first: it is the more specific (and more dangerous) reason when both passed.
    until = resend_allowed_until(operation, caps)
    if until is not None and now >= until:
        return Plan("escalate", "key_retention_passed",
                    {"key_first_sent_at": operation.key_first_sent_at,
                     "resend_allowed_until": until})
    if now >= case.deadline_at:
        return Plan("escalate", "deadline_passed", {"deadline_at": case.deadline_at})
    if tool.is_high_value(operation.value_amount, operation.value_currency):
        if caps.can_lookup:
            return Plan("lookup", "high_value")
        return Plan("escalate", "high_value")
    if until is not None and not (last_resend_ambiguous and caps.can_lookup):
        return Plan("resend")
    if caps.can_lookup:
        # Also after a re-send that came back ambiguous: a provider that stores and replays
        # its 5xx under our key (Stripe does) would answer the same forever; a lookup can tell.
        return Plan("lookup")
    return Plan("escalate", "no_strategy")


def reconcile_case(case_id: int, *, lease: transitions.CaseLease | None = None) -> str:
    """One check of one case. Returns what happened (for logs, sweep reports and tests)."""
    if lease is not None:
        lease = transitions.case_renew_lease(
            lease=lease, visibility_seconds=settings.RECONCILIATION_CASE_VISIBILITY_SECONDS)
        if lease is None:
            return "skipped"  # another sweeper holds it now
    case = Case.objects.select_related("operation").get(pk=case_id)
    if case.state != C.CHECKING:
        return "skipped"
    try:
        outcome = str(_check(case, case.operation))
    except Exception as exc:
        if lease is not None:
            _release_after_error(case, lease, exc)
        raise
    logger.info("case checked", extra={"case_id": case.pk, "outcome": outcome,
                                       "operation_id": case.operation.operation_id})
    return outcome


def _release_after_error(case: Case, lease: transitions.CaseLease, exc: Exception) -> None:
    """A check that raised (a database hiccup, a bug) gives its case back after the backoff
    instead of hiding it until the lease runs out. Best effort: when the database is what
    failed, this may fail too, and the lease running out remains the safety net."""
    try:
        transitions.case_check_failed(
            lease=lease, actor=ACTOR, error_class=type(exc).__name__,
            next_check_at=timezone.now() + dt.timedelta(
                seconds=backoff_seconds(case.attempts + 1)))
    except Exception:
        logger.exception("could not give case %s back after a failed check", case.pk)


def _check(case: Case, operation: Operation) -> str:
    if operation.is_terminal:
        with transaction.atomic():
            transitions.case_close_for_operation(operation=operation, actor=ACTOR,
                                                 reason="operation_already_resolved")
        return "closed"
    if operation.status != S.UNKNOWN:
        # in_flight: a re-send (ours or a person's) holds the row; if its worker dies the
        # lease sweeper makes it unknown again. prepared: a re-send that provably never left,
        # which the ledger's unsent sweeper sends again with the same key. Either way: later.
        later = max(operation.lease_expires_at or timezone.now(),
                    timezone.now() + dt.timedelta(seconds=backoff_seconds(case.attempts + 1)))
        transitions.case_reschedule(case=case, next_check_at=later, actor=ACTOR,
                                    reason=f"operation_{operation.status}")
        return "rescheduled"
    tool = tool_of(operation)
    adapter = tool.adapter
    last = case.evidence.order_by("-id").values_list("kind", "outcome").first()
    plan = plan_for(case, operation, tool, adapter.capabilities, timezone.now(),
                    last_resend_ambiguous=last == ("resend", "unknown"))
    if plan.strategy == "resend":
        return _resend(case, operation, tool, adapter)
    if plan.strategy == "lookup":
        return _lookup(case, operation, tool, adapter, high_value=plan.reason == "high_value")
    transitions.case_escalate(case=case, reason=plan.reason, actor=ACTOR, data=plan.data)
    return "escalated"


# --- strategy 1: same-key re-send ------------------------------------------------------------

def _resend(case: Case, operation: Operation, tool: Tool, adapter: ProviderAdapter) -> str:
    claim = ledger_transitions.operation_claim(
        operation, worker=f"{ACTOR}@{executor.worker_name()}", lease_seconds=tool.lease_seconds,
        from_status=S.UNKNOWN, reason="reconciler_resend")
    if claim is None:
        transitions.case_reschedule(case=case, next_check_at=_backoff_from_now(case),
                                    actor=ACTOR, reason="claim_lost", strategy="resend")
        return "rescheduled"
    outcome = send_same_key(claim, tool, adapter)
    with transaction.atomic():
        current, _ = persist_resend(case=case, claim=claim, outcome=outcome, actor=ACTOR)
        return _after_resend(case, current, outcome)


def send_same_key(claim: ledger_transitions.Claim, tool: Tool,
                  adapter: ProviderAdapter) -> SendOutcome:
    """Send the claimed operation again with the key stored on its row, and nothing else."""
    operation = claim.operation
    if not operation.idempotency_key:
        raise RuntimeError(f"operation {operation.operation_id} has no stored key")
    outcome = adapter.send(operation, key=operation.idempotency_key,
                           timeout=executor.request_timeout(tool))
    metrics.count_send_outcome(operation.provider, outcome)
    return outcome


def persist_resend(*, case: Case, claim: ledger_transitions.Claim, outcome: SendOutcome,
                   actor: str, user: Any = None) -> tuple[Operation, Evidence]:
    """The outcome of a same-key re-send, fenced, plus its evidence row. Caller holds the
    transaction, so both (and the case's resolution, via the ledger's signal) commit together.
    """
    if isinstance(outcome, NotSent):
        # This attempt never left, but the one before it is still unproven: back to unknown,
        # not to prepared (which would invite a fresh send outside reconciliation).
        current = _back_to_unknown(claim, outcome, actor)
    else:
        current = executor.persist_outcome(claim, outcome, actor=actor)
    evidence = transitions.case_record_evidence(
        case=case, kind="resend", actor=actor, user=user, outcome=_send_outcome_name(outcome),
        request={"provider": claim.operation.provider, "reference": claim.operation.operation_id,
                 "idempotency_key": claim.operation.idempotency_key,
                 "fencing_token": claim.fencing_token},
        response=_send_response(outcome) | {"operation_status": current.status},
    )
    return current, evidence


def _back_to_unknown(claim: ledger_transitions.Claim, outcome: NotSent, actor: str) -> Operation:
    try:
        return ledger_transitions.operation_mark_unknown(
            operation=claim.operation, fencing_token=claim.fencing_token,
            error_class=outcome.error_class, actor=actor, reason="resend_not_sent")
    except ledger_transitions.TransitionError:
        ledger_transitions.operation_record_stale_result(
            operation=claim.operation, fencing_token=claim.fencing_token, outcome="NotSent",
            data={"error_class": outcome.error_class}, actor=actor)
        return Operation.objects.get(pk=claim.operation.pk)


def _after_resend(case: Case, operation: Operation, outcome: SendOutcome) -> str:
    if operation.is_terminal:
        transitions.case_note_check(case=case, strategy="resend")
        return operation.status  # the ledger's signal resolved the case in this transaction
    if isinstance(outcome, Unknown) and outcome.reason is UnknownReason.KEY_REUSED:
        # Our key is stored with other params at the provider: something else used it.
        transitions.case_note_check(case=case, strategy="resend")
        transitions.case_escalate(case=case, reason="anomaly", actor=ACTOR,
                                  data={"error_class": outcome.error_class})
        return "escalated"
    reason = "provider_in_progress" if isinstance(outcome, Unknown) and outcome.in_progress \
        else f"resend_{_send_outcome_name(outcome)}"
    transitions.case_reschedule(case=case, next_check_at=_backoff_from_now(case), actor=ACTOR,
                                reason=reason, strategy="resend",
                                data={"error_class": getattr(outcome, "error_class", "")})
    return "rescheduled"


def _send_outcome_name(outcome: SendOutcome) -> str:
    if isinstance(outcome, Unknown) and outcome.in_progress:
        return "in_progress"
    return {Confirmed: "confirmed", Rejected: "rejected", NotSent: "not_sent",
            Unknown: "unknown"}[type(outcome)]


def _send_response(outcome: SendOutcome) -> dict[str, Any]:
    if isinstance(outcome, Confirmed):
        return {"outcome": "Confirmed", "provider_request_id": outcome.provider_request_id,
                "replayed": outcome.replayed, "result": outcome.result}
    data: dict[str, Any] = {"outcome": type(outcome).__name__,
                            "error_class": outcome.error_class}
    if isinstance(outcome, Unknown):
        data["reason"] = str(outcome.reason)
    return data


# --- strategy 2: lookup -------------------------------------------------------------------

def lookup_request(operation: Operation, adapter: ProviderAdapter) -> dict[str, Any]:
    """Exactly what the adapter's lookup asks the provider (kept as evidence)."""
    return {"provider": operation.provider, **adapter.lookup_query(operation)}


def look_up(operation: Operation, tool: Tool,
            adapter: ProviderAdapter) -> tuple[dict[str, Any], LookupOutcome, Verdict]:
    """One lookup (outside any transaction) and what it proves."""
    caps = adapter.capabilities
    asked_at = timezone.now()
    answer = adapter.lookup(operation, timeout=executor.request_timeout(tool))
    window_closes_at = consistency_window_closes_at(operation, tool, caps)
    verdict = judge_lookup(operation, tool, answer,
                           absence_is_proof=caps.authoritative_absence
                           and asked_at >= window_closes_at)
    request = lookup_request(operation, adapter) | {
        "asked_at": asked_at, "consistency_window_closes_at": window_closes_at}
    return request, answer, verdict


def lookup_response(answer: LookupOutcome, verdict: Verdict) -> dict[str, Any]:
    match answer:
        case Found():
            return {"found": True, "provider_request_id": answer.provider_request_id,
                    "status": answer.status, "matches": answer.matches,
                    "fields": answer.fields, "differences": verdict.differences}
        case Unavailable():
            return {"found": None, "error_class": answer.error_class}
    return {"found": False, "absence_is_proof": verdict.proves_absence}


def _lookup(case: Case, operation: Operation, tool: Tool, adapter: ProviderAdapter, *,
            high_value: bool) -> str:
    request, answer, verdict = look_up(operation, tool, adapter)
    with transaction.atomic():
        transitions.case_record_evidence(
            case=case, kind="lookup", request=request, response=lookup_response(answer, verdict),
            outcome=verdict.outcome, actor=ACTOR)
        if high_value:
            # Whatever the provider says, a person decides; the lookup is their evidence.
            transitions.case_note_check(case=case, strategy="lookup")
            reason = "anomaly" if verdict.anomaly else "high_value"
            escalated = transitions.case_escalate(case=case, reason=reason, actor=ACTOR,
                                                  data={"lookup": verdict.outcome})
            return "escalated" if escalated.state == C.AWAITING_REVIEW else "skipped"
        try:
            with transaction.atomic():
                return _after_lookup(case, operation, tool, adapter.capabilities, answer,
                                     verdict)
        except (ledger_transitions.TransitionError, transitions.CaseTransitionError) as exc:
            # The operation or case moved while we asked (a person's re-send or decision):
            # keep the evidence, look again later.
            transitions.case_reschedule(case=case, next_check_at=_backoff_from_now(case),
                                        actor=ACTOR, reason="moved_during_lookup",
                                        strategy="lookup", data={"error": str(exc)})
            return "rescheduled"


def _after_lookup(case: Case, operation: Operation, tool: Tool, caps: Capabilities,
                  answer: LookupOutcome, verdict: Verdict) -> str:
    if verdict.proves_success and isinstance(answer, Found):
        transitions.case_note_check(case=case, strategy="lookup")
        transitions.case_resolve(
            case=case, outcome=S.SUCCEEDED, actor=ACTOR, reason="lookup_proved_success",
            result=answer.raw or answer.fields, provider_request_id=answer.provider_request_id)
        return S.SUCCEEDED
    if verdict.proves_absence:
        transitions.case_note_check(case=case, strategy="lookup")
        transitions.case_resolve(
            case=case, outcome=S.FAILED, actor=ACTOR, reason="lookup_proved_absent",
            error_class="reconciliation.absent_at_provider")
        return S.FAILED
    if verdict.anomaly:
        transitions.case_note_check(case=case, strategy="lookup")
        transitions.case_escalate(case=case, reason="anomaly", actor=ACTOR,
                                  data={"lookup": verdict.outcome,
                                        "differences": verdict.differences})
        return "escalated"
    window_closes_at = consistency_window_closes_at(operation, tool, caps)
    if verdict.outcome == "not_found" and timezone.now() >= window_closes_at:
        # Past the window, yet this provider's "not found" proves nothing.
        transitions.case_note_check(case=case, strategy="lookup")
        transitions.case_escalate(case=case, reason="not_found_not_authoritative",
                                  actor=ACTOR)
        return "escalated"
    next_check_at = _backoff_from_now(case)
    if verdict.outcome == "not_found" and next_check_at > window_closes_at:
        next_check_at = window_closes_at  # the decisive look is due the moment it can decide
    transitions.case_reschedule(case=case, next_check_at=next_check_at, actor=ACTOR,
                                reason=f"lookup_{verdict.outcome}", strategy="lookup")
    return "rescheduled"


def _backoff_from_now(case: Case) -> dt.datetime:
    return timezone.now() + dt.timedelta(seconds=backoff_seconds(case.attempts + 1))
