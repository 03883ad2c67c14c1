"""The executor: DESIGN §4.3, in that order.

1 validate → 2 create-or-read → 3 params conflict → 4 replay terminal → 5 report pending →
6 claim → 7 send outside any transaction → 8 persist the outcome with the fencing token.
A fresh action costs two commits (record+claim, outcome) besides the provider call.
"""

from __future__ import annotations

import copy
import datetime as dt
import enum
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils import timezone

from ledger import dispatch, metrics, selectors, tally, transitions, versions
from ledger.canonical import CanonicalizationError, params_hash, provider_idempotency_key
from ledger.identity import validate_operation_id
from ledger.models import AgentCredential, Operation
from ledger.providers.base import Confirmed, NotSent, Rejected, SendOutcome, Unknown
from ledger.tools import Tool, UnknownTool, get_tool, tool_of

logger = logging.getLogger(__name__)
S = Operation.Status


class SubmissionError(Exception):
    """Refused before anything was written."""


class InvalidSubmission(SubmissionError):
    def __init__(self, errors: Mapping[str, str]) -> None:
        super().__init__("invalid submission")
        self.errors = dict(errors)


class ToolNotAllowed(SubmissionError):
    def __init__(self, tool: str) -> None:
        super().__init__(f"this agent may not use the tool {tool!r}")
        self.tool = tool


class ParamsConflict(SubmissionError):
    def __init__(self, operation: Operation, differences: dict[str, dict[str, Any]]) -> None:
        super().__init__("operation ID already used with different intent params")
        self.operation = operation
        self.differences = differences


class Disposition(enum.StrEnum):
    CREATED = "created"  # this call recorded the intent (and sent it)
    REPLAYED = "replayed"  # a terminal operation, returned as stored
    PENDING = "pending"  # not terminal yet: in flight, unknown, or waiting to be sent


@dataclass(frozen=True)
class Submission:
    operation: Operation
    disposition: Disposition
    # A client-executed submission that won the claim: the agent sends, holding this token.
    claim: transitions.Claim | None = None


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _validated(tool_name: str, params: Any, agent: AgentCredential,
               version: int | None = None) -> tuple[Tool, dict[str, Any]]:
    try:
        tool = get_tool(tool_name, version)
    except UnknownTool:
        raise InvalidSubmission({"tool": f"unknown tool {tool_name!r}"}) from None
    if not agent.may_use(tool.name):
        raise ToolNotAllowed(tool.name)
    errors = tool.validate(params)
    if errors:
        raise InvalidSubmission({f"params.{k}": v for k, v in errors.items()})
    if not tool.adapter.capabilities.can_send:
        raise InvalidSubmission({"tool": f"{tool.name} is executed by the client; the ledger "
                                         "has no connector that can send it"})
    # Once per version and process: a used version's schema must not have changed.
    versions.ensure_recorded(tool)
    return tool, dict(params)


def _row_values(
    *, tool: Tool, operation_id: str, params: dict[str, Any], run_id: str, tool_call_id: str,
    customer_ref: str,
) -> dict[str, Any]:
    intent = tool.intent(params)
    try:
        digest = params_hash(tool.name, intent)
    except CanonicalizationError as exc:
        raise InvalidSubmission({"params": str(exc)}) from None
    value = tool.value(params)
    return {
        "operation_id": operation_id,
        "run_id": run_id,
        "tool_call_ids": [tool_call_id] if tool_call_id else [],
        "tool": tool.name,
        "tool_version": tool.version,
        "provider": tool.provider,
        "intent_params": intent,
        "params": tool.redacted(params),
        "params_hash": digest,
        "idempotency_key": provider_idempotency_key(operation_id=operation_id, params_hash=digest),
        "value_amount": value[0] if value else None,
        "value_currency": value[1] if value else "",
        "subject": tool.subject(params)[:200],
        "customer_ref": customer_ref,
    }


