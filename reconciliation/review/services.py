"""The review queue's writes: claims, decisions, approvals, withdrawals, notes, staff lookups.

Every write here is a keyword-only service that locks (or conditionally updates) the case row,
re-checks its guards, writes narrowly and appends a CaseEvent in the same transaction. Case
state and operation status are never assigned here: a decision resolves the case and its
operation together through reconciliation.transitions.case_resolve (which goes through
ledger.transitions), and a re-send uses the reconciler's own same-key send and persistence.

Rules a reviewer can rely on:
- A claim is exclusive and expires (CLAIM_DURATION). Every decision, approval and withdrawal
  needs a live claim held by the person acting; a conflicting action raises ReviewError with a
  message that says who holds the case and until when.
- A decision is bound to the params hash the reviewer saw. If it differs from the operation's,
  nothing is written.
- At or above the tool's four-eyes threshold a decision waits for a second, different
  reviewer (the database also enforces one pending proposal per person per case and one
  approval per person per proposal).
- Re-sending is offered only while the provider still remembers the idempotency key.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from ledger import transitions as ledger_transitions
from ledger.models import Operation
from ledger.providers.base import Capabilities
from ledger.tools import UnknownTool, adapter_of, tool_of
from reconciliation import reconciler, services, transitions
from reconciliation.models import Case, CaseEvent, Decision, Evidence

if TYPE_CHECKING:
    # The project's user model (AUTH_USER_MODEL is not swapped): claims and decisions point at it.
    from django.contrib.auth.models import User

logger = logging.getLogger(__name__)

OpStatus = Operation.Status
State = Case.State
Action = Decision.Action
DecisionStatus = Decision.Status

CLAIM_DURATION = dt.timedelta(minutes=15)


REASON_CODES: dict[str, tuple[tuple[str, str], ...]] = {
    Action.CONFIRM: (
        ("provider_record_matches", "Provider's record matches the intent"),
        ("provider_dashboard_shows_success", "Provider dashboard shows it completed"),
        ("customer_confirmed_receipt", "Customer confirmed receipt"),
        ("bank_statement_match", "Bank statement shows it"),
    ),
    Action.REJECT: (
        ("provider_has_no_record", "Provider has no record after the consistency window"),
        ("provider_support_confirmed_absent", "Provider support confirmed it did not happen"),
        ("customer_confirmed_not_received", "Customer confirmed it was not received"),
        ("provider_record_differs", "Provider's record is for something else"),
    ),
    Action.RESEND: (
        ("safe_inside_retention", "Key still inside retention: the provider deduplicates"),
        ("provider_asked_to_retry", "Provider asked us to retry"),
    ),
}
OTHER_REASON = ("other", "Other (explain in the note)")


def reason_choices(action: str) -> tuple[tuple[str, str], ...]:
    return (*REASON_CODES.get(action, ()), OTHER_REASON)



def staff_actor(user: User) -> str:
    return f"staff:{user.get_username()}"


# --- errors ------------------------------------------------------------------------------

class ReviewError(Exception):
    """A refused review action. The message is shown to the reviewer as is; nothing was
    written."""

    status_code = 409

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ClaimConflict(ReviewError):
    pass


class NotClaimed(ReviewError):
    pass


class CaseClosed(ReviewError):
    pass


class ParamsChanged(ReviewError):
    pass


class ResendNotAllowed(ReviewError):
    pass


class SameReviewer(ReviewError):
    pass


class OwnProposalPending(ReviewError):
    pass


class DecisionNotPending(ReviewError):
    pass


class InvalidDecision(ReviewError):
    status_code = 422


class EvidenceContradicted(ReviewError):
    """A decision against the latest definitive evidence, not marked as an override (or an
    approval of a proposal that newer evidence contradicts)."""

    status_code = 422


# --- claims ------------------------------------------------------------------------------

def claim_is_live(case: Case, now: dt.datetime | None = None) -> bool:
    now = now or timezone.now()
    return bool(case.claimed_by_id and case.claim_expires_at and case.claim_expires_at > now)


def holds_claim(case: Case, user: User, now: dt.datetime | None = None) -> bool:
    return claim_is_live(case, now) and case.claimed_by_id == user.pk


def _when(moment: dt.datetime | None) -> str:
    """"1 Dec 2026, 08:00 UTC": every deadline a reviewer reads carries its date."""
    return when(moment)


def when(moment: dt.datetime | None) -> str:
    if moment is None:
        return "—"
    local = timezone.localtime(moment)
    return f"{local.day} {local:%b %Y, %H:%M} {local.tzname()}"


def _held_elsewhere(case: Case) -> ClaimConflict:
    holder = case.claimed_by.get_username() if case.claimed_by else "someone else"
    return ClaimConflict(
        f"{holder} is working on this case (claimed until {_when(case.claim_expires_at)}). "
        "Nothing was changed; you can act once they release it or the claim expires."
    )


def case_claim(*, case_id: int, user: User, now: dt.datetime | None = None) -> Case:
    """Take (or renew) the exclusive claim on an open case.

    One conditional UPDATE decides the race: it only matches a case nobody holds, whose claim
    has expired, or that the caller already holds. The loser gets a ClaimConflict.
    """
    now = now or timezone.now()
    with transaction.atomic():
        before = Case.objects.select_related("claimed_by").get(pk=case_id)
        proposer_id = (Decision.objects.filter(case_id=case_id,
                                               status=DecisionStatus.AWAITING_SECOND)
                       .values_list("decided_by_id", flat=True).first())
        if proposer_id == user.pk and before.state == State.AWAITING_REVIEW:
            raise OwnProposalPending(
                "Your proposal on this case is waiting for a second, different reviewer, so "
                "you cannot hold the case: that would keep approvers out. You can withdraw "
                "your proposal without claiming it. Nothing was changed.")
        free = (Q(claimed_by__isnull=True) | Q(claim_expires_at__isnull=True)
                | Q(claim_expires_at__lte=now) | Q(claimed_by=user))
        if proposer_id is not None:
            # A proposer never locks approvers out, whatever claim they still hold.
            free |= Q(claimed_by_id=proposer_id)
        touched = (
            Case.objects.filter(pk=case_id, state=State.AWAITING_REVIEW)
            .filter(free)
            .update(claimed_by=user, claim_expires_at=now + CLAIM_DURATION, updated_at=now)
        )
        case = Case.objects.select_related("claimed_by", "operation").get(pk=case_id)
        if touched != 1:
            if case.state != State.AWAITING_REVIEW:
                raise CaseClosed(_closed_message(case))
            raise _held_elsewhere(case)
        if not holds_claim(before, user, now):
            # A renewal by the holder is not news; taking the case is.
            # touched == 1: the UPDATE above set the claim's expiry.
            assert case.claim_expires_at is not None
            data: dict[str, Any] = {"expires_at": case.claim_expires_at.isoformat()}
            if claim_is_live(before, now) is False and before.claimed_by_id:
                assert before.claimed_by is not None  # claimed_by_id is set (select_related)
                data["expired_claim_of"] = before.claimed_by.get_username()
            _case_event(case, actor=staff_actor(user), reason="claimed", data=data)
    return case


def case_release(*, case_id: int, user: User, now: dt.datetime | None = None) -> Case:
    """Give up one's own claim. Releasing a case one does not hold is refused, never silent."""
    now = now or timezone.now()
    with transaction.atomic():
        touched = Case.objects.filter(pk=case_id, claimed_by=user).update(
            claimed_by=None, claim_expires_at=None, updated_at=now
        )
        case = Case.objects.select_related("claimed_by", "operation").get(pk=case_id)
        if touched == 1:
            _case_event(case, actor=staff_actor(user), reason="claim_released")
            return case
        if claim_is_live(case, now):
            raise _held_elsewhere(case)
    return case  # nobody holds it: already released


