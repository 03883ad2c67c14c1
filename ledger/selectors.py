"""Reads that scope access. Views never query Operation directly."""

from __future__ import annotations

from django.db.models import QuerySet

from ledger.models import AgentCredential, Operation

# The case summary is part of the resource: fetched with the row, not in a second query.
_RESOURCE_RELATED = ("reconciliation_case",)


def operation_lookup(operation_id: str) -> Operation | None:
    return Operation.objects.select_related(*_RESOURCE_RELATED).filter(
        operation_id=operation_id
    ).first()


def operation_get_for_agent(*, agent: AgentCredential, operation_id: str) -> Operation | None:
    """Another agent's operation is reported as missing, never as forbidden."""
    return (
        Operation.objects.select_related(*_RESOURCE_RELATED)
        .filter(operation_id=operation_id, agent=agent)
        .first()
    )


def operation_list_for_run(*, agent: AgentCredential, run_id: str) -> QuerySet[Operation]:
    return (
        Operation.objects.select_related(*_RESOURCE_RELATED)
        .filter(run_id=run_id, agent=agent)
        .order_by("created_at", "id")
    )


def operation_get_by_status_token(token: str) -> Operation | None:
    if not token or len(token) > 64:
        return None
    return Operation.objects.select_related(*_RESOURCE_RELATED).filter(status_token=token).first()