def submit(
    *,
    agent: AgentCredential,
    operation_id: str,
    tool_name: str,
    params: Any,
    run_id: str = "",
    tool_call_id: str = "",
    customer_ref: str = "",
    execute: bool = True,
    client: bool = False,
) -> Submission:
    """Record an intent under its operation ID and (unless `execute` is False) send it once.

    `client`: record and claim it for the agent, which calls the provider itself with the
    stored key and reports the outcome (ledger.client_execution); the ledger never sends it.
    """
    try:
        validate_operation_id(operation_id)
    except ValueError as exc:
        raise InvalidSubmission({"operation_id": str(exc)}) from None
    existing = selectors.operation_lookup(operation_id)
    # A retry of an operation is judged by the version it was recorded with, not the latest.
    recorded = existing is not None and existing.agent_id == agent.pk \
        and existing.tool == tool_name
    tool, params = _validated(tool_name, params, agent,
                              existing.tool_version if existing is not None and recorded
                              else None)
    if not execute and tool.withholds(params):
        raise InvalidSubmission({"execution": "params with secret fields are sent at once "
                                              "(sync): the ledger never stores them"})
    values = _row_values(tool=tool, operation_id=operation_id, params=params, run_id=run_id,
                         tool_call_id=tool_call_id, customer_ref=customer_ref)
    if client:
        # Until the catalogue declares it, every tool may be client-executed.
        if not getattr(tool, "client_execution", True):
            raise InvalidSubmission({"execution": f"the tool {tool.name!r} may not be "
                                                  "executed by the client"})
        values["execution"] = Operation.Execution.CLIENT
        execute = False
    if existing is not None:
        # The common retry path: one indexed read, no write.
        return _resubmitted(existing, values=values, tool=tool, agent=agent,
                            tool_call_id=tool_call_id, execute=execute, params=params)
    worker = worker_name()
    if client:
        operation, claim = transitions.operation_record_and_claim(
            agent=agent, values=values, worker=f"client:{agent.name}",
            lease_seconds=tool.lease_seconds, reason="claimed_by_client")
        if claim is not None:
            return Submission(claim.operation, Disposition.CREATED, claim=claim)
    elif execute:
        operation, claim = transitions.operation_record_and_claim(
            agent=agent, values=values, worker=worker, lease_seconds=tool.lease_seconds)
        if claim is not None:
            return Submission(send_claimed(claim, tool=tool, params=params),
                              Disposition.CREATED)
    else:
        operation, created = transitions.operation_record(agent=agent, values=values)
        if created:
            _enqueue_after_commit(operation)
            return Submission(operation, Disposition.CREATED)
    return _resubmitted(operation, values=values, tool=tool, agent=agent,
                        tool_call_id=tool_call_id, execute=execute, params=params)


def _enqueue_after_commit(operation: Operation) -> None:
    """A worker sends it once the row is committed (inside a caller's transaction, after it).
    A lost message is not lost work: the unsent sweeper sends prepared rows nobody sent."""
    dispatch.enqueue_on_commit("execute_operation", operation.pk)


def _resubmitted(
    operation: Operation, *, values: Mapping[str, Any], tool: Tool, agent: AgentCredential,
    tool_call_id: str, execute: bool, params: dict[str, Any],
) -> Submission:
    if operation.agent_id != agent.pk or operation.params_hash != values["params_hash"]:
        # Another agent's ID is reported as a conflict too, without showing its params.
        metrics.CONFLICTS.labels(tool.name).inc()
        tally.count("conflict", tool=tool.name, provider=operation.provider)
        raise ParamsConflict(operation, _differences(operation, values, agent))
    if tool_call_id and tool_call_id not in operation.tool_call_ids:
        transitions.operation_note_tool_call(
            operation=operation, tool_call_id=tool_call_id, actor=f"agent:{agent.name}")
    if execute and operation.status == S.PREPARED:
        # Recorded earlier but not sent (a refused connection, or queued for a worker): the
        # claim decides who sends, so this caller may try.
        sent = execute_prepared(operation, params=params)
        return _existing(sent, tool) if sent.is_terminal else Submission(sent, Disposition.PENDING)
    return _existing(operation, tool)