def _require_claim(case: Case, user: User, now: dt.datetime) -> None:
    if holds_claim(case, user, now):
        return
    if claim_is_live(case, now):
        raise _held_elsewhere(case)
    if case.claimed_by_id == user.pk:
        raise NotClaimed("Your claim on this case expired. Claim it again, then decide.")
    raise NotClaimed("Claim this case before deciding: only the reviewer holding it can act.")


def _closed_message(case: Case) -> str:
    if case.state == State.RESOLVED:
        by = f" by {case.resolved_by}" if case.resolved_by else ""
        return f"This case was already resolved{by}. Nothing was changed."
    return ("This case is not awaiting review (the reconciler is still checking). "
            "Nothing was changed.")


# --- decisions ---------------------------------------------------------------------------

@dataclass
class DecisionOutcome:
    case: Case
    decision: Decision
    applied: bool
    operation: Operation
    message: str


def resend_deadline(operation: Operation) -> dt.datetime | None:
    """Until when a same-key re-send is safe (the reconciler's rule, margin included), or None
    when it never is."""
    capabilities = _capabilities(operation)
    if capabilities is None:
        return None
    return reconciler.resend_allowed_until(operation, capabilities)


def _capabilities(operation: Operation) -> Capabilities | None:
    try:
        return adapter_of(operation).capabilities
    except UnknownTool:
        return None  # a version no longer declared: nothing may be sent for it


