"""The only write path for a reconciliation case's state and schedule.

Same shape as ledger.transitions: a conditional UPDATE on (id, expected state) plus a CaseEvent
row in one transaction. A zero-row update means somebody moved the case first: we re-read and
either return it unchanged (it is already where we wanted it — tasks run twice) or raise.

An operation's resolution and its case's resolution always commit together: the ledger sends
`operation_resolved` inside its transaction and reconciliation.receivers closes the case there;
`case_resolve` (staff decisions, proofs) opens one transaction around both.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ledger import outbox
from ledger import transitions as ledger_transitions
from ledger.models import Operation, WebhookEvent
from reconciliation.models import Case, CaseEvent, Evidence

C = Case.State
S = Operation.Status

ALLOWED_TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({C.CHECKING}),
    C.CHECKING: frozenset({C.AWAITING_REVIEW, C.RESOLVED}),
    C.AWAITING_REVIEW: frozenset({C.RESOLVED}),
    C.RESOLVED: frozenset(),
}

# Why a case went to a person (Case.review_reason).
REVIEW_REASONS = frozenset({
    "high_value",  # at or above the tool's high-value threshold: lookups only, then a person
    "anomaly",  # found, but with other fields, another status, or more than once
    "key_retention_passed",  # the provider may have forgotten the key: a re-send could repeat
    "deadline_passed",  # still unproven at the case deadline
    "not_found_not_authoritative",  # absent after the window, but absence proves nothing here
    "no_strategy",  # the provider offers neither keys nor lookups
    "manual",  # a staff member or operator escalated it
})


class CaseTransitionError(Exception):
    pass


class InvalidCaseTransition(CaseTransitionError):
    def __init__(self, from_state: str | None, to_state: str) -> None:
        super().__init__(f"case {from_state or '(new)'} → {to_state} is not allowed")
        self.from_state = from_state
        self.to_state = to_state


class CaseConflict(CaseTransitionError):
    """The case was already resolved the other way, or the intent changed under a decision."""


@dataclass(frozen=True)
class CaseLease:
    """A due case hidden from other sweepers until `until` (its next_check_at while leased)."""

    case_id: int
    until: dt.datetime


def _seconds(value: float) -> dt.timedelta:
    return dt.timedelta(seconds=value)


def check_case_transition(from_state: str | None, to_state: str) -> None:
    if to_state not in ALLOWED_TRANSITIONS.get(from_state, frozenset()):
        raise InvalidCaseTransition(from_state, to_state)


def _event(case: Case, *, from_state: str | None, to_state: str, actor: str, reason: str,
           data: Mapping[str, Any] | None = None) -> CaseEvent:
    return CaseEvent.objects.create(case=case, from_state=from_state or "", to_state=to_state,
                                    actor=actor, reason=reason, data=_jsonable(data or {}))


def _jsonable(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, dt.datetime) else v for k, v in data.items()}


class _Lost(Exception):
    """The case changed between our read and our conditional update."""


def _move(case: Case, *, to_state: str, actor: str, reason: str,
          fields: Mapping[str, Any] | None = None,
          data: Mapping[str, Any] | None = None) -> Case:
    """Compare-and-set the state, append the event. Caller holds a transaction."""
    from_state = case.state
    check_case_transition(from_state, to_state)
    values = {"state": to_state, "updated_at": timezone.now(), **(fields or {})}
    if Case.objects.filter(pk=case.pk, state=from_state).update(**values) != 1:
        raise _Lost()
    for name, value in values.items():
        setattr(case, name, value)
    _event(case, from_state=from_state, to_state=to_state, actor=actor, reason=reason, data=data)
    return case


def _transition_moved(case: Case, *, to_state: str, actor: str, reason: str,
                      fields: Mapping[str, Any] | None = None,
                      data: Mapping[str, Any] | None = None) -> tuple[Case, bool]:
    """Re-read, compare-and-set, retry on a lost race; also answers whether this call moved it
    (False: it was already there)."""
    for _ in range(3):
        current = Case.objects.get(pk=case.pk)
        if current.state == to_state:
            return current, False  # already there: idempotent, no new event
        try:
            with transaction.atomic():
                return _move(current, to_state=to_state, actor=actor, reason=reason,
                             fields=fields, data=data), True
        except _Lost:
            continue
    raise CaseTransitionError(f"case {case.pk} kept changing under us")


# --- opening -------------------------------------------------------------------------------

def case_open(*, operation: Operation, reason: str, error_class: str, actor: str) -> Case:
    """(new) → checking, due at once; an open case of an operation that is unknown again (a
    re-send that ended unknown) only gets an event. Runs inside the ledger's transaction."""
    now = timezone.now()
    open_reason = reason if reason in Case.OpenReason.values else Case.OpenReason.AMBIGUOUS_RESPONSE
    case, created = Case.objects.get_or_create(
        operation=operation,
        defaults={
            "open_reason": open_reason,
            "next_check_at": now,
            "deadline_at": now + _seconds(settings.RECONCILIATION_CASE_DEADLINE_SECONDS),
            "value_amount": operation.value_amount,
        },
    )
    data = {"reason": reason, "error_class": error_class, "fencing_token": operation.fencing_token}
    if created:
        _event(case, from_state=None, to_state=C.CHECKING, actor=actor, reason="case_opened",
               data=data)
    elif case.state != C.RESOLVED:
        _event(case, from_state=case.state, to_state=case.state, actor=actor,
               reason="operation_unknown_again", data=data)
    return case