def _existing(operation: Operation, tool: Tool) -> Submission:
    if operation.is_terminal:
        metrics.REPLAYS.labels(tool.name).inc()
        tally.count("replay", tool=tool.name, provider=operation.provider)
        return Submission(operation, Disposition.REPLAYED)
    if operation.status == S.IN_FLIGHT:
        operation = transitions.operation_expire_lease(operation=operation)
    return Submission(operation, Disposition.PENDING)


def _differences(
    operation: Operation, values: Mapping[str, Any], agent: AgentCredential
) -> dict[str, dict[str, Any]]:
    if operation.agent_id != agent.pk:
        return {"operation_id": {"detail": "already used by another agent"}}
    stored, submitted = operation.intent_params, values["intent_params"]
    names = sorted(set(stored) | set(submitted))
    diff = {
        name: {"stored": stored.get(name), "submitted": submitted.get(name)}
        for name in names
        if stored.get(name) != submitted.get(name)
    }
    if operation.tool != values["tool"]:
        diff["tool"] = {"stored": operation.tool, "submitted": values["tool"]}
    return diff or {"params": {"detail": "canonical form differs (unicode normalisation)"}}


def execute_prepared(operation: Operation, *, params: dict[str, Any] | None = None
                     ) -> Operation:
    """Claim a prepared operation and send it; the loser of a claim race returns the row.
    `params`: the caller's own (unredacted) params, when it is the agent retrying."""
    if operation.execution == Operation.Execution.CLIENT:
        return operation  # the agent sends it; the ledger does not hold the call
    tool = tool_of(operation)
    if params is None and tool.withholds(operation.params):
        # Its secret fields were never stored: only the agent's retry can send it.
        return operation
    claim = transitions.operation_claim(operation, worker=worker_name(),
                                        lease_seconds=tool.lease_seconds)
    if claim is None:
        return Operation.objects.get(pk=operation.pk)
    return send_claimed(claim, tool=tool, params=params)


def request_timeout(tool: Tool) -> float:
    return float(settings.LEDGER_PROVIDER_TIMEOUT_SECONDS or tool.request_timeout)


def send_claimed(claim: transitions.Claim, *, tool: Tool, actor: str = "",
                 params: dict[str, Any] | None = None) -> Operation:
    """Steps 7 and 8: send with the stored key outside any transaction, then persist.
    `params`: the submitted params, secrets included, which the stored row does not hold."""
    operation = claim.operation
    if params is not None and tool.withholds(params):
        operation = copy.copy(operation)  # in memory only, for the connector
        operation.params = dict(params)
    adapter = tool.adapter
    outcome = adapter.send(operation, key=operation.idempotency_key, timeout=request_timeout(tool))
    metrics.count_send_outcome(operation.provider, outcome)
    return persist_outcome(claim, outcome, actor=actor or f"worker:{worker_name()}")


def persist_outcome(claim: transitions.Claim, outcome: SendOutcome, *, actor: str) -> Operation:
    operation, token = claim.operation, claim.fencing_token
    result: Operation | None
    try:
        result = _apply(operation, token, outcome, actor)
    except transitions.StaleFencingToken:
        return _keep_as_evidence(operation, token, outcome, actor)
    except transitions.InvalidTransition:
        # Our lease expired while we waited and the sweeper made the row unknown (same token).
        # A definitive answer to *this* attempt still proves the outcome; anything else is
        # only evidence for the reconciler.
        current = Operation.objects.get(pk=operation.pk)
        if current.status != S.UNKNOWN or current.fencing_token != token:
            return _keep_as_evidence(operation, token, outcome, actor)
        result = _apply_late(current, outcome, actor)
        if result is None:
            return _keep_as_evidence(operation, token, outcome, actor)
    metrics.OPERATIONS.labels(operation.tool, result.status).inc()
    return result


