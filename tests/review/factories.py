"""Cases in review, built the way production builds them: an operation made unknown through
ledger.transitions (the receiver opens its case) and escalated through case_escalate."""

from __future__ import annotations

from typing import Any

from ledger import transitions as ledger_transitions
from ledger.models import AgentCredential, Operation
from reconciliation import transitions as case_transitions
from reconciliation.models import Case
from tests.ledger.factories import in_flight

FOUR_EYES_AMOUNT = 1_000_000  # the refund tool's four-eyes threshold (10,000.00)
HIGH_VALUE_AMOUNT = 250_000  # above the high-value threshold, below four-eyes


def unknown_operation(agent: AgentCredential, operation_id: str, **params: Any) -> Operation:
    operation, token = in_flight(agent, operation_id, **params)
    return ledger_transitions.operation_mark_unknown(
        operation=operation, fencing_token=token, error_class="transport.ReadTimeout",
        actor="test", reason="timeout_after_send",
        data={"outcome": "Unknown", "error_class": "transport.ReadTimeout"})


def review_case(
    agent: AgentCredential, number: int = 1, *, amount: int = 2500,
    reason: str = "high_value", **params: Any,
) -> Case:
    operation = unknown_operation(
        agent, f"wf-{number}:invoice-{number}:refund-1:v1", amount=amount,
        invoice=f"invoice-{number}", **params)
    case = Case.objects.get(operation=operation)
    return case_transitions.case_escalate(case=case, reason=reason, actor="reconciler")


def checking_case(agent: AgentCredential, number: int = 1, **params: Any) -> Case:
    operation = unknown_operation(agent, f"wf-{number}:invoice-{number}:refund-1:v1",
                                  invoice=f"invoice-{number}", **params)
    return Case.objects.get(operation=operation)