def key_retention_deadline(operation: Operation) -> dt.datetime | None:
    capabilities = _capabilities(operation)
    if capabilities is None:
        return None
    if not capabilities.honours_idempotency_keys or not capabilities.key_retention_seconds:
        return None
    if operation.key_first_sent_at is None:
        return None
    return operation.key_first_sent_at + dt.timedelta(seconds=capabilities.key_retention_seconds)


def resend_allowed(operation: Operation, now: dt.datetime | None = None) -> bool:
    deadline = resend_deadline(operation)
    return deadline is not None and (now or timezone.now()) < deadline


def needs_four_eyes(operation: Operation) -> bool:
    try:
        tool = tool_of(operation)
    except UnknownTool:
        return True  # a tool we no longer know: be strict
    return tool.needs_four_eyes(operation.value_amount, operation.value_currency)


@dataclass(frozen=True)
class DefinitiveEvidence:
    """The newest answer from the provider that proves one way: a lookup that found a
    matching effect or a same-key re-send the provider confirmed (supports confirm), an
    authoritative "not found" after the consistency window or a definitive rejection of the
    re-send (supports reject)."""

    evidence: Evidence
    supports: str  # Action.CONFIRM or Action.REJECT


def _supports(evidence: Evidence) -> str | None:
    response = evidence.response if isinstance(evidence.response, dict) else {}
    if evidence.outcome == "found_match":
        return Action.CONFIRM
    if evidence.outcome == "not_found" and response.get("absence_is_proof") is True:
        return Action.REJECT
    if evidence.kind == "resend" and evidence.outcome == "confirmed":
        return Action.CONFIRM
    if evidence.kind == "resend" and evidence.outcome == "rejected":
        return Action.REJECT
    return None


def latest_definitive_evidence(case: Case) -> DefinitiveEvidence | None:
    for evidence in case.evidence.order_by("-created_at", "-id"):
        supports = _supports(evidence)
        if supports is not None:
            return DefinitiveEvidence(evidence=evidence, supports=supports)
    return None


def contradicted_by(action: str, definitive: DefinitiveEvidence | None) -> bool:
    """Confirm or reject against what the provider proved (a re-send contradicts nothing: the
    provider deduplicates it)."""
    return (definitive is not None and action in (Action.CONFIRM, Action.REJECT)
            and action != definitive.supports)


def _evidence_data(evidence: Evidence) -> dict[str, Any]:
    return {"id": evidence.pk, "kind": evidence.kind, "outcome": evidence.outcome,
            "at": evidence.created_at.isoformat()}


