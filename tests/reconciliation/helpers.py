"""Operations in the states reconciliation starts from, made through the executor against the
real sandbox (its magic params choose the fault), never by assigning a status."""

from __future__ import annotations

from typing import Any

from ledger import executor
from ledger.models import AgentCredential, Operation
from reconciliation import services
from reconciliation.models import Case, CaseEvent, Evidence
from tests.conftest import refund_params

S = Operation.Status
REFUND_OP = "wf-81:invoice-17:refund-1:v1"
TICKET_OP = "wf-90:cus_1:ticket-1:v1"


def ticket_params(**overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"queue": "billing", "customer": "cus_1",
                              "title": "Refund did not arrive", "description": "ok"}
    params.update(overrides)
    return params


def unknown_refund(agent: AgentCredential, fault: str, operation_id: str = REFUND_OP,
                   **params: Any) -> Operation:
    """A refund whose first send hit `fault` (sandbox:<fault> in the memo, not an intent field)."""
    operation = executor.submit(agent=agent, operation_id=operation_id, tool_name="refund",
                                params=refund_params(memo=f"sandbox:{fault}", **params)).operation
    assert operation.status == S.UNKNOWN, operation.status
    return operation


def unknown_ticket(agent: AgentCredential, fault: str, operation_id: str = TICKET_OP,
                   **params: Any) -> Operation:
    operation = executor.submit(
        agent=agent, operation_id=operation_id, tool_name="create_ticket",
        params=ticket_params(description=f"sandbox:{fault}", **params)).operation
    assert operation.status == S.UNKNOWN, operation.status
    return operation


def sweep() -> services.SweepReport:
    report = services.sweep_due_cases()
    assert report.errors == 0, report
    return report


def fresh(operation: Operation) -> tuple[Operation, Case]:
    operation = Operation.objects.get(pk=operation.pk)
    return operation, Case.objects.get(operation=operation)


def case_reasons(case: Case) -> list[str]:
    return list(CaseEvent.objects.filter(case=case).order_by("id").values_list("reason", flat=True))


def evidence_of(case: Case) -> list[Evidence]:
    return list(Evidence.objects.filter(case=case).order_by("id"))


def operation_reasons(operation: Operation) -> list[str]:
    return list(operation.events.order_by("id").values_list("reason", flat=True))


def posts(sandbox: Any) -> int:
    """Effect requests (POST /v1/effects/*) the provider received so far."""
    return int(sandbox.request_counts()["total"])
