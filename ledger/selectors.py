"""Reads that scope access. Views never query Operation directly."""

from __future__ import annotations

from functools import cache

from django.db.models import Model, QuerySet
from django.db.models.fields.reverse_related import OneToOneRel

from ledger import rows
from ledger.models import AgentCredential, Operation

# The case summary is part of the resource: fetched with the row, not in a second query.
_RESOURCE_RELATED = ("reconciliation_case",)


def _resource_relations() -> list[OneToOneRel]:
    """Reverse one-to-one relations the resource shows (the reconciliation case), found by
    name so the ledger does not import the reconciliation app."""
    return [rel for rel in Operation._meta.related_objects
            if isinstance(rel, OneToOneRel) and rel.get_accessor_name() in _RESOURCE_RELATED]


@cache
def _lookup_sql() -> tuple[str, tuple[tuple[OneToOneRel, type[Model]], ...]]:
    """One statement: the operation by its operation ID in its namespace (unique), with its
    case (LEFT JOIN on the case's unique operation column), no ORDER BY, no LIMIT. Built once."""
    op_fields = Operation._meta.concrete_fields
    select = [rows.column_list(op_fields, "o.")]
    joins = []
    related = []
    for n, rel in enumerate(_resource_relations()):
        model = rel.related_model
        assert isinstance(model, type)
        alias = f"r{n}"
        select.append(rows.column_list(model._meta.concrete_fields, f"{alias}."))
        joins.append(f'LEFT JOIN "{model._meta.db_table}" {alias} '
                     f'ON {alias}."{rel.field.column}" = o."id"')
        related.append((rel, model))
    where = 'o."namespace_id" = %s AND o."operation_id" = %s'
    sql = (f'SELECT {", ".join(select)} FROM "{Operation._meta.db_table}" o '
           f'{" ".join(joins)} WHERE {where}')
    return sql, tuple(related)


def operation_lookup(*, namespace_id: int, operation_id: str) -> Operation | None:
    sql, related = _lookup_sql()
    row = rows.fetchone(sql, [namespace_id, operation_id])
    if row is None:
        return None
    width = rows.field_count(Operation)
    operation = rows.instance(Operation, row[:width])
    assert isinstance(operation, Operation)
    for rel, model in related:
        part = row[width:width + rows.field_count(model)]
        width += len(part)
        if part[0] is None:  # no case: cached as absent, so reading it costs no query
            rel.set_cached_value(operation, None)
        else:
            case = rows.instance(model, part)
            rel.set_cached_value(operation, case)
            rel.field.set_cached_value(case, operation)
    return operation


def mark_without_related(operation: Operation) -> Operation:
    """A row this process just created (or a first outcome's snapshot of one) has no case: say
    so, so the resource built from it does not ask the database."""
    for rel in _resource_relations():
        rel.set_cached_value(operation, None)
    return operation


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