def _contradiction_message(action: str, definitive: DefinitiveEvidence) -> str:
    evidence = definitive.evidence
    at = _when(evidence.created_at)
    if definitive.supports == Action.CONFIRM:
        proof = f"the provider's answer at {at} shows the action happened ({evidence.outcome})"
    else:
        proof = (f"the provider's answer at {at} proves it did not happen "
                 f"({evidence.outcome.replace('_', ' ')}, after the consistency window)")
    verb = "Confirming" if action == Action.CONFIRM else "Rejecting"
    return (f"{verb} contradicts the evidence: {proof}. To decide against it, mark the "
            "decision as an override and write why; a second, different reviewer must then "
            "approve it. Nothing was changed.")



def _locked_case(case_id: int) -> Case:
    """Lock the operation row, then the case row: the order every ledger transition (whose
    signal closes the case) and case_resolve use, so no two transactions wait in a cycle."""
    operation_pk = Case.objects.values_list("operation_id", flat=True).get(pk=case_id)
    Operation.objects.select_for_update().filter(pk=operation_pk).exists()
    return (
        Case.objects.select_for_update(of=("self",))
        .select_related("operation", "claimed_by")
        .get(pk=case_id)
    )


def _validate_decision(
    case: Case, *, user: User, action: str, reason_code: str, note: str,
    params_hash: str, now: dt.datetime, amount_checked: int | None = None,
) -> None:
    if case.state != State.AWAITING_REVIEW:
        raise CaseClosed(_closed_message(case))
    _require_claim(case, user, now)
    if action not in Action.values:
        raise InvalidDecision("Choose confirm, reject or re-send.")
    if reason_code not in {code for code, _ in reason_choices(action)}:
        raise InvalidDecision("Choose a reason that fits the decision.")
    if not note.strip():
        raise InvalidDecision("Add a note: what did you check, and what did you see?")
    if params_hash != case.operation.params_hash:
        raise ParamsChanged(
            "The operation's parameters are not the ones this decision was made on. "
            "Nothing was changed; reload the case and review it again."
        )
    if amount_checked is not None and amount_checked != case.operation.value_amount:
        raise InvalidDecision(
            "The amount you checked is not the intent's amount: decide on the right record. "
            "Nothing was changed."
        )
    if action == Action.RESEND and not resend_allowed(case.operation, now):
        raise ResendNotAllowed(
            "Re-sending is not possible: the provider no longer remembers (or never honoured) "
            "this idempotency key, so a re-send could execute the action twice."
        )


def _create_decision(**values: Any) -> Decision:
    try:
        with transaction.atomic():
            return Decision.objects.create(**values)
    except IntegrityError:
        raise ReviewError(
            "You already have a decision waiting on this case, or already approved this one; "
            "a second, different reviewer must act. Nothing was changed."
        ) from None


def case_decide(
    *, case_id: int, user: User, action: str, reason_code: str, note: str,
    params_hash: str, override_reason: str = "", amount_checked: int | None = None,
    now: dt.datetime | None = None,
) -> DecisionOutcome:
    """Record a reviewer's decision; apply it now, or hold it for a second approval.

    A decision against the latest definitive evidence needs `override_reason` (the reviewer
    marked it as an override and wrote why) and then always a second, different reviewer,
    whatever the amount.
    """
    now = now or timezone.now()
    with transaction.atomic():
        case = _locked_case(case_id)
        _validate_decision(case, user=user, action=action, reason_code=reason_code, note=note,
                           params_hash=params_hash, now=now, amount_checked=amount_checked)
        definitive = latest_definitive_evidence(case)
        override = contradicted_by(action, definitive)
        if override and not override_reason.strip():
            assert definitive is not None
            raise EvidenceContradicted(_contradiction_message(action, definitive))
        if case.decisions.filter(status=DecisionStatus.AWAITING_SECOND).exists():
            raise ReviewError(
                "A decision on this case is already waiting for a second approval: approve or "
                "decline it first. Nothing was changed."
            )
        four_eyes = override or needs_four_eyes(case.operation)
        decision = _create_decision(
            case=case, action=action, reason_code=reason_code, note=note.strip(),
            params_hash=params_hash, decided_by=user, amount_checked=amount_checked,
            override_reason=override_reason.strip()[:4000] if override else "",
            overrides_evidence=definitive.evidence if override and definitive else None,
            status=DecisionStatus.AWAITING_SECOND if four_eyes else DecisionStatus.APPLIED,
        )
        _case_event(case, actor=staff_actor(user),
                    reason="decision_proposed" if four_eyes else "decision_made",
                    data=_decision_data(decision))
        if four_eyes:
            # The proposer steps back so a second reviewer can claim the case and approve.
            _drop_claim(case, now)
            why = ("it overrides the provider's evidence" if override
                   else "the amount is at or above the four-eyes threshold")
            return DecisionOutcome(
                case=case, decision=decision, applied=False, operation=case.operation,
                message=(f"Your proposal to {action_phrase(action)} is recorded (1 of 2 "
                         f"approvals). Because {why}, it takes effect only when a second, "
                         "different reviewer approves it."),
            )
        if action != Action.RESEND:
            operation = _apply_resolution(case, decisions=[decision], user=user)
            return _applied(case, decision, operation)
        claim = _claim_for_resend(case, user=user)
    return _applied(case, decision, _resend(case, claim, decision=decision, user=user))


