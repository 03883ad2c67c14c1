"""Client-executed operations: the ledger records and claims, the agent calls the provider
itself with the stored idempotency key, extends its lease and reports the outcome.

A report is applied only while its claim is alive: the same fencing token, the operation still
in flight, the lease not run out. Anything else (a stale or wrong token, a report after the
lease expired, a second different outcome) is kept as evidence — on the operation's events and,
through the ledger's stale-result signal, on its reconciliation case, which then looks at the
provider again at once — and never applied.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from django.utils import timezone

from ledger import metrics, transitions
from ledger.models import AgentCredential, Operation, OperationEvent
from ledger.tools import get_tool

logger = logging.getLogger(__name__)
S = Operation.Status

# The executor's outcome vocabulary, so reconciliation judges a client's late report exactly
# like a late answer to one of its own sends.
_OUTCOME_NAMES = {S.SUCCEEDED: "Confirmed", S.FAILED: "Rejected", S.UNKNOWN: "Unknown"}


class ClaimEnded(Exception):
    """The fencing token is stale or wrong, or the claim's lease has run out."""

    def __init__(self, operation: Operation, detail: str) -> None:
        super().__init__(detail)
        self.operation = operation
        self.detail = detail


def client_actor(agent: AgentCredential) -> str:
    return f"client:{agent.name}"


def client_heartbeat(*, agent: AgentCredential, operation: Operation,
                     fencing_token: int) -> Operation:
    try:
        return transitions.operation_heartbeat(
            operation=operation, fencing_token=fencing_token,
            lease_seconds=get_tool(operation.tool).lease_seconds, actor=client_actor(agent))
    except transitions.StaleFencingToken:
        current = Operation.objects.get(pk=operation.pk)
        raise ClaimEnded(current, (
            f"Fencing token {fencing_token} does not hold a live claim on this operation (it "
            f"is {current.status}); the lease was not extended. Do not send again; read the "
            "operation for its outcome.")) from None


def client_report_outcome(
    *, agent: AgentCredential, operation: Operation, fencing_token: int, status: str,
    result: Mapping[str, Any], provider_reference: str, error_class: str,
) -> Operation:
    """Apply the agent's outcome with its fencing token; idempotent for the same report."""
    if status not in _OUTCOME_NAMES:
        raise ValueError(f"unknown outcome status {status!r}")
    if status == S.FAILED and not error_class:
        raise ValueError("failed needs the error_class of a definitive provider rejection")
    actor = client_actor(agent)
    report = {"status": status, "provider_reference": provider_reference,
              "error_class": error_class, "result": plain_json(dict(result)),
              "reported_at": timezone.now().isoformat()}
    current = Operation.objects.get(pk=operation.pk)
    if current.status == status and current.fencing_token == fencing_token and \
            _reported_by(current, status=status, actor=actor):
        return current  # the same outcome reported again: nothing to do
    if current.status == S.IN_FLIGHT and current.fencing_token == fencing_token:
        current = transitions.operation_expire_lease(operation=current)  # run out? unknown
    if current.status != S.IN_FLIGHT or current.fencing_token != fencing_token or \
            current.execution != Operation.Execution.CLIENT:
        _keep_as_evidence(current, fencing_token, report, actor)
        raise ClaimEnded(Operation.objects.get(pk=current.pk),
                         _ended_detail(current, fencing_token))
    try:
        applied = _apply(current, fencing_token, report, actor)
    except transitions.TransitionError:
        # Moved between our read and our write (the lease sweeper, a racing report).
        _keep_as_evidence(current, fencing_token, report, actor)
        raise ClaimEnded(Operation.objects.get(pk=current.pk),
                         _ended_detail(current, fencing_token)) from None
    metrics.OPERATIONS.labels(applied.tool, applied.status).inc()
    return applied


def plain_json(value: Any) -> Any:
    """The API parses JSON numbers with decimals as Decimal (so money is never a float); a
    provider's result is stored as the provider wrote it."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {key: plain_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain_json(item) for item in value]
    return value


def _apply(operation: Operation, token: int, report: dict[str, Any], actor: str) -> Operation:
    data = {"reported_by": actor, "provider_reference": report["provider_reference"],
            "error_class": report["error_class"]}
    if report["status"] == S.SUCCEEDED:
        return transitions.operation_succeed(
            operation=operation, fencing_token=token, result=report["result"],
            provider_request_id=report["provider_reference"], actor=actor,
            reason="client_reported_success", data=data)
    if report["status"] == S.FAILED:
        return transitions.operation_fail(
            operation=operation, fencing_token=token, error_class=report["error_class"],
            actor=actor, reason="client_reported_rejection", data=data)
    return transitions.operation_mark_unknown(
        operation=operation, fencing_token=token,
        error_class=report["error_class"] or "client.unknown", actor=actor,
        reason="client_reported_unknown", data=data)


def _reported_by(operation: Operation, *, status: str, actor: str) -> bool:
    """Did this client's own report move the operation into `status` under this token?"""
    last = OperationEvent.objects.filter(
        operation_id=operation.pk, to_status=status, fencing_token=operation.fencing_token,
    ).exclude(from_status=status).order_by("-id").first()
    return last is not None and last.actor == actor


def _keep_as_evidence(operation: Operation, token: int, report: dict[str, Any],
                      actor: str) -> None:
    transitions.operation_record_stale_result(
        operation=operation, fencing_token=token, outcome=_OUTCOME_NAMES[S(report["status"])],
        data={"client_report": report}, actor=actor)
    logger.warning("client report after its claim ended kept as evidence",
                   extra={"operation_id": operation.operation_id, "fencing_token": token})


def _ended_detail(operation: Operation, token: int) -> str:
    return (
        f"Fencing token {token} does not hold a live claim on this operation (it is "
        f"{operation.status}). Nothing was applied; your report was kept as evidence for "
        "reconciliation. Do not send again; read the operation for its outcome."
    )