# --- the reconciler's schedule ---------------------------------------------------------------

def case_lease_due(*, now: dt.datetime, batch_size: int,
                   visibility_seconds: float) -> list[CaseLease]:
    """Lease up to batch_size due cases in one short transaction, then let go of the locks.

    SKIP LOCKED lets any number of sweepers run at once: each takes rows nobody else holds,
    and pushing next_check_at past the visibility timeout keeps them out of every other
    sweeper's next query once we commit — no lock is held while the provider is called.
    (SQLite ignores FOR UPDATE; its writers are serialised by BEGIN IMMEDIATE instead.)
    """
    until = now + dt.timedelta(seconds=visibility_seconds)
    with transaction.atomic():
        due = list(
            Case.objects.select_for_update(skip_locked=True)
            .filter(state=C.CHECKING, next_check_at__lte=now)
            .order_by("next_check_at", "id")
            .values_list("pk", flat=True)[:batch_size]
        )
        if due:
            Case.objects.filter(pk__in=due, state=C.CHECKING).update(next_check_at=until)
    return [CaseLease(case_id=pk, until=until) for pk in due]


def case_lease_one(*, case_id: int, now: dt.datetime,
                   visibility_seconds: float) -> CaseLease | None:
    """Lease one case if it is due and nobody holds it (an operator's "reconcile now")."""
    until = now + dt.timedelta(seconds=visibility_seconds)
    touched = Case.objects.filter(
        pk=case_id, state=C.CHECKING, next_check_at__lte=now
    ).update(next_check_at=until)
    return CaseLease(case_id=case_id, until=until) if touched == 1 else None


def case_renew_lease(*, lease: CaseLease, visibility_seconds: float) -> CaseLease | None:
    """Restart the visibility timeout just before working on a leased case; None when another
    sweeper re-leased it (ours ran out while earlier cases of the batch were slow)."""
    until = timezone.now() + dt.timedelta(seconds=visibility_seconds)
    touched = Case.objects.filter(
        pk=lease.case_id, state=C.CHECKING, next_check_at=lease.until
    ).update(next_check_at=until)
    return CaseLease(case_id=lease.case_id, until=until) if touched == 1 else None


def case_reschedule(*, case: Case, next_check_at: dt.datetime, reason: str, actor: str,
                    strategy: str | None = None,
                    data: Mapping[str, Any] | None = None) -> Case:
    """checking → checking: a check that proved nothing yet; look again at next_check_at."""
    now = timezone.now()
    next_check_at = min(next_check_at, case.deadline_at)
    with transaction.atomic():
        touched = Case.objects.filter(pk=case.pk, state=C.CHECKING).update(
            next_check_at=next_check_at, last_checked_at=now, attempts=F("attempts") + 1,
            strategies_tried=_with_strategy(case, strategy), updated_at=now,
        )
        current = Case.objects.get(pk=case.pk)
        if touched == 1:
            _event(current, from_state=C.CHECKING, to_state=C.CHECKING, actor=actor,
                   reason=reason, data={"next_check_at": next_check_at, **(data or {})})
    return current