def decision_approve(
    *, decision_id: int, user: User, reason_code: str, note: str, params_hash: str,
    now: dt.datetime | None = None,
) -> DecisionOutcome:
    """The second pair of eyes: a different reviewer approves the same action."""
    now = now or timezone.now()
    with transaction.atomic():
        proposal = Decision.objects.select_related("decided_by").get(pk=decision_id)
        case = _locked_case(proposal.case_id)
        proposal = Decision.objects.select_for_update().select_related("decided_by").get(
            pk=decision_id)
        _require_pending(proposal)
        if proposal.decided_by_id == user.pk:
            raise SameReviewer(
                "You proposed this decision, so you cannot also approve it: a second, "
                "different reviewer must. Nothing was changed."
            )
        _validate_decision(case, user=user, action=proposal.action, reason_code=reason_code,
                           note=note, params_hash=params_hash, now=now)
        if params_hash != proposal.params_hash:
            raise ParamsChanged("The proposal was made on different parameters. Nothing was "
                                "changed.")
        definitive = latest_definitive_evidence(case)
        if contradicted_by(proposal.action, definitive) and (
                definitive is None or proposal.overrides_evidence_id != definitive.evidence.pk):
            assert definitive is not None
            raise EvidenceContradicted(
                "The provider's evidence changed after this proposal and now contradicts it: "
                "decline it, and decide again on the new evidence. Nothing was changed.")
        approval = _create_decision(
            case=case, action=proposal.action, reason_code=reason_code, note=note.strip(),
            params_hash=params_hash, decided_by=user, approves=proposal,
            status=DecisionStatus.APPLIED,
        )
        _decision_set_status(proposal, DecisionStatus.APPLIED)
        _case_event(case, actor=staff_actor(user), reason="decision_approved",
                    data={**_decision_data(approval), "approves": proposal.pk,
                          **_override_data(proposal)})
        if proposal.action != Action.RESEND:
            operation = _apply_resolution(case, decisions=[proposal, approval], user=user)
            return _applied(case, approval, operation)
        claim = _claim_for_resend(case, user=user)
    return _applied(case, approval, _resend(case, claim, decision=approval, user=user))


def decision_withdraw(
    *, decision_id: int, user: User, note: str = "", now: dt.datetime | None = None,
) -> Decision:
    """Withdraw a proposal waiting for its second approval: the proposer's change of mind
    (no claim needed: the proposer stepped back so approvers could claim the case, and must
    not have to take it from them to withdraw), or a second reviewer declining it (with the
    claim, like every other decision)."""
    now = now or timezone.now()
    with transaction.atomic():
        proposal = Decision.objects.get(pk=decision_id)
        case = _locked_case(proposal.case_id)
        proposal = Decision.objects.select_for_update().get(pk=decision_id)
        _require_pending(proposal)
        if case.state != State.AWAITING_REVIEW:
            raise CaseClosed(_closed_message(case))
        if proposal.decided_by_id != user.pk:
            _require_claim(case, user, now)
        if proposal.decided_by_id != user.pk and not note.strip():
            raise InvalidDecision("Say why you decline the proposal in the note.")
        _decision_set_status(proposal, DecisionStatus.WITHDRAWN)
        reason = "decision_withdrawn" if proposal.decided_by_id == user.pk else "decision_declined"
        _case_event(case, actor=staff_actor(user), reason=reason,
                    data={**_decision_data(proposal), "note": note.strip()})
    return proposal


