"""The only write path for Operation.status.

Each function is a conditional UPDATE on (id, expected status[, fencing token]) plus an event
row, in one transaction. A zero-row update means somebody else moved the row first: we re-read
and either return it unchanged (it is already where we wanted it — tasks run twice) or raise.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import Field
from django.dispatch import Signal
from django.utils import timezone

from ledger import outbox, rows, selectors
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
    # The claim's statement created the row: it was never unknown and has no case yet.
    new: bool = False


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
    """Insert the row already claimed (prepared → in_flight, both events) in one commit, or
    return the row that already exists.

    The INSERT is the race: `INSERT … ON CONFLICT (namespace_id, operation_id) DO NOTHING`; on
    PostgreSQL a concurrent insert of the same operation ID in the namespace waits for the
    first transaction and then inserts nothing, so exactly one caller creates (and claims) the
    row and every other caller reads it.
    On PostgreSQL the row and its two events are one statement in autocommit (one commit, no
    BEGIN/SAVEPOINT); elsewhere one transaction of two statements.
    """
    now = timezone.now()
    lease = now + dt.timedelta(seconds=lease_seconds)
    row = {"namespace_id": agent.namespace_id, **values, "agent_id": agent.pk,
           "status": S.IN_FLIGHT, "fencing_token": 1,
           "attempts": 1, "lease_owner": worker, "lease_expires_at": lease, "sent_at": now,
           "key_first_sent_at": now}
    events = [
        _EventRow(None, S.PREPARED, f"agent:{agent.name}", 0, "intent_recorded"),
        _EventRow(S.PREPARED, S.IN_FLIGHT, f"worker:{worker}", 1, reason),
    ]
    operation = _insert_new(row, events, now=now)
    if operation is None:
        return _existing_row(row["namespace_id"], values["operation_id"]), None
    return operation, Claim(operation=operation, fencing_token=1, new=True)


def operation_record(
    *, agent: AgentCredential, values: Mapping[str, Any]
) -> tuple[Operation, bool]:
    """Insert a prepared row (for a worker to send later), or return the existing row."""
    now = timezone.now()
    row = {"namespace_id": agent.namespace_id, **values, "agent_id": agent.pk,
           "status": S.PREPARED}
    operation = _insert_new(
        row, [_EventRow(None, S.PREPARED, f"agent:{agent.name}", 0, "intent_recorded")], now=now)
    if operation is None:
        return _existing_row(row["namespace_id"], values["operation_id"]), False
    return operation, True


def _existing_row(namespace_id: int, operation_id: str) -> Operation:
    existing = selectors.operation_lookup(namespace_id=namespace_id, operation_id=operation_id)
    if existing is None:  # cannot happen: the conflicting row is committed (or we waited)
        raise TransitionError(f"operation {operation_id} conflicted but is not there")
    return existing


@dataclass(frozen=True)
class _EventRow:
    from_status: str | None
    to_status: str
    actor: str
    fencing_token: int
    reason: str
    data: Mapping[str, Any] | None = None

    def values(self, now: dt.datetime) -> dict[str, Any]:
        return {"from_status": self.from_status or "", "to_status": self.to_status,
                "actor": self.actor, "fencing_token": self.fencing_token,
                "reason": self.reason, "data": dict(self.data or {}), "created_at": now}


@cache
def _event_fields() -> tuple[Any, ...]:
    """The event columns except its own id and the operation foreign key (taken from the
    statement that wrote the operation)."""
    fk = OperationEvent._meta.get_field("operation")
    return tuple(f for f in rows.insert_fields(OperationEvent) if f is not fk)


def _event_select(source: str, events: Sequence[_EventRow], now: dt.datetime,
                  conn: Any, *, returning: bool = False) -> tuple[str, list[Any]]:
    """`INSERT INTO events … SELECT <source>.id, v.* FROM <source> CROSS JOIN (VALUES …)`, the
    events numbered so their ids follow their order."""
    fields = _event_fields()
    params: list[Any] = []
    for n, event in enumerate(events):
        params.append(n)
        params.extend(rows.insert_params_for(fields, event.values(now), connection=conn))
    return _event_select_sql(source, len(events), returning), params


@cache
def _event_select_sql(source: str, count: int, returning: bool) -> str:
    fields = _event_fields()
    fk = OperationEvent._meta.get_field("operation")
    names = [f"c{i}" for i in range(len(fields))]
    tuples = [f"({rows.placeholders(len(fields) + 1)})"] * count
    return (
        f'INSERT INTO "{OperationEvent._meta.db_table}" '
        f'("{fk.column}", {rows.column_list(fields)}) '
        f'SELECT {source}."id", {", ".join("v." + n for n in names)} FROM {source} '
        f'CROSS JOIN (VALUES {", ".join(tuples)}) AS v(n, {", ".join(names)}) ORDER BY v.n'
        + (' RETURNING "id"' if returning else "")
    )


@dataclass(frozen=True)
class _InsertPlan:
    """How a row given these attnames is inserted and read back, worked out once per set."""

    fields: tuple[Field[Any, Any], ...]  # the INSERT's columns, in order
    sql: str  # its INSERT … ON CONFLICT DO NOTHING RETURNING "id"
    # Per column: its attname, or None when the value is the field's default (not given).
    given: tuple[str | None, ...]
    # Per concrete field of the model, in order: -1 for the primary key (from RETURNING), the
    # position of its value among the columns, or None (a database default: left to it).
    model_order: tuple[int | None, ...]


@cache
def _insert_plan(given: frozenset[str]) -> _InsertPlan:
    """The operation's columns for a row given these attnames (a column with a database
    default and no value given is left to the database), and its INSERT … ON CONFLICT."""
    fields = tuple(f for f in rows.insert_fields(Operation)
                   if f.attname in given or not f.has_db_default())
    position = {f.attname: n for n, f in enumerate(fields)}
    return _InsertPlan(
        fields=fields,
        sql=(f'INSERT INTO "{Operation._meta.db_table}" ({rows.column_list(fields)}) '
             f'VALUES ({rows.placeholders(len(fields))}) '
             f'ON CONFLICT ("namespace_id", "operation_id") DO NOTHING '
             f'RETURNING "id"'),
        given=tuple(f.attname if f.attname in given else None for f in fields),
        model_order=tuple(-1 if f.primary_key else position.get(f.attname)
                          for f in Operation._meta.concrete_fields),
    )


def _insert_new(row: dict[str, Any], events: Sequence[_EventRow], *, now: dt.datetime,
                ) -> Operation | None:
    """Insert the operation row (unless its operation ID exists) and its events in one commit.
    Returns the new row, or None when the operation ID was already taken."""
    row.setdefault("created_at", now)
    row.setdefault("updated_at", now)
    conn = connections[DEFAULT_DB_ALIAS]  # what `connection` resolves to, looked up once
    plan = _insert_plan(frozenset(row))
    fields = plan.fields
    values = [row[name] if name is not None else field.get_default()
              for name, field in zip(plan.given, fields, strict=True)]
    params = rows.params_for(fields, values, conn)
    if conn.vendor == "postgresql" and not conn.in_atomic_block:
        # One statement, one commit: the row, and its events only if the row was inserted.
        # (Recording and claiming are not outcomes: no webhook is due.)
        events_sql, events_params = _event_select("ins", events, now, conn)
        inserted = rows.fetchone(_with_events(plan.sql, events_sql), [*params, *events_params])
    else:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(plan.sql, params)
            inserted = cursor.fetchone()
            if inserted is not None:
                OperationEvent.objects.bulk_create([
                    OperationEvent(operation_id=inserted[0], **event.values(now))
                    for event in events
                ])
    if inserted is None:
        return None
    # Positional, in column order, as the ORM builds a row it read (keyword arguments cost
    # Model.__init__ a lookup per field); a column left to its database default keeps it.
    operation = Operation.from_db(conn.alias, None, [  # type: ignore[arg-type]
        inserted[0] if at == -1 else field.get_default() if at is None else values[at]
        for at, field in zip(plan.model_order, Operation._meta.concrete_fields, strict=True)])
    # Created just now: no reconciliation case can exist, so the resource need not ask.
    return selectors.mark_without_related(operation)


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


@cache
def _column_prep(name: str, vendor: str) -> tuple[str, Callable[[Any, Any], Any]]:
    """An operation field's column and its rows.prep_save, by field name."""
    field = Operation._meta.get_field(name)
    assert isinstance(field, Field) and field.column
    return field.column, rows.prep_save(field, vendor)