def _apply_late(operation: Operation, outcome: SendOutcome, actor: str) -> Operation | None:
    data = _evidence(outcome)
    if isinstance(outcome, Confirmed):
        return transitions.operation_succeed(
            operation=operation, fencing_token=None, result=outcome.result,
            provider_request_id=outcome.provider_request_id, actor=actor,
            reason="late_confirmation", data=data)
    if isinstance(outcome, Rejected):
        return transitions.operation_fail(
            operation=operation, fencing_token=None, error_class=outcome.error_class,
            actor=actor, reason="late_rejection", data=data)
    return None


def _keep_as_evidence(
    operation: Operation, token: int, outcome: SendOutcome, actor: str
) -> Operation:
    transitions.operation_record_stale_result(
        operation=operation, fencing_token=token, outcome=type(outcome).__name__,
        data=_evidence(outcome), actor=actor)
    logger.warning("stale result kept as evidence",
                   extra={"operation_id": operation.operation_id, "fencing_token": token})
    return Operation.objects.get(pk=operation.pk)


def _apply(operation: Operation, token: int, outcome: SendOutcome, actor: str) -> Operation:
    data = _evidence(outcome)
    match outcome:
        case Confirmed():
            return transitions.operation_succeed(
                operation=operation, fencing_token=token, result=outcome.result,
                provider_request_id=outcome.provider_request_id, actor=actor,
                reason="provider_confirmed", data=data)
        case Rejected():
            return transitions.operation_fail(
                operation=operation, fencing_token=token, error_class=outcome.error_class,
                actor=actor, reason="provider_rejected", data=data)
        case NotSent():
            return transitions.operation_release(
                operation=operation, fencing_token=token, error_class=outcome.error_class,
                actor=actor, data=data)
        case Unknown():
            return transitions.operation_mark_unknown(
                operation=operation, fencing_token=token, error_class=outcome.error_class,
                actor=actor, reason=outcome.reason.value, data=data)
    raise TypeError(f"unexpected outcome {outcome!r}")


def _evidence(outcome: SendOutcome) -> dict[str, Any]:
    data: dict[str, Any] = {"outcome": type(outcome).__name__, "at": timezone.now().isoformat()}
    if isinstance(outcome, Confirmed):
        data |= {"provider_request_id": outcome.provider_request_id, "replayed": outcome.replayed}
    else:
        data["error_class"] = outcome.error_class
    if isinstance(outcome, NotSent) and outcome.retry_after_seconds is not None:
        data["retry_after_seconds"] = outcome.retry_after_seconds
    return data


def _retry_after(operation: Operation) -> dt.timedelta:
    """How long the provider asked us to wait (429 Retry-After) when it last refused it."""
    last = operation.events.filter(to_status=S.PREPARED).order_by("-id").values_list(
        "data", flat=True).first()
    seconds = (last or {}).get("retry_after_seconds") if isinstance(last, dict) else None
    return dt.timedelta(seconds=float(seconds)) if seconds else dt.timedelta(0)


UNSENT_RETRY_BASE = dt.timedelta(seconds=10)
UNSENT_RETRY_MAX = dt.timedelta(minutes=10)


def retry_unsent(*, batch: int = 100) -> int:
    """Send prepared rows nobody is sending: provably not sent (connection refused) or queued
    for a worker whose message never arrived. Safe with any number of sweepers: the claim
    lets exactly one of them send, with the row's one key."""
    now = timezone.now()
    candidates = Operation.objects.filter(
        status=S.PREPARED, updated_at__lt=now - UNSENT_RETRY_BASE
    ).exclude(execution=Operation.Execution.CLIENT).order_by("updated_at")[:batch]
    sent = 0
    for operation in candidates:
        backoff = min(UNSENT_RETRY_BASE * (2 ** max(operation.attempts - 1, 0)), UNSENT_RETRY_MAX)
        if operation.updated_at > now - max(backoff, _retry_after(operation)):
            continue
        if execute_prepared(operation).status != S.PREPARED:
            sent += 1
    return sent
