"""The webhook outbox: an event row (and one delivery per active endpoint of the agent) written
inside the transaction of the state change that causes it, so a committed change always has its
event and a rolled-back one never does. Delivery happens after commit (ledger.webhooks).

The ledger's own transitions call outbox_record_outcome; reconciliation's case transitions call
outbox_record for what only the case knows (operation.awaiting_review). Reconciliation imports
this module, never the reverse.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from functools import cache
from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from ledger import dispatch, rows, selectors, serializers
from ledger.models import (
    Operation,
    OperationEvent,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)

S = Operation.Status
T = WebhookEvent.Type


def outcome_event_type(operation: Operation, event: OperationEvent) -> str | None:
    """Which webhook a ledger transition causes (None: not an outcome an agent waits for).

    An outcome reached after the operation had been unknown — proven by a lookup, a same-key
    re-send or a person's decision — is operation.resolved (data.status says which way)."""
    if event.to_status == S.UNKNOWN:
        return T.UNKNOWN
    if event.to_status not in (S.SUCCEEDED, S.FAILED):
        return None
    # attempts > 1: only a re-send claims twice, and only an unknown operation is re-sent.
    if event.from_status == S.UNKNOWN or (operation.attempts > 1 and OperationEvent.objects.filter(
            operation_id=operation.pk, to_status=S.UNKNOWN).exists()):
        return T.RESOLVED
    return _first_outcome_type(event.to_status)


def _first_outcome_type(status: str) -> str:
    """An outcome reached without the operation having been unknown."""
    return T.SUCCEEDED if status == S.SUCCEEDED else T.FAILED


def outbox_record_outcome(*, operation: Operation, event: OperationEvent) -> WebhookEvent | None:
    event_type = outcome_event_type(operation, event)
    if event_type is None:
        return None
    return outbox_record(operation=operation, event_type=event_type, operation_event=event)


def outbox_record(*, operation: Operation, event_type: str,
                  operation_event: OperationEvent | None = None) -> WebhookEvent:
    """Write the event and its deliveries; the caller holds the transaction of the change."""
    if event_type not in T.values:
        raise ValueError(f"unknown webhook event type {event_type!r}")
    now = timezone.now()
    current = Operation.objects.select_related("reconciliation_case").get(pk=operation.pk)
    event = WebhookEvent.objects.create(
        agent_id=current.agent_id, operation=current, operation_event=operation_event,
        type=event_type, payload=_payload(current, event_type, now),
    )
    endpoints = WebhookEndpoint.objects.filter(agent_id=current.agent_id, is_active=True)
    deliveries = WebhookDelivery.objects.bulk_create([
        WebhookDelivery(event=event, endpoint_id=endpoint_pk, next_attempt_at=now)
        for endpoint_pk in endpoints.values_list("pk", flat=True)
    ])
    outbox_enqueue(delivery.pk for delivery in deliveries)
    return event


def outbox_enqueue(delivery_pks: Iterable[int]) -> None:
    """Each delivery is sent by a worker once the change commits (at once in autocommit)."""
    for pk in delivery_pks:
        dispatch.enqueue_on_commit("deliver_webhook", pk)


def event_payload(event: WebhookEvent) -> dict[str, Any]:
    """The body of the event: its payload as rendered when it was written, or, for a claim's
    first outcome, rendered now from the operation as that change left it (its snapshot). The
    same snapshot and settings render the same body, so every attempt sends the same bytes."""
    if event.payload is not None:
        payload: dict[str, Any] = event.payload
        return payload
    if event.operation_snapshot is None:
        raise ValueError(f"webhook event {event.event_id} has neither payload nor snapshot")
    return _payload(operation_from_snapshot(event.operation_snapshot), event.type,
                    event.created_at)


# The operation's columns the snapshot leaves out: its params, which the resource never shows
# and retention redacts on the operation (ledger.retention).
SNAPSHOT_OMITS = ("intent_params", "params")


def operation_from_snapshot(snapshot: dict[str, Any]) -> Operation:
    """The operation a snapshot (to_jsonb of its row, less SNAPSHOT_OMITS) records, each column
    converted by its field as a form value would be; the omitted params are empty. It is a first
    outcome's operation, created by that claim: it has no reconciliation case."""
    values: list[Any] = []
    for field in Operation._meta.concrete_fields:
        column = str(field.column)
        if column in SNAPSHOT_OMITS:
            values.append({})
            continue
        value = snapshot[column]
        values.append(None if value is None else field.to_python(value))
    return selectors.mark_without_related(
        Operation.from_db(None, None, values))  # type: ignore[arg-type]