def case_check_failed(*, lease: CaseLease, next_check_at: dt.datetime, actor: str,
                      error_class: str) -> bool:
    """checking → checking after a check that raised: let go of our lease early, so the case
    is due again after its backoff rather than hidden for the whole visibility timeout. Only
    while the case still carries our lease (nothing else moved it); counts as an attempt, so
    a case that keeps failing is looked at less and less often. False when it was moved."""
    now = timezone.now()
    with transaction.atomic():
        case = Case.objects.filter(pk=lease.case_id, state=C.CHECKING,
                                   next_check_at=lease.until).first()
        if case is None:
            return False
        next_check_at = min(next_check_at, case.deadline_at)
        Case.objects.filter(pk=case.pk).update(
            next_check_at=next_check_at, last_checked_at=now, attempts=F("attempts") + 1,
            updated_at=now)
        _event(case, from_state=C.CHECKING, to_state=C.CHECKING, actor=actor,
               reason="check_failed",
               data={"next_check_at": next_check_at, "error_class": error_class})
    return True


def case_note_check(*, case: Case, strategy: str | None) -> None:
    """Count a check whose consequence is written by another transition (escalate, resolve)."""
    now = timezone.now()
    Case.objects.filter(pk=case.pk).update(
        last_checked_at=now, attempts=F("attempts") + 1,
        strategies_tried=_with_strategy(case, strategy),
    )


def _with_strategy(case: Case, strategy: str | None) -> list[str]:
    tried = list(case.strategies_tried or [])
    if strategy and strategy not in tried:
        tried.append(strategy)
    return tried


# --- to a person ---------------------------------------------------------------------------

def case_escalate(*, case: Case, reason: str, actor: str,
                  data: Mapping[str, Any] | None = None) -> Case:
    """checking → awaiting_review, with the reason a person has to look (REVIEW_REASONS).

    Idempotent: a case already awaiting review is returned unchanged.
    """
    if reason not in REVIEW_REASONS:
        raise ValueError(f"unknown review reason {reason!r}")
    now = timezone.now()
    sla = dt.timedelta(seconds=settings.RECONCILIATION_REVIEW_SLA_SECONDS)
    with transaction.atomic():
        escalated, moved = _transition_moved(
            case, to_state=C.AWAITING_REVIEW, actor=actor, reason=reason, data=data,
            fields={"review_reason": reason, "review_deadline_at": now + sla,
                    "next_check_at": None},
        )
        if moved:
            # The agent's operation.awaiting_review webhook, in the same commit.
            outbox.outbox_record(operation=escalated.operation,
                                 event_type=WebhookEvent.Type.AWAITING_REVIEW)
    return escalated


# --- resolution ----------------------------------------------------------------------------

