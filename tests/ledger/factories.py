"""Rows in a given state, built through the transition functions (never by assigning status)."""

from __future__ import annotations

from typing import Any

from ledger import transitions
from ledger.canonical import params_hash, provider_idempotency_key
from ledger.models import AgentCredential, Operation
from ledger.tools import get_tool
from tests.conftest import refund_params

S = Operation.Status


def row_values(operation_id: str, **params: Any) -> dict[str, Any]:
    tool = get_tool("refund")
    full = refund_params(**params)
    intent = tool.intent(full)
    digest = params_hash(tool.name, intent)
    return {
        "operation_id": operation_id,
        "tool": tool.name,
        "tool_version": tool.version,
        "provider": tool.provider,
        "intent_params": intent,
        "params": full,
        "params_hash": digest,
        "idempotency_key": provider_idempotency_key(operation_id=operation_id, params_hash=digest),
        "value_amount": full["amount"],
        "value_currency": full["currency"],
        "subject": full["invoice"],
    }


def prepared(agent: AgentCredential, operation_id: str = "wf-1:inv-1:refund-1:v1",
             customer_ref: str = "", **params: Any) -> Operation:
    values = row_values(operation_id, **params)
    if customer_ref:
        values["customer_ref"] = customer_ref
    operation, created = transitions.operation_record(agent=agent, values=values)
    assert created
    return operation


def in_flight(agent: AgentCredential, operation_id: str = "wf-1:inv-1:refund-1:v1",
              lease_seconds: int = 60, customer_ref: str = "",
              **params: Any) -> tuple[Operation, int]:
    claim = transitions.operation_claim(prepared(agent, operation_id, customer_ref, **params),
                                        worker="test",
                                        lease_seconds=lease_seconds)
    assert claim is not None
    return claim.operation, claim.fencing_token


def in_state(agent: AgentCredential, status: str,
             operation_id: str = "wf-1:inv-1:refund-1:v1", customer_ref: str = "",
             **params: Any) -> Operation:
    if status == S.PREPARED:
        return prepared(agent, operation_id, customer_ref, **params)
    operation, token = in_flight(agent, operation_id, customer_ref=customer_ref, **params)
    if status == S.IN_FLIGHT:
        return operation
    if status == S.SUCCEEDED:
        return transitions.operation_succeed(
            operation=operation, fencing_token=token, result={"id": "eff_1"},
            provider_request_id="eff_1", actor="test", reason="provider_confirmed")
    if status == S.FAILED:
        return transitions.operation_fail(
            operation=operation, fencing_token=token, error_class="http_402.rejected",
            actor="test", reason="provider_rejected")
    if status == S.UNKNOWN:
        return transitions.operation_mark_unknown(
            operation=operation, fencing_token=token, error_class="transport.ReadTimeout",
            actor="test", reason="timeout_after_send")
    raise ValueError(status)
