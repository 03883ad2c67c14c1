"""Sweeps (what beat runs) and the services a person's actions call.

Sweeps are safe to run on any number of workers at once: the lease sweeper's transitions are
conditional updates, and the case sweeper leases due cases with SELECT … FOR UPDATE SKIP LOCKED
in a short transaction and works on them with no lock held.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ledger import transitions as ledger_transitions
from ledger.models import Operation
from ledger.tools import adapter_of, tool_of
from reconciliation import reconciler, transitions
from reconciliation.models import Case, Evidence

logger = logging.getLogger(__name__)

C = Case.State
S = Operation.Status


@dataclass
class SweepReport:
    leased: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    errors: int = 0

    def count(self, outcome: str) -> None:
        key = str(outcome)  # plain strings: reports go through JSON (Celery, logs)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {"leased": self.leased, "outcomes": dict(self.outcomes), "errors": self.errors}


# --- the lease sweeper -----------------------------------------------------------------------

def sweep_expired_leases(*, batch_size: int | None = None) -> int:
    """in_flight rows whose lease expired → unknown (the ledger's signal opens their case).

    The rows are locked with SKIP LOCKED for the length of one short transaction with no I/O
    in it, so concurrent sweepers split the work, and a worker persisting its answer right now
    (holding the row) is skipped: its answer, not the sweeper, decides that row.
    """
    now = timezone.now()
    batch_size = batch_size or settings.RECONCILIATION_LEASE_SWEEP_BATCH_SIZE
    moved = 0
    with transaction.atomic():
        expired = list(
            Operation.objects.select_for_update(skip_locked=True)
            .filter(status=S.IN_FLIGHT, lease_expires_at__lte=now)
            .order_by("lease_expires_at")[:batch_size]
        )
        for operation in expired:
            try:
                with transaction.atomic():
                    result = ledger_transitions.operation_expire_lease(operation=operation,
                                                                       now=now)
            except ledger_transitions.TransitionError:
                continue  # answered or re-claimed after we read it (SQLite: no row locks)
            moved += result.status == S.UNKNOWN
    if moved:
        logger.info("lease sweep moved %d operation(s) to unknown", moved)
    return moved


# --- the case sweeper ----------------------------------------------------------------------

def sweep_due_cases(*, batch_size: int | None = None, budget_seconds: float | None = None,
                    max_batches: int | None = None) -> SweepReport:
    """Lease due cases a batch at a time and reconcile each, until none is due or the time
    budget is spent."""
    batch_size = batch_size or settings.RECONCILIATION_SWEEP_BATCH_SIZE
    budget = budget_seconds if budget_seconds is not None \
        else settings.RECONCILIATION_SWEEP_BUDGET_SECONDS
    started = time.monotonic()
    report = SweepReport()
    batches = 0
    while max_batches is None or batches < max_batches:
        if time.monotonic() - started > budget:
            break
        leases = transitions.case_lease_due(
            now=timezone.now(), batch_size=batch_size,
            visibility_seconds=settings.RECONCILIATION_CASE_VISIBILITY_SECONDS)
        if not leases:
            break
        batches += 1
        report.leased += len(leases)
        for lease in leases:
            _reconcile_one(lease, report)
    return report


def reconcile_case_now(*, case_id: int) -> str:
    """Reconcile one case if it is due and no sweeper holds it; "skipped" otherwise."""
    lease = transitions.case_lease_one(
        case_id=case_id, now=timezone.now(),
        visibility_seconds=settings.RECONCILIATION_CASE_VISIBILITY_SECONDS)
    if lease is None:
        return "skipped"
    return reconciler.reconcile_case(case_id, lease=lease)


def _reconcile_one(lease: transitions.CaseLease, report: SweepReport) -> None:
    try:
        report.count(reconciler.reconcile_case(lease.case_id, lease=lease))
    except Exception:
        # One broken case must not stop the sweep; its lease runs out and it is due again.
        report.errors += 1
        logger.exception("reconciling case %s failed", lease.case_id)


# --- what a person's actions call ----------------------------------------------------------

class ResendNotAllowed(Exception):
    pass


def _staff_actor(actor: str, user: Any) -> str:
    return actor or f"staff:{getattr(user, 'get_username', lambda: 'unknown')()}"


def case_check_now(*, case: Case, actor: str, user: Any = None) -> Evidence:
    """One lookup right now, stored as evidence. Nothing changes unless the answer proves it:
    a full match resolves an open case as succeeded, authoritative absence after the window as
    failed — except at high value, where the answer is evidence for the person who decides;
    on a resolved case, an answer that disagrees flags it (never flips it)."""
    case = Case.objects.select_related("operation").get(pk=case.pk)
    operation = case.operation
    tool = tool_of(operation)
    adapter = tool.adapter
    actor = _staff_actor(actor, user)
    request, answer, verdict = reconciler.look_up(operation, tool, adapter)
    with transaction.atomic():
        evidence = transitions.case_record_evidence(
            case=case, kind="staff_check", request=request, outcome=verdict.outcome,
            response=reconciler.lookup_response(answer, verdict), actor=actor, user=user)
        _apply_check(case, answer, verdict, actor=actor, evidence=evidence)
    return evidence


def _apply_check(case: Case, answer: Any, verdict: reconciler.Verdict, *, actor: str,
                 evidence: Evidence) -> None:
    case = Case.objects.select_related("operation").get(pk=case.pk)
    if case.state == C.RESOLVED:
        if reconciler.contradicts(resolved_as=case.operation.status, verdict=verdict):
            transitions.case_flag(case=case, actor=actor, reason="contradicting_evidence",
                                  data={"evidence_id": evidence.pk, "lookup": verdict.outcome})
        return
    if case.operation.status != S.UNKNOWN:
        return  # a re-send holds it in flight: the answer stays evidence only
    if tool_of(case.operation).is_high_value(case.operation.value_amount,
                                             case.operation.value_currency):
        return  # high value: a person decides (confirm/reject) with this lookup as evidence
    if verdict.proves_success:
        transitions.case_resolve(
            case=case, outcome=S.SUCCEEDED, actor=actor, reason="lookup_proved_success",
            result=answer.raw or answer.fields, provider_request_id=answer.provider_request_id,
            data={"evidence_id": evidence.pk})
    elif verdict.proves_absence:
        transitions.case_resolve(
            case=case, outcome=S.FAILED, actor=actor, reason="lookup_proved_absent",
            error_class="reconciliation.absent_at_provider", data={"evidence_id": evidence.pk})


def resend_allowed_until(case: Case) -> dt.datetime | None:
    """Until when a same-key re-send of the case's operation is allowed (None: never)."""
    operation = case.operation
    return reconciler.resend_allowed_until(operation, adapter_of(operation).capabilities)


def case_resend_same_key(*, case: Case, actor: str, user: Any = None) -> Evidence:
    """A person's "re-send with the same key" decision, carried out: only for an unknown
    operation whose stored key is still inside the provider's retention (minus the margin).
    Two-person approval and the mandatory reason are the caller's (the Decision's) business.
    The case stays with the person unless the provider's answer resolves the operation."""
    case = Case.objects.select_related("operation").get(pk=case.pk)
    operation = case.operation
    until = resend_allowed_until(case)
    if operation.status != S.UNKNOWN:
        raise ResendNotAllowed(f"the operation is {operation.status}, not unknown")
    if until is None or timezone.now() >= until:
        raise ResendNotAllowed("the provider's key retention does not allow a re-send")
    tool = tool_of(operation)
    actor = _staff_actor(actor, user)
    claim = ledger_transitions.operation_claim(
        operation, worker=actor, lease_seconds=tool.lease_seconds, from_status=S.UNKNOWN,
        reason="staff_resend")
    if claim is None:
        raise ResendNotAllowed("somebody else is sending it right now")
    outcome = reconciler.send_same_key(claim, tool, tool.adapter)
    with transaction.atomic():
        _, evidence = reconciler.persist_resend(case=case, claim=claim, outcome=outcome,
                                                actor=actor, user=user)
    return evidence