def case_resolve(
    *,
    case: Case,
    outcome: str,
    actor: str,
    reason: str,
    result: Mapping[str, Any] | None = None,
    provider_request_id: str | None = None,
    error_class: str = "",
    params_hash: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> Case:
    """Resolve the case AND its unknown operation in one transaction.

    outcome is "succeeded" (it happened: confirmed by a person, or proven by a lookup) or
    "failed" (it did not happen). A decision made on `params_hash` is refused if the operation's
    intent differs. Idempotent when both are already resolved this way; CaseConflict when the
    case was resolved the other way, InvalidTransition when the operation is not unknown (for
    instance a re-send holds it in flight).
    """
    if outcome not in (S.SUCCEEDED, S.FAILED):
        raise ValueError("outcome must be 'succeeded' or 'failed'")
    with transaction.atomic():
        # Operation row first, then the case: the same order as a ledger transition whose
        # signal closes the case, so the two never wait on each other in a cycle.
        operation = Operation.objects.select_for_update().get(pk=case.operation_id)
        current = Case.objects.select_for_update().get(pk=case.pk)
        if params_hash is not None and params_hash != operation.params_hash:
            raise CaseConflict("the decision was made on other intent params")
        if current.state == C.RESOLVED:
            if operation.status != outcome:
                raise CaseConflict(f"already resolved: the operation {operation.status}")
            return current
        # The case first, with the full story; the ledger's operation_resolved signal then
        # finds it resolved and leaves it alone.
        try:
            _close(current, resolution=outcome, actor=actor, reason=reason, data=data)
        except _Lost:
            raise CaseTransitionError(f"case {case.pk} changed under a held lock") from None
        _resolve_operation(operation, outcome=outcome, actor=actor, reason=reason,
                           result=result, provider_request_id=provider_request_id,
                           error_class=error_class, data=data)
    return Case.objects.get(pk=case.pk)


def _resolve_operation(operation: Operation, *, outcome: str, actor: str, reason: str,
                       result: Mapping[str, Any] | None, provider_request_id: str | None,
                       error_class: str, data: Mapping[str, Any] | None) -> Operation:
    if outcome == S.SUCCEEDED:
        return ledger_transitions.operation_succeed(
            operation=operation, fencing_token=None, actor=actor, reason=reason,
            result=dict(result or {"confirmed_by": actor, "reason": reason}),
            provider_request_id=provider_request_id or operation.provider_request_id,
            data=data)
    return ledger_transitions.operation_fail(
        operation=operation, fencing_token=None, actor=actor, reason=reason,
        error_class=error_class or "reconciliation.not_executed", data=data)


def _close(case: Case, *, resolution: str, actor: str, reason: str,
           data: Mapping[str, Any] | None = None) -> Case:
    # Case.resolution holds how it was resolved (the reason code: lookup_proved_success,
    # provider_confirmed, staff_rejected, …); the outcome itself is the operation's status.
    return _move(case, to_state=C.RESOLVED, actor=actor, reason=reason,
                 data={"outcome": resolution, **(data or {})}, fields={
                     "resolution": reason[:32], "resolved_by": actor[:200],
                     "resolved_at": timezone.now(), "next_check_at": None,
                     "claimed_by": None, "claim_expires_at": None,
                 })


def case_close_for_operation(*, operation: Operation, actor: str, reason: str) -> Case | None:
    """Resolve the open case of an operation that just became terminal (inside the ledger's
    transaction, through the operation_resolved signal). No case, or already resolved: no-op."""
    case = Case.objects.filter(operation=operation).first()
    if case is None or case.state == C.RESOLVED:
        return case
    try:
        with transaction.atomic():
            return _close(case, resolution=operation.status, actor=actor, reason=reason)
    except _Lost:
        # Somebody resolved it in between, in a transaction of its own: nothing left to do.
        return Case.objects.get(pk=case.pk)


# --- facts that are not state changes ------------------------------------------------------

def case_flag(*, case: Case, actor: str, reason: str,
              data: Mapping[str, Any] | None = None) -> Case:
    """Contradicting evidence arrived after the case was resolved: flag it for a person, never
    flip the resolution. Idempotent: an already flagged case gets no second event."""
    with transaction.atomic():
        touched = Case.objects.filter(pk=case.pk, flagged=False).update(
            flagged=True, updated_at=timezone.now())
        current = Case.objects.get(pk=case.pk)
        if touched == 1:
            _event(current, from_state=current.state, to_state=current.state, actor=actor,
                   reason=reason, data=data)
    return current


def case_check_soon(*, case: Case, actor: str, reason: str,
                    data: Mapping[str, Any] | None = None) -> Case:
    """New evidence for a case still being checked: make it due now (an event records why)."""
    now = timezone.now()
    with transaction.atomic():
        touched = Case.objects.filter(pk=case.pk, state=C.CHECKING).update(
            next_check_at=now, updated_at=now)
        current = Case.objects.get(pk=case.pk)
        if touched == 1:
            _event(current, from_state=C.CHECKING, to_state=C.CHECKING, actor=actor,
                   reason=reason, data=data)
    return current


def case_record_evidence(
    *,
    case: Case,
    kind: str,
    request: Mapping[str, Any],
    response: Mapping[str, Any],
    outcome: str,
    actor: str,
    user: Any = None,
) -> Evidence:
    """What was asked, what came back (Evidence.created_at is when)."""
    return Evidence.objects.create(
        case=case, kind=kind, request=_jsonable(request), response=_jsonable(response),
        outcome=outcome, actor=actor[:200], created_by=user,
    )