def _finish_new(
    operation: Operation,
    *,
    fencing_token: int,
    to_status: str,
    actor: str,
    reason: str,
    fields: Mapping[str, Any],
    data: Mapping[str, Any] | None,
) -> Operation | None:
    """The fenced outcome of a claim that created its row (so it was never unknown and has no
    case): `UPDATE … WHERE id AND status='in_flight' AND fencing_token`, its event and its
    webhook outbox rows (ledger.outbox), in one statement in autocommit on PostgreSQL — one
    commit, no BEGIN — and in one transaction elsewhere. None if the update matched nothing
    (stale token, a sweeper got there): the caller takes the general path, and nothing of this
    attempt was written."""
    check_transition(S.IN_FLIGHT, to_status)
    now = timezone.now()
    values = {"status": to_status, "updated_at": now, **fields}
    event = _EventRow(S.IN_FLIGHT, to_status, actor, fencing_token, reason, data)
    conn = connections[DEFAULT_DB_ALIAS]  # what `connection` resolves to, looked up once
    if not (conn.vendor == "postgresql" and not conn.in_atomic_block):
        with transaction.atomic():
            moved = Operation.objects.filter(
                pk=operation.pk, status=S.IN_FLIGHT, fencing_token=fencing_token
            ).update(**values) == 1
            if not moved:
                return None
            for name, value in values.items():
                setattr(operation, name, value)
            written = OperationEvent.objects.create(operation_id=operation.pk,
                                                    **event.values(now))
            _announce(operation, written)
        return operation
    params: list[Any] = []
    for name, value in values.items():
        params.append(_column_prep(name, conn.vendor)[1](value, conn))
    params += [operation.pk, fencing_token]
    events_sql, events_params = _event_select("moved", [event], now, conn, returning=True)
    # The caller's copy becomes the operation as this statement leaves it (restored if the
    # statement matched nothing); the webhook event snapshots the row the UPDATE returns.
    before = {name: getattr(operation, name) for name in values}
    for name, value in values.items():
        setattr(operation, name, value)
    outbox_sql, outbox_params = outbox.outbox_first_outcome_sql(
        operation=operation, operation_source="moved", event_source="ev", now=now)
    row = rows.fetchone(_finish_sql(tuple(values), events_sql, outbox_sql),
                        [*params, *events_params, *outbox_params])
    if row is None or row[0] is None:
        for name, value in before.items():
            setattr(operation, name, value)
        return None
    outbox.outbox_enqueue(row[1])
    return operation


