"""The webhook outbox: an event row (and one delivery per active endpoint of the agent) written
inside the transaction of the state change that causes it, so a committed change always has its
event and a rolled-back one never does. Delivery happens after commit (ledger.webhooks).

The ledger's own transitions call outbox_record_outcome; reconciliation's case transitions call
outbox_record for what only the case knows (operation.awaiting_review). Reconciliation imports
this module, never the reverse.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.utils import timezone
from rest_framework.fields import DateTimeField
from rest_framework.renderers import JSONRenderer

from ledger import dispatch
from ledger.models import (
    Operation,
    OperationEvent,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from ledger.serializers import OperationSerializer

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
    return T.SUCCEEDED if event.to_status == S.SUCCEEDED else T.FAILED


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
        type=event_type, payload={
            "type": event_type,
            "timestamp": DateTimeField().to_representation(now),
            "data": operation_resource(current),
        },
    )
    endpoints = WebhookEndpoint.objects.filter(agent_id=current.agent_id, is_active=True)
    deliveries = WebhookDelivery.objects.bulk_create([
        WebhookDelivery(event=event, endpoint_id=endpoint_pk, next_attempt_at=now)
        for endpoint_pk in endpoints.values_list("pk", flat=True)
    ])
    for delivery in deliveries:
        dispatch.enqueue_on_commit("deliver_webhook", delivery.pk)
    return event


def operation_resource(operation: Operation) -> dict[str, Any]:
    """The operation resource exactly as the API renders it (absolute URLs when
    LEDGER_PUBLIC_BASE_URL is set)."""
    data = OperationSerializer(
        operation, context={"base_url": settings.LEDGER_PUBLIC_BASE_URL}).data
    rendered: dict[str, Any] = json.loads(JSONRenderer().render(data))
    return rendered