def _require_pending(proposal: Decision) -> None:
    if proposal.status == DecisionStatus.AWAITING_SECOND:
        return
    if proposal.status == DecisionStatus.APPLIED:
        raise DecisionNotPending("This decision was already approved and applied.")
    raise DecisionNotPending("This decision was withdrawn; there is nothing to approve.")


def _decision_set_status(decision: Decision, status: str) -> None:
    """The one write path for Decision.status: awaiting_second → applied | withdrawn."""
    touched = Decision.objects.filter(
        pk=decision.pk, status=DecisionStatus.AWAITING_SECOND
    ).update(status=status)
    if touched != 1:
        raise DecisionNotPending("This decision changed while you were looking at it.")
    decision.status = status


def _decision_data(decision: Decision) -> dict[str, Any]:
    data: dict[str, Any] = {
        "decision": decision.pk, "action": decision.action, "reason_code": decision.reason_code,
        "params_hash": decision.params_hash, **_override_data(decision),
    }
    if decision.amount_checked is not None:
        data["amount_checked"] = decision.amount_checked
    return data


def _override_data(decision: Decision) -> dict[str, Any]:
    """What an override event records: that it is one, why, and the evidence it overrode."""
    if decision.overrides_evidence is None:
        return {}
    return {"override": True, "override_reason": decision.override_reason,
            "overridden_evidence": _evidence_data(decision.overrides_evidence)}


def action_phrase(action: str) -> str:
    return {Action.CONFIRM: "confirm it happened", Action.REJECT: "reject it (it did not happen)",
            Action.RESEND: "re-send it with the same key"}.get(Action(action), action)


def _applied(case: Case, decision: Decision, operation: Operation) -> DecisionOutcome:
    case.refresh_from_db()
    noun = operation.tool.replace("_", " ")
    status = OpStatus(operation.status)
    if decision.action != Action.RESEND:
        verb = "confirmed" if decision.action == Action.CONFIRM else "rejected"
        message = (f"Case {case.pk} is resolved: the {noun} is {verb} and the operation is now "
                   f"{status.label.lower()}.")
    elif status == OpStatus.SUCCEEDED:
        message = (f"Re-sent with the same key, and the provider confirmed it: case {case.pk} "
                   "is resolved and the operation is now succeeded.")
    elif status == OpStatus.FAILED:
        message = (f"Re-sent with the same key, and the provider rejected it: case {case.pk} "
                   "is resolved and the operation is now failed.")
    elif status == OpStatus.IN_FLIGHT:
        message = "Re-sent with the same key; the provider's answer is still on its way."
    else:
        message = ("Re-sent with the same key, but the provider's answer is still unknown, so "
                   "the case stays in review.")
    if decision.approves_id is not None:
        proposer = decision.approves.decided_by.get_username() if decision.approves else ""
        message = f"You approved {proposer}'s proposal (2 of 2 approvals). {message}"
    return DecisionOutcome(case=case, decision=decision, applied=True, operation=operation,
                           message=message)


def _drop_claim(case: Case, now: dt.datetime) -> None:
    Case.objects.filter(pk=case.pk).update(claimed_by=None, claim_expires_at=None, updated_at=now)
    case.claimed_by = None
    case.claim_expires_at = None


