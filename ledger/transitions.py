"""The only write path for Operation.status.

Each function is a conditional UPDATE on (id, expected status[, fencing token]) plus an event
row, in one transaction. A zero-row update means somebody else moved the row first: we re-read
and either return it unchanged (it is already where we wanted it — tasks run twice) or raise.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.dispatch import Signal
from django.utils import timezone

from ledger import outbox
from ledger.models import AgentCredential, Operation, OperationEvent

S = Operation.Status

ALLOWED_TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({S.PREPARED}),
    S.PREPARED: frozenset({S.IN_FLIGHT, S.FAILED}),
    S.IN_FLIGHT: frozenset({S.SUCCEEDED, S.FAILED, S.PREPARED, S.UNKNOWN}),
    S.UNKNOWN: frozenset({S.IN_FLIGHT, S.SUCCEEDED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
}

# Sent inside the transaction that makes an operation unknown, so the reconciliation case is
# opened in the same commit (the reconciliation app listens; the ledger does not import it).
operation_became_unknown = Signal()
# Sent inside the transaction that resolves an unknown operation, for the same reason.
operation_resolved = Signal()
# Sent inside the transaction that keeps a superseded attempt's result, so the operation's case
# (if any) gets it as evidence in the same commit.
operation_stale_result = Signal()


class TransitionError(Exception):
    pass


class InvalidTransition(TransitionError):
    def __init__(self, from_status: str | None, to_status: str) -> None:
        super().__init__(f"{from_status or '(new)'} → {to_status} is not allowed")
        self.from_status = from_status
        self.to_status = to_status


class StaleFencingToken(TransitionError):
    """A result arrived from an attempt that is no longer the current one."""


@dataclass(frozen=True)
class Claim:
    operation: Operation
    fencing_token: int


def check_transition(from_status: str | None, to_status: str) -> None:
    if to_status not in ALLOWED_TRANSITIONS.get(from_status, frozenset()):
        raise InvalidTransition(from_status, to_status)


def _event(
    operation: Operation,
    *,
    from_status: str | None,
    to_status: str,
    actor: str,
    reason: str,
    data: Mapping[str, Any] | None = None,
) -> OperationEvent:
    return OperationEvent.objects.create(
        operation=operation,
        from_status=from_status or "",
        to_status=to_status,
        actor=actor,
        fencing_token=operation.fencing_token,
        reason=reason,
        data=dict(data or {}),
    )


def _move(
    operation: Operation,
    *,
    to_status: str,
    actor: str,
    reason: str,
    fencing_token: int | None = None,
    fields: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
) -> tuple[Operation, OperationEvent]:
    """Compare-and-set the status (and token), append the event. Caller holds a transaction."""
    from_status = operation.status
    check_transition(from_status, to_status)
    if fencing_token is not None and fencing_token != operation.fencing_token:
        raise StaleFencingToken(operation.operation_id)
    now = timezone.now()
    values = {"status": to_status, "updated_at": now, **(fields or {})}
    touched = Operation.objects.filter(
        pk=operation.pk, status=from_status, fencing_token=operation.fencing_token
    ).update(**values)
    if touched != 1:
        raise _Lost()
    for name, value in values.items():
        setattr(operation, name, value)
    event = _event(operation, from_status=from_status, to_status=to_status, actor=actor,
                   reason=reason, data=data)
    return operation, event


class _Lost(Exception):
    """The row changed between our read and our conditional update."""


def _transition(
    operation_pk: int,
    *,
    expected_from: frozenset[str],
    to_status: str,
    actor: str,
    reason: str,
    fencing_token: int | None = None,
    fields: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    operation: Operation | None = None,
) -> Operation:
    """Read (or use the caller's fresh copy), guard, compare-and-set; retry once on a lost race."""
    return _transition_moved(
        operation_pk, expected_from=expected_from, to_status=to_status, actor=actor,
        reason=reason, fencing_token=fencing_token, fields=fields, data=data, operation=operation,
    )[0]


def _transition_moved(
    operation_pk: int,
    *,
    expected_from: frozenset[str],
    to_status: str,
    actor: str,
    reason: str,
    fencing_token: int | None = None,
    fields: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    operation: Operation | None = None,
) -> tuple[Operation, OperationEvent | None]:
    """_transition, also answering the event it wrote (None: it was already there)."""
    for _ in range(3):
        current = operation or Operation.objects.get(pk=operation_pk)
        operation = None
        if current.status == to_status and (
            fencing_token is None or current.fencing_token == fencing_token
        ):
            return current, None  # already there: idempotent, no new event
        if current.status not in expected_from:
            if fencing_token is not None and current.fencing_token != fencing_token:
                raise StaleFencingToken(current.operation_id)
            raise InvalidTransition(current.status, to_status)
        try:
            with transaction.atomic():
                return _move(current, to_status=to_status, actor=actor, reason=reason,
                             fencing_token=fencing_token, fields=fields, data=data)
        except _Lost:
            continue
    raise TransitionError(f"operation {operation_pk} kept changing under us")


def _announce(operation: Operation, event: OperationEvent | None) -> None:
    """The webhook outbox row for an outcome, in the transaction of the change (after the
    signals, so the snapshot carries the case they opened or closed). Nothing if no move."""
    if event is not None:
        outbox.outbox_record_outcome(operation=operation, event=event)


# --- creation and claim ------------------------------------------------------------------

def operation_record_and_claim(
    *,
    agent: AgentCredential,
    values: Mapping[str, Any],
    worker: str,
    lease_seconds: int,
    reason: str = "claimed_for_send",
) -> tuple[Operation, Claim | None]:
    """Insert a prepared row and claim it in one commit, or return the row that already exists.

    The INSERT is the race: on PostgreSQL a concurrent insert of the same operation ID waits for
    the first transaction and then fails on the unique index, so exactly one caller creates (and
    claims) the row and every other caller reads it.
    """
    with transaction.atomic():
        try:
            with transaction.atomic():
                operation = Operation.objects.create(agent=agent, status=S.PREPARED, **values)
        except IntegrityError:
            existing = Operation.objects.select_related("agent").get(
                operation_id=values["operation_id"]
            )
            return existing, None
        _event(operation, from_status=None, to_status=S.PREPARED, actor=f"agent:{agent.name}",
               reason="intent_recorded")
        claim = _claim(operation, worker=worker, lease_seconds=lease_seconds, reason=reason)
    return operation, claim


def operation_record(
    *, agent: AgentCredential, values: Mapping[str, Any]
) -> tuple[Operation, bool]:
    """Insert a prepared row (for a worker to send later), or return the existing row."""
    with transaction.atomic():
        try:
            with transaction.atomic():
                operation = Operation.objects.create(agent=agent, status=S.PREPARED, **values)
        except IntegrityError:
            existing = Operation.objects.select_related("agent").get(
                operation_id=values["operation_id"])
            return existing, False
        _event(operation, from_status=None, to_status=S.PREPARED, actor=f"agent:{agent.name}",
               reason="intent_recorded")
    return operation, True


def _claim(operation: Operation, *, worker: str, lease_seconds: int, reason: str) -> Claim:
    now = timezone.now()
    _move(
        operation,
        to_status=S.IN_FLIGHT,
        actor=f"worker:{worker}",
        reason=reason,
        fields={
            "fencing_token": operation.fencing_token + 1,
            "attempts": operation.attempts + 1,
            "lease_owner": worker,
            "lease_expires_at": now + dt.timedelta(seconds=lease_seconds),
            "sent_at": now,
            "key_first_sent_at": operation.key_first_sent_at or now,
        },
    )
    return Claim(operation=operation, fencing_token=operation.fencing_token)


def operation_claim(
    operation: Operation,
    *,
    worker: str,
    lease_seconds: int,
    from_status: str = S.PREPARED,
    reason: str = "claimed_for_send",
) -> Claim | None:
    """prepared → in_flight (or unknown → in_flight for a same-key re-send). None if we lost."""
    check_transition(from_status, S.IN_FLIGHT)
    if operation.status != from_status:
        return None
    try:
        with transaction.atomic():
            return _claim(operation, worker=worker, lease_seconds=lease_seconds, reason=reason)
    except _Lost:
        return None


def operation_heartbeat(
    *, operation: Operation, fencing_token: int, lease_seconds: int, actor: str,
    now: dt.datetime | None = None,
) -> Operation:
    """Extend the lease of the claim holding `fencing_token`.

    Only a live claim is extended: once the lease has run out the lease sweeper may already
    have made the operation unknown, and a claim is never revived (StaleFencingToken)."""
    now = now or timezone.now()
    expires = now + dt.timedelta(seconds=lease_seconds)
    with transaction.atomic():
        touched = Operation.objects.filter(
            pk=operation.pk, status=S.IN_FLIGHT, fencing_token=fencing_token,
            lease_expires_at__gt=now,
        ).update(lease_expires_at=expires)
        if touched != 1:
            raise StaleFencingToken(operation.operation_id)
        current = Operation.objects.get(pk=operation.pk)
        _event(current, from_status=S.IN_FLIGHT, to_status=S.IN_FLIGHT, actor=actor,
               reason="lease_extended", data={"lease_expires_at": expires.isoformat()})
    return current


# --- outcomes of a send (fenced) ---------------------------------------------------------

def operation_succeed(
    *,
    operation: Operation,
    fencing_token: int | None,
    result: Mapping[str, Any],
    provider_request_id: str,
    actor: str,
    reason: str,
    data: Mapping[str, Any] | None = None,
) -> Operation:
    """in_flight → succeeded with the current token, or unknown → succeeded on proof/decision."""
    expected = frozenset({S.IN_FLIGHT}) if fencing_token is not None else frozenset({S.UNKNOWN})
    with transaction.atomic():
        resolved, event = _transition_moved(
            operation.pk, expected_from=expected, to_status=S.SUCCEEDED, actor=actor,
            reason=reason, fencing_token=fencing_token, operation=operation, data=data,
            fields=_resolution_fields(
                result=dict(result), provider_request_id=provider_request_id, error_class=""
            ),
        )
        operation_resolved.send(sender=Operation, operation=resolved, actor=actor, reason=reason)
        _announce(resolved, event)
    return resolved


def operation_fail(
    *,
    operation: Operation,
    fencing_token: int | None,
    error_class: str,
    actor: str,
    reason: str,
    from_status: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> Operation:
    """in_flight → failed (definitive rejection, fenced), prepared → failed (local pre-send
    check) or unknown → failed (proven absent, or a staff decision)."""
    expected: frozenset[str]
    if fencing_token is not None:
        expected = frozenset({S.IN_FLIGHT})
    else:
        expected = frozenset({from_status or S.UNKNOWN})
    with transaction.atomic():
        resolved, event = _transition_moved(
            operation.pk, expected_from=expected, to_status=S.FAILED, actor=actor, reason=reason,
            fencing_token=fencing_token, operation=operation, data=data,
            fields=_resolution_fields(result=None, provider_request_id=None,
                                      error_class=error_class),
        )
        operation_resolved.send(sender=Operation, operation=resolved, actor=actor, reason=reason)
        _announce(resolved, event)
    return resolved


def _resolution_fields(
    *, result: dict[str, Any] | None, provider_request_id: str | None, error_class: str
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "result": result,
        "error_class": error_class,
        "resolved_at": timezone.now(),
        "lease_owner": "",
        "lease_expires_at": None,
    }
    if provider_request_id is not None:
        fields["provider_request_id"] = provider_request_id
    return fields


def operation_release(
    *, operation: Operation, fencing_token: int, error_class: str, actor: str,
    data: Mapping[str, Any] | None = None,
) -> Operation:
    """in_flight → prepared: the request provably never left, so sending again is safe."""
    return _transition(
        operation.pk, expected_from=frozenset({S.IN_FLIGHT}), to_status=S.PREPARED, actor=actor,
        reason="not_sent", fencing_token=fencing_token, operation=operation, data=data,
        fields={"error_class": error_class, "lease_owner": "", "lease_expires_at": None},
    )


def operation_mark_unknown(
    *,
    operation: Operation,
    fencing_token: int,
    error_class: str,
    actor: str,
    reason: str,
    data: Mapping[str, Any] | None = None,
) -> Operation:
    """in_flight → unknown, opening a reconciliation case in the same commit."""
    with transaction.atomic():
        unknown, event = _transition_moved(
            operation.pk, expected_from=frozenset({S.IN_FLIGHT}), to_status=S.UNKNOWN,
            actor=actor, reason=reason, fencing_token=fencing_token, operation=operation,
            data=data,
            fields={"error_class": error_class, "lease_owner": "", "lease_expires_at": None},
        )
        operation_became_unknown.send(
            sender=Operation, operation=unknown, reason=reason, error_class=error_class
        )
        _announce(unknown, event)
    return unknown


def operation_expire_lease(*, operation: Operation, now: dt.datetime | None = None) -> Operation:
    """The worker holding the lease died or hung: what it sent is unknown."""
    now = now or timezone.now()
    if operation.status != S.IN_FLIGHT or (
        operation.lease_expires_at and operation.lease_expires_at > now
    ):
        return operation
    return operation_mark_unknown(
        operation=operation, fencing_token=operation.fencing_token, error_class="lease_expired",
        actor="sweeper", reason="lease_expired",
        data={"lease_owner": operation.lease_owner},
    )


# --- facts that are not transitions ------------------------------------------------------

def operation_record_stale_result(
    *, operation: Operation, fencing_token: int, outcome: str, data: Mapping[str, Any], actor: str
) -> None:
    """Keep a result from a superseded attempt as evidence; never apply it."""
    with transaction.atomic():
        current = Operation.objects.get(pk=operation.pk)
        OperationEvent.objects.create(
            operation=current, from_status=current.status, to_status=current.status, actor=actor,
            fencing_token=fencing_token, reason="stale_result_ignored",
            data={"outcome": outcome, **data},
        )
        operation_stale_result.send(sender=Operation, operation=current,
                                    fencing_token=fencing_token, outcome=outcome,
                                    data=dict(data), actor=actor)


def operation_note_tool_call(*, operation: Operation, tool_call_id: str, actor: str) -> None:
    """Record a new tool-call ID for audit (regenerated calls carry new ones)."""
    with transaction.atomic():
        current = Operation.objects.select_for_update().get(pk=operation.pk)
        if tool_call_id in current.tool_call_ids:
            return
        current.tool_call_ids = [*current.tool_call_ids, tool_call_id]
        current.save(update_fields=["tool_call_ids"])
        OperationEvent.objects.create(
            operation=current, from_status=current.status, to_status=current.status, actor=actor,
            fencing_token=current.fencing_token, reason="tool_call_seen",
            data={"tool_call_id": tool_call_id},
        )
    operation.tool_call_ids = current.tool_call_ids