@cache
def _finish_sql(names: tuple[str, ...], events_sql: str, outbox_sql: str) -> str:
    """_finish_new's statement for these operation fields (built once per set of names)."""
    sets = ", ".join(f'"{_column_prep(name, "postgresql")[0]}" = %s' for name in names)
    return (
        f'WITH moved AS (UPDATE "{Operation._meta.db_table}" SET {sets} '
        f"WHERE \"id\" = %s AND \"status\" = 'in_flight' AND \"fencing_token\" = %s "
        f'RETURNING *), ev AS ({events_sql}), {outbox_sql} '
        f'SELECT (SELECT "id" FROM moved), ARRAY(SELECT "id" FROM {outbox.DELIVERIES_CTE})')


@cache
def _with_events(insert_sql: str, events_sql: str) -> str:
    """_insert_new's statement: the row, and its events only if the row was inserted."""
    return f'WITH ins AS ({insert_sql}), ev AS ({events_sql}) SELECT "id" FROM ins'


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
    never_unknown: bool = False,
) -> Operation:
    """in_flight → succeeded with the current token, or unknown → succeeded on proof/decision.

    `never_unknown`: the claim created the row (Claim.new), so it has no case to close and the
    fenced update and its event go out as one statement."""
    fields = _resolution_fields(
        result=dict(result), provider_request_id=provider_request_id, error_class="")
    if never_unknown and fencing_token is not None and operation.status == S.IN_FLIGHT:
        done = _finish_new(
            operation, fencing_token=fencing_token, to_status=S.SUCCEEDED, actor=actor,
            reason=reason, fields=fields, data=data)
        if done is not None:
            return done
    expected = frozenset({S.IN_FLIGHT}) if fencing_token is not None else frozenset({S.UNKNOWN})
    with transaction.atomic():
        resolved, event = _transition_moved(
            operation.pk, expected_from=expected, to_status=S.SUCCEEDED, actor=actor,
            reason=reason, fencing_token=fencing_token, operation=operation, data=data,
            fields=fields,
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
    never_unknown: bool = False,
) -> Operation:
    """in_flight → failed (definitive rejection, fenced), prepared → failed (local pre-send
    check) or unknown → failed (proven absent, or a staff decision). `never_unknown` as for
    operation_succeed."""
    if never_unknown and fencing_token is not None and operation.status == S.IN_FLIGHT:
        done = _finish_new(
            operation, fencing_token=fencing_token, to_status=S.FAILED, actor=actor,
            reason=reason, data=data, fields=_resolution_fields(
                result=None, provider_request_id=None, error_class=error_class))
        if done is not None:
            return done
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


# --- retention (not a status change; an event all the same) ----------------------------

REDACTED = "[redacted]"


def operation_redact_params(
    *, operation: Operation, fields: frozenset[str], actor: str, now: dt.datetime
) -> bool:
    """Blank the named params of a terminal operation (personal data past its retention).
    The intent params, the params hash and the events are kept. False when there was nothing
    to do (not terminal, or already redacted): running twice changes nothing."""
    with transaction.atomic():
        current = Operation.objects.select_for_update().get(pk=operation.pk)
        if current.status not in Operation.TERMINAL or current.params_redacted_at is not None:
            return False
        params = dict(current.params or {})
        blanked = sorted(name for name in params if name in fields and params[name] != REDACTED)
        texts = {params[name] for name in blanked if isinstance(params[name], str)}
        for name in blanked:
            params[name] = REDACTED
        current.params = params
        # Providers echo what they were sent: the same texts go from the stored answer too.
        current.result = _without_texts(current.result, texts)
        current.params_redacted_at = now
        current.save(update_fields=["params", "result", "params_redacted_at"])
        OperationEvent.objects.create(
            operation=current, from_status=current.status, to_status=current.status, actor=actor,
            fencing_token=current.fencing_token, reason="params_redacted",
            data={"fields": blanked},
        )
    return True


def _without_texts(value: Any, texts: set[str]) -> Any:
    if isinstance(value, str):
        return REDACTED if value in texts else value
    if isinstance(value, list):
        return [_without_texts(item, texts) for item in value]
    if isinstance(value, dict):
        return {key: _without_texts(item, texts) for key, item in value.items()}
    return value