def _apply_resolution(
    case: Case, *, decisions: list[Decision], user: User
) -> Operation:
    """Confirm → succeeded, reject → failed; case_resolve moves the case and its operation in
    one commit and refuses a decision made on other params."""
    confirm = decisions[0].action == Action.CONFIRM
    reason = "staff_confirmed" if confirm else "staff_rejected"
    data = {
        "decisions": [d.pk for d in decisions],
        "decided_by": [d.decided_by.get_username() for d in decisions],
        "reason_codes": [d.reason_code for d in decisions],
        **_override_data(decisions[0]),
    }
    try:
        transitions.case_resolve(
            case=case, outcome=OpStatus.SUCCEEDED if confirm else OpStatus.FAILED,
            actor=staff_actor(user), reason=reason, params_hash=decisions[0].params_hash,
            provider_request_id=_known_provider_request_id(case) or None,
            result={"resolution": reason, "decided_by": data["decided_by"]} if confirm else None,
            error_class="" if confirm else "reconciliation.staff_rejected", data=data,
        )
    except (transitions.CaseTransitionError, ledger_transitions.TransitionError) as exc:
        raise ReviewError(f"The case could not be resolved ({exc}). Nothing was changed.") from exc
    return Operation.objects.get(pk=case.operation_id)


def _known_provider_request_id(case: Case) -> str:
    """The provider's reference if anything ever told us one (shown to the customer)."""
    if case.operation.provider_request_id:
        return case.operation.provider_request_id
    for evidence in case.evidence.order_by("-created_at", "-id"):
        response = evidence.response if isinstance(evidence.response, dict) else {}
        if response.get("found") and response.get("provider_request_id"):
            return str(response["provider_request_id"])
    return ""


# --- re-send with the same key -----------------------------------------------------------

def _claim_for_resend(case: Case, *, user: User) -> ledger_transitions.Claim:
    """unknown → in_flight in the decision's own transaction: the decision and the claim that
    carries it out commit together, so a recorded re-send is never left unsent by a race."""
    operation = case.operation
    tool = tool_of(operation)
    claim = ledger_transitions.operation_claim(
        operation, worker=staff_actor(user), lease_seconds=tool.lease_seconds,
        from_status=OpStatus.UNKNOWN, reason="staff_resend",
    )
    if claim is None:
        raise ReviewError("The operation changed while you were deciding. Nothing was sent.")
    return claim


def _resend(
    case: Case, claim: ledger_transitions.Claim, *, decision: Decision, user: User
) -> Operation:
    """Send with the stored key outside any transaction, then persist the fenced outcome and
    its evidence together (the ledger's signal resolves the case when the answer is final)."""
    operation = claim.operation
    tool = tool_of(operation)
    outcome = reconciler.send_same_key(claim, tool, tool.adapter)
    with transaction.atomic():
        current, _ = reconciler.persist_resend(case=case, claim=claim, outcome=outcome,
                                               actor=staff_actor(user), user=user)
    return current


# --- checking the provider again and notes -----------------------------------------------


def case_check_provider(*, case_id: int, user: User) -> Evidence:
    """Run one lookup now and keep it as evidence (the reconciliation service; an answer that
    proves the outcome resolves the case, anything else is evidence only)."""
    case = Case.objects.select_related("operation").get(pk=case_id)
    if case.state == State.RESOLVED:
        raise CaseClosed(_closed_message(case))
    return services.case_check_now(case=case, actor=staff_actor(user), user=user)


def case_add_note(*, case_id: int, user: User, text: str) -> CaseEvent:
    text = text.strip()
    if not text:
        raise InvalidDecision("Write something in the note first.")
    with transaction.atomic():
        case = Case.objects.select_for_update(of=("self",)).get(pk=case_id)
        return _case_event(case, actor=staff_actor(user), reason="note_added",
                           data={"note": text[:4000]})


def _case_event(case: Case, *, actor: str, reason: str,
                data: Mapping[str, Any] | None = None) -> CaseEvent:
    """A fact about the case that is not a state change (claims, proposals, notes)."""
    return CaseEvent.objects.create(case=case, from_state=case.state, to_state=case.state,
                                    actor=actor, reason=reason, data=dict(data or {}))


