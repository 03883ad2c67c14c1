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
import time
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection
from django.utils import timezone

from ledger import dispatch, metrics, selectors, tally, transitions, versions
from ledger.canonical import CanonicalizationError, params_hash, provider_idempotency_key
from ledger.identity import identifier_problem, validate_operation_id
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


class OutcomeNotPersisted(Exception):
    """The provider answered but the database would not take the outcome within the short
    retry window. The operation stays in_flight under its lease; the reconciler finds the
    outcome with the same key when the lease expires."""

    def __init__(self, operation: Operation, outcome: SendOutcome) -> None:
        super().__init__(f"outcome of {operation.operation_id} not persisted")
        self.operation = operation
        self.outcome = outcome


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


_worker: tuple[int, str] = (0, "")


def worker_name() -> str:
    """host:pid, worked out once per process (a forked child has its own pid)."""
    global _worker
    pid = os.getpid()
    if _worker[0] != pid:
        _worker = (pid, f"{socket.gethostname()}:{pid}")
    return _worker[1]


def _validated(tool_name: str, params: Any, agent: AgentCredential,
               version: int | None = None, *, client: bool = False
               ) -> tuple[Tool, dict[str, Any]]:
    try:
        tool = get_tool(tool_name, version)
    except UnknownTool:
        raise InvalidSubmission({"tool": f"unknown tool {tool_name!r}"}) from None
    if not agent.may_use(tool.name):
        raise ToolNotAllowed(tool.name)
    errors = tool.validate(params)
    if errors:
        raise InvalidSubmission({f"params.{k}": v for k, v in errors.items()})
    hidden = {
        f"params.{name}": HIDDEN_CHARACTERS_MESSAGE
        for name in tool.intent_fields
        if isinstance(params.get(name), str) and has_hidden_characters(params[name])
    }
    if hidden:
        raise InvalidSubmission(hidden)
    if not client and not tool.adapter.capabilities.can_send:
        raise InvalidSubmission({"tool": f"{tool.name} is executed by the client; the ledger "
                                         "has no connector that can send it (submit it with "
                                         "\"execution\": \"client\")"})
    # Once per version and process: a used version's schema must not have changed.
    versions.ensure_recorded(tool)
    return tool, dict(params)


HIDDEN_CHARACTERS_MESSAGE = (
    "contains control, invisible or bidirectional formatting characters; intent fields are "
    "compared exactly, so two values that look the same must be the same"
)
# Unicode categories no intent value needs: controls, formatting (zero-width, bidirectional
# overrides and isolates, the BOM), surrogates, line and paragraph separators. The OpenAPI
# document publishes the same set as a pattern (ledger.openapi).
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def has_hidden_characters(text: str) -> bool:
    """Intent fields are refused, not normalised, when they hold characters that render as
    nothing (or reorder the text around them): `cus_123` and `cus_\u200b123` look identical
    but would hash differently and name different payees."""
    if text.isascii() and text.isprintable():  # printable ASCII: letters, digits, punctuation
        return False
    return any(unicodedata.category(char) in HIDDEN_CATEGORIES for char in text)


def _intent_and_hash(tool: Tool, params: dict[str, Any]) -> tuple[dict[str, Any], str]:
    intent = tool.intent(params)
    try:
        return intent, params_hash(tool.name, intent)
    except CanonicalizationError as exc:
        raise InvalidSubmission({"params": str(exc)}) from None