def _payload(operation: Operation, event_type: str, now: dt.datetime) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(_payload_json(operation, event_type, now))
    return payload


def _payload_json(operation: Operation, event_type: str, now: dt.datetime) -> str:
    """The event's payload as JSON text — its type, when, and the operation resource rendered
    once as the API renders it."""
    head = json.dumps({"type": event_type, "timestamp": serializers.iso_datetime(now)})
    return f'{head[:-1]}, "data": {operation_resource_json(operation)}}}'


# The name of the CTE, in outbox_first_outcome_sql's statement, whose rows are the deliveries.
DELIVERIES_CTE = "dl"


def outbox_first_outcome_sql(*, operation: Operation, operation_source: str, event_source: str,
                             now: dt.datetime) -> tuple[str, list[Any]]:
    """The outbox rows of a claim's first outcome, as CTEs of the statement that writes it
    (transitions._finish_new on PostgreSQL: one statement, one commit).

    The operation was created by that claim, so it was never unknown: the event is
    operation.succeeded or operation.failed. Its body is not rendered here: the event keeps the
    operation row as the statement leaves it (`operation_source` returns the whole row), which
    event_payload renders when the event is read — the rendering is the largest part of an
    action's CPU, and the database takes the snapshot in one call. `operation_source` and
    `event_source` name the CTEs returning the moved operation and its event's "id"; nothing is
    written unless both returned a row. Returns `we AS (…), dl AS (…)`: the event, and one
    delivery per active endpoint of the agent (DELIVERIES_CTE, RETURNING their ids for
    outbox_enqueue)."""
    event_type = _first_outcome_type(operation.status)
    sql, event_fields, delivery_fields = _first_outcome_sql(operation_source, event_source)
    event_values = {"event_id": WebhookEvent._meta.get_field("event_id").get_default(),
                    "agent_id": operation.agent_id, "type": event_type, "created_at": now}
    delivery_values = {f.attname: f.get_default() for f in delivery_fields} | {
        "next_attempt_at": now, "created_at": now}
    params = [*rows.insert_params_for(event_fields, event_values),
              *rows.insert_params_for(delivery_fields, delivery_values),
              operation.agent_id]
    return sql, params


@cache
def _first_outcome_sql(operation_source: str, event_source: str,
                       ) -> tuple[str, tuple[Any, ...], tuple[Any, ...]]:
    # The operation, its event and the snapshot come from the statement's other CTEs.
    event_fields = tuple(f for f in rows.insert_fields(WebhookEvent) if f.name not in
                         {"operation", "operation_event", "operation_snapshot", "payload"})
    delivery_fields = tuple(f for f in rows.insert_fields(WebhookDelivery)
                            if f.name not in {"event", "endpoint"})
    endpoints = WebhookEndpoint._meta
    omits = "".join(f" - '{column}'" for column in SNAPSHOT_OMITS)
    sql = (
        f'we AS (INSERT INTO "{WebhookEvent._meta.db_table}" '
        f'("operation_id", "operation_event_id", "operation_snapshot", '
        f'{rows.column_list(event_fields)}) '
        f'SELECT {operation_source}."id", {event_source}."id", '
        f'to_jsonb({operation_source}.*){omits}, '
        f'{rows.placeholders(len(event_fields))} FROM {operation_source} '
        f'CROSS JOIN {event_source} RETURNING "id"), '
        f'{DELIVERIES_CTE} AS (INSERT INTO "{WebhookDelivery._meta.db_table}" '
        f'("event_id", "endpoint_id", {rows.column_list(delivery_fields)}) '
        f'SELECT we."id", e."{endpoints.pk.column}", {rows.placeholders(len(delivery_fields))} '
        f'FROM we CROSS JOIN "{endpoints.db_table}" e '
        f'WHERE e."agent_id" = %s AND e."is_active" RETURNING "id")'
    )
    return sql, event_fields, delivery_fields


def operation_resource(operation: Operation) -> dict[str, Any]:
    """The operation resource exactly as the API renders it (absolute URLs when
    LEDGER_PUBLIC_BASE_URL is set), as plain JSON values (the case summary's datetimes, for
    one, become the strings the API sends)."""
    rendered: dict[str, Any] = json.loads(operation_resource_json(operation))
    return rendered


def operation_resource_json(operation: Operation) -> str:
    """operation_resource as the JSON text the API sends."""
    data = serializers.operation_resource(
        operation, context={"base_url": settings.LEDGER_PUBLIC_BASE_URL})
    return JSONRenderer().render(data).decode()
