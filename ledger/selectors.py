"""Reads that scope access. Views never query Operation directly."""

from __future__ import annotations

from django.db.models import QuerySet

from ledger.models import AgentCredential, Operation

# The case summary is part of the resource: fetched with the row, not in a second query.
_RESOURCE_RELATED = ("reconciliation_case",)


def operation_lookup(*, namespace_id: int, operation_id: str) -> Operation | None:
    return Operation.objects.select_related(*_RESOURCE_RELATED).filter(
        namespace_id=namespace_id, operation_id=operation_id
    ).first()


def operation_get_for_agent(*, agent: AgentCredential, operation_id: str) -> Operation | None:
    """Operations outside the agent's namespace are reported as missing, never as forbidden;
    credentials that share a namespace see each other's."""
    return operation_lookup(namespace_id=agent.namespace_id, operation_id=operation_id)


def operation_list_for_run(*, agent: AgentCredential, run_id: str) -> QuerySet[Operation]:
    """A run's operations in the order they were recorded (keyset order: id)."""
    return (
        Operation.objects.select_related(*_RESOURCE_RELATED)
        .filter(namespace_id=agent.namespace_id, run_id=run_id)
        .order_by("id")
    )


def operation_first_unresolved_in_run(*, agent: AgentCredential, run_id: str) -> Operation | None:
    """The run's first operation that is not terminal: one read of the partial index
    operation_ns_run_open_idx, however many resolved operations the run holds."""
    return (
        operation_list_for_run(agent=agent, run_id=run_id)
        .exclude(status__in=Operation.TERMINAL)
        .first()
    )


def operation_get_by_status_token(token: str) -> Operation | None:
    if not token or len(token) > 64:
        return None
    return Operation.objects.select_related(*_RESOURCE_RELATED).filter(status_token=token).first()