def _row_values(
    *, tool: Tool, operation_id: str, params: dict[str, Any], run_id: str, tool_call_id: str,
    customer_ref: str, intent: dict[str, Any], digest: str, namespace_id: int,
) -> dict[str, Any]:
    value = tool.value(params)
    return {
        "operation_id": operation_id,
        "namespace_id": namespace_id,
        "run_id": run_id,
        "tool_call_ids": [tool_call_id] if tool_call_id else [],
        "tool": tool.name,
        "tool_version": tool.version,
        "provider": tool.provider,
        "intent_params": intent,
        "params": tool.redacted(params),
        "params_hash": digest,
        "idempotency_key": provider_idempotency_key(
            operation_id=operation_id, params_hash=digest, namespace=str(namespace_id)),
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
    # Taken exactly as sent, never trimmed (the API's serializer refuses the same values).
    refused = {
        name: problem
        for name, value in (("run_id", run_id), ("tool_call_id", tool_call_id),
                            ("customer_ref", customer_ref))
        if value and (problem := identifier_problem(value))
    }
    if refused:
        raise InvalidSubmission(refused)
    existing = selectors.operation_lookup(namespace_id=agent.namespace_id,
                                          operation_id=operation_id)
    # A retry of an operation is judged by the version it was recorded with, not the latest.
    recorded = existing is not None and existing.tool == tool_name
    tool, params = _validated(tool_name, params, agent,
                              existing.tool_version if existing is not None and recorded
                              else None, client=client)
    # A client-executed operation's secrets stay with the agent, which makes the call itself.
    if not execute and not client and tool.withholds(params):
        raise InvalidSubmission({"execution": "params with secret fields are sent at once "
                                              "(sync): the ledger never stores them"})
    intent, digest = _intent_and_hash(tool, params)
    if client:
        if not getattr(tool, "client_execution", True):
            raise InvalidSubmission({"execution": f"the tool {tool.name!r} may not be "
                                                  "executed by the client"})
        execute = False
    if existing is not None:
        # The common retry path: one indexed read, no write (and nothing else computed).
        return _resubmitted(
            existing, values={"tool": tool.name, "intent_params": intent, "params_hash": digest},
            tool=tool, agent=agent, tool_call_id=tool_call_id, execute=execute, params=params)
    values = _row_values(tool=tool, operation_id=operation_id, params=params, run_id=run_id,
                         tool_call_id=tool_call_id, customer_ref=customer_ref, intent=intent,
                         digest=digest, namespace_id=agent.namespace_id)
    if client:
        values["execution"] = Operation.Execution.CLIENT
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
    # The row is in the agent's namespace (the lookup and the insert are scoped to it), so its
    # intent may be shown: every credential of a namespace acts for the same service.
    if operation.params_hash != values["params_hash"] or operation.tool != values["tool"]:
        metrics.CONFLICTS.labels(tool.name).inc()
        tally.count("conflict", tool=tool.name, provider=operation.provider)
        raise ParamsConflict(operation, _differences(operation, values))
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


def _differences(operation: Operation, values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
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
    return persist_outcome_retrying(claim, outcome, actor=actor or f"worker:{worker_name()}")


def persist_outcome_retrying(
    claim: transitions.Claim, outcome: SendOutcome, *, actor: str
) -> Operation:
    """Persist the outcome in hand; if the database is unreachable (a restart, a killed
    connection), retry on a fresh connection with a short backoff for at most
    LEDGER_PERSIST_RETRY_SECONDS, so the outcome is recorded as soon as the database is back
    instead of waiting for the lease to expire. Still failing → OutcomeNotPersisted."""
    deadline = time.monotonic() + settings.LEDGER_PERSIST_RETRY_SECONDS
    delay = 0.05
    attempt: transitions.Claim | None = claim
    while True:
        try:
            if attempt is None:
                # A failed write may have updated our copy before its transaction was rolled
                # back: retry from the row as stored, with the token this attempt holds.
                attempt = transitions.Claim(operation=Operation.objects.get(pk=claim.operation.pk),
                                            fencing_token=claim.fencing_token)
            return persist_outcome(attempt, outcome, actor=actor)
        except (OperationalError, InterfaceError) as exc:
            extra = {"operation_id": claim.operation.operation_id,
                     "outcome": type(outcome).__name__}
            if time.monotonic() + delay > deadline:
                logger.error("outcome not persisted: database unavailable", extra=extra)
                raise OutcomeNotPersisted(claim.operation, outcome) from exc
            logger.warning("database unavailable while persisting an outcome; retrying",
                           extra=extra)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            attempt = None
            if not connection.in_atomic_block:
                connection.close()  # the next query opens a fresh connection


def persist_outcome(claim: transitions.Claim, outcome: SendOutcome, *, actor: str) -> Operation:
    operation, token = claim.operation, claim.fencing_token
    result: Operation | None
    try:
        result = _apply(operation, token, outcome, actor, new=claim.new)
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


def _apply(
    operation: Operation, token: int, outcome: SendOutcome, actor: str, *, new: bool = False
) -> Operation:
    """`new`: the claim created the row, so a definitive outcome is one fenced statement with
    its event and no case to close (transitions.operation_succeed's never_unknown)."""
    data = _evidence(outcome)
    match outcome:
        case Confirmed():
            return transitions.operation_succeed(
                operation=operation, fencing_token=token, result=outcome.result,
                provider_request_id=outcome.provider_request_id, actor=actor,
                reason="provider_confirmed", data=data, never_unknown=new)
        case Rejected():
            return transitions.operation_fail(
                operation=operation, fencing_token=token, error_class=outcome.error_class,
                actor=actor, reason="provider_rejected", data=data, never_unknown=new)
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
