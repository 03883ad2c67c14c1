"""The operators' review queue: claims, decisions, approvals, notes, and the queue's selectors.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, Prefetch, Q, QuerySet
from django.utils import timezone

from ledger import transitions as ledger_transitions
from ledger.models import Operation, OperationEvent
from ledger.providers.base import Capabilities
from ledger.tools import Tool, UnknownTool, adapter_of, latest_tools, tool_names, tool_of
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
BREACHING_WINDOW = dt.timedelta(hours=1)
PAGE_SIZE = 50
# Tab badges count at most this many rows: a COUNT(*) over 100,000 open cases on every page
# view would cost more than the page itself.
COUNT_BOUND = 1000

# Labels for reconciliation.transitions.REVIEW_REASONS (unknown codes are shown humanised).
REVIEW_REASONS: dict[str, str] = {
    "high_value": "High value",
    "anomaly": "Provider record differs",
    "key_retention_passed": "Key retention passed",
    "deadline_passed": "Deadline passed",
    "not_found_not_authoritative": "Absent, not authoritative",
    "no_strategy": "No way to check",
    "manual": "Escalated by staff",
}

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


def review_reason_label(code: str) -> str:
    return REVIEW_REASONS.get(code, code.replace("_", " ").capitalize() or "Escalated")


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


class DecisionNotPending(ReviewError):
    pass


class InvalidDecision(ReviewError):
    status_code = 422


# --- claims ------------------------------------------------------------------------------

def claim_is_live(case: Case, now: dt.datetime | None = None) -> bool:
    now = now or timezone.now()
    return bool(case.claimed_by_id and case.claim_expires_at and case.claim_expires_at > now)


def holds_claim(case: Case, user: User, now: dt.datetime | None = None) -> bool:
    return claim_is_live(case, now) and case.claimed_by_id == user.pk


def _when(moment: dt.datetime | None) -> str:
    return timezone.localtime(moment).strftime("%H:%M %Z") if moment else "—"


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
        touched = (
            Case.objects.filter(pk=case_id, state=State.AWAITING_REVIEW)
            .filter(
                Q(claimed_by__isnull=True)
                | Q(claim_expires_at__isnull=True)
                | Q(claim_expires_at__lte=now)
                | Q(claimed_by=user)
            )
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


def four_eyes_threshold_display(operation: Operation) -> str:
    try:
        threshold = tool_of(operation).four_eyes_thresholds.get(operation.value_currency)
    except UnknownTool:
        return ""
    if threshold is None:
        return ""
    return f"{threshold / 100:,.2f} {operation.value_currency}".strip()


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
    params_hash: str, now: dt.datetime,
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
    params_hash: str, now: dt.datetime | None = None,
) -> DecisionOutcome:
    """Record a reviewer's decision; apply it now, or hold it for a second approval."""
    now = now or timezone.now()
    with transaction.atomic():
        case = _locked_case(case_id)
        _validate_decision(case, user=user, action=action, reason_code=reason_code, note=note,
                           params_hash=params_hash, now=now)
        if case.decisions.filter(status=DecisionStatus.AWAITING_SECOND).exists():
            raise ReviewError(
                "A decision on this case is already waiting for a second approval: approve or "
                "decline it first. Nothing was changed."
            )
        four_eyes = needs_four_eyes(case.operation)
        decision = _create_decision(
            case=case, action=action, reason_code=reason_code, note=note.strip(),
            params_hash=params_hash, decided_by=user,
            status=DecisionStatus.AWAITING_SECOND if four_eyes else DecisionStatus.APPLIED,
        )
        _case_event(case, actor=staff_actor(user),
                    reason="decision_proposed" if four_eyes else "decision_made",
                    data=_decision_data(decision))
        if four_eyes:
            # The proposer steps back so a second reviewer can claim the case and approve.
            _drop_claim(case, now)
            return DecisionOutcome(
                case=case, decision=decision, applied=False, operation=case.operation,
                message=(f"{Action(action).label} recorded: 1 of 2 approvals. A second, "
                         "different reviewer must approve it before it takes effect."),
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
        approval = _create_decision(
            case=case, action=proposal.action, reason_code=reason_code, note=note.strip(),
            params_hash=params_hash, decided_by=user, approves=proposal,
            status=DecisionStatus.APPLIED,
        )
        _decision_set_status(proposal, DecisionStatus.APPLIED)
        _case_event(case, actor=staff_actor(user), reason="decision_approved",
                    data={**_decision_data(approval), "approves": proposal.pk})
        if proposal.action != Action.RESEND:
            operation = _apply_resolution(case, decisions=[proposal, approval], user=user)
            return _applied(case, approval, operation)
        claim = _claim_for_resend(case, user=user)
    return _applied(case, approval, _resend(case, claim, decision=approval, user=user))


def decision_withdraw(
    *, decision_id: int, user: User, note: str = "", now: dt.datetime | None = None,
) -> Decision:
    """Withdraw a proposal waiting for its second approval (the proposer's change of mind, or
    a second reviewer declining it). Needs the claim like every other decision."""
    now = now or timezone.now()
    with transaction.atomic():
        proposal = Decision.objects.get(pk=decision_id)
        case = _locked_case(proposal.case_id)
        proposal = Decision.objects.select_for_update().get(pk=decision_id)
        _require_pending(proposal)
        if case.state != State.AWAITING_REVIEW:
            raise CaseClosed(_closed_message(case))
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
    return {
        "decision": decision.pk, "action": decision.action, "reason_code": decision.reason_code,
        "params_hash": decision.params_hash,
    }


def _applied(case: Case, decision: Decision, operation: Operation) -> DecisionOutcome:
    case.refresh_from_db()
    labels = {
        OpStatus.SUCCEEDED: "Confirmed: the operation is now succeeded and the case resolved.",
        OpStatus.FAILED: "Rejected: the operation is now failed and the case resolved.",
        OpStatus.UNKNOWN: ("Re-sent with the same key, but the provider's answer is still "
                           "unknown. The case stays in review."),
        OpStatus.IN_FLIGHT: "Re-sent with the same key; the answer is still on its way.",
    }
    message = labels.get(OpStatus(operation.status), f"Operation is {operation.status}.")
    if decision.action == Action.RESEND and operation.status == OpStatus.SUCCEEDED:
        message = "Re-sent with the same key: the provider confirmed it. Case resolved."
    elif decision.action == Action.RESEND and operation.status == OpStatus.FAILED:
        message = "Re-sent with the same key: the provider rejected it. Case resolved."
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

CHECK_OUTCOMES = {
    "found_match": "the provider has a record that matches the intent",
    "found_mismatch": "the provider has a record that does NOT match the intent",
    "found_multiple": "the provider has more than one record for it",
    "found_pending": "the provider is still executing it",
    "found_not_succeeded": "the provider has a record that did not succeed",
    "not_found": "the provider has no record",
    "unavailable": "the provider's lookup was unavailable",
}


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


# --- selectors -----------------------------------------------------------------------------

TABS: dict[str, str] = {
    "mine": "Assigned to me",
    "unclaimed": "Unclaimed",
    "second": "Awaiting second approval",
    "breaching": "Breaching soon",
    "all": "All open",
}
DEFAULT_TAB = "all"
AGE_FILTERS: dict[str, tuple[str, dt.timedelta]] = {
    "1h": ("Older than 1 hour", dt.timedelta(hours=1)),
    "4h": ("Older than 4 hours", dt.timedelta(hours=4)),
    "24h": ("Older than 1 day", dt.timedelta(days=1)),
    "7d": ("Older than 7 days", dt.timedelta(days=7)),
}


@dataclass(frozen=True)
class QueueFilters:
    tool: str = ""
    provider: str = ""
    reason: str = ""
    min_value: int | None = None  # minor units
    max_value: int | None = None
    age: str = ""


def _pending_decisions() -> Prefetch:
    return Prefetch(
        "decisions",
        queryset=Decision.objects.filter(status=DecisionStatus.AWAITING_SECOND).select_related(
            "decided_by"),
        to_attr="pending_decisions",
    )


def case_queue(*, user: User, tab: str, filters: QueueFilters,
               now: dt.datetime | None = None) -> QuerySet[Case]:
    """Cases awaiting review for one tab, filtered, in the queue's order (not yet paginated)."""
    now = now or timezone.now()
    queryset = Case.objects.filter(state=State.AWAITING_REVIEW)
    live_claim = Q(claimed_by__isnull=False, claim_expires_at__gt=now)
    if tab == "mine":
        queryset = queryset.filter(live_claim, claimed_by=user)
    elif tab == "unclaimed":
        queryset = queryset.exclude(live_claim)
    elif tab == "second":
        queryset = queryset.filter(Exists(Decision.objects.filter(
            case=OuterRef("pk"), status=DecisionStatus.AWAITING_SECOND)))
    elif tab == "breaching":
        queryset = queryset.filter(review_deadline_at__lte=now + BREACHING_WINDOW)
    return _filtered(queryset, filters, now)


def _filtered(queryset: QuerySet[Case], filters: QueueFilters,
              now: dt.datetime) -> QuerySet[Case]:
    if filters.tool:
        queryset = queryset.filter(operation__tool=filters.tool)
    if filters.provider:
        queryset = queryset.filter(operation__provider=filters.provider)
    if filters.reason:
        queryset = queryset.filter(review_reason=filters.reason)
    if filters.min_value is not None:
        queryset = queryset.filter(value_amount__gte=filters.min_value)
    if filters.max_value is not None:
        queryset = queryset.filter(value_amount__lte=filters.max_value)
    if filters.age in AGE_FILTERS:
        queryset = queryset.filter(created_at__lte=now - AGE_FILTERS[filters.age][1])
    return queryset


def _ordered(queryset: QuerySet[Case], *, reverse: bool = False) -> QuerySet[Case]:
    """Soonest review deadline, then highest value, then oldest. This matches the partial
    index case_review_idx (review_deadline_at ASC, which PostgreSQL keeps NULLS LAST;
    value_amount DESC, NULLS FIRST), so the database reads the page straight off the index."""
    if not reverse:
        return queryset.order_by(
            F("review_deadline_at").asc(nulls_last=True),
            F("value_amount").desc(nulls_first=True),
            F("pk").asc(),
        )
    return queryset.order_by(
        F("review_deadline_at").desc(nulls_first=True),
        F("value_amount").asc(nulls_last=True),
        F("pk").desc(),
    )


def _tail_after(anchor: Case) -> Q:
    """Among rows with the anchor's deadline: value DESC NULLS FIRST, then pk."""
    value, pk = anchor.value_amount, anchor.pk
    if value is None:
        return Q(value_amount__isnull=False) | Q(value_amount__isnull=True, pk__gt=pk)
    return Q(value_amount__lt=value) | Q(value_amount=value, pk__gt=pk)


def _after(anchor: Case) -> Q:
    """Rows after `anchor` in the queue's order that have a deadline at all (keyset).

    The leading `>=` is redundant but lets PostgreSQL start the index scan at the anchor
    instead of filtering its way there from the first row. Rows without a deadline (last in
    the order) are fetched separately, because OR-ing them in here would cost that start.
    """
    deadline = anchor.review_deadline_at
    if deadline is None:
        return Q(review_deadline_at__isnull=True) & _tail_after(anchor)
    return Q(review_deadline_at__gte=deadline) & (
        Q(review_deadline_at__gt=deadline) | (Q(review_deadline_at=deadline) & _tail_after(anchor))
    )


def _before(anchor: Case) -> Q:
    deadline, value, pk = anchor.review_deadline_at, anchor.value_amount, anchor.pk
    if value is None:
        tail = Q(value_amount__isnull=True, pk__lt=pk)
    else:
        tail = (Q(value_amount__gt=value) | Q(value_amount__isnull=True)
                | Q(value_amount=value, pk__lt=pk))
    if deadline is None:
        return Q(review_deadline_at__isnull=False) | (Q(review_deadline_at__isnull=True) & tail)
    return Q(review_deadline_at__lte=deadline) & (
        Q(review_deadline_at__lt=deadline) | (Q(review_deadline_at=deadline) & tail)
    )


@dataclass
class QueuePage:
    cases: list[Case]
    next_after: int | None = None
    prev_before: int | None = None
    is_first: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def case_queue_page(
    queryset: QuerySet[Case], *, after: int | None = None, before: int | None = None,
    size: int | None = None,
) -> QueuePage:
    """One page by keyset: constant cost however deep the page, no COUNT(*)."""
    size = size or PAGE_SIZE
    queryset = queryset.select_related("operation", "operation__agent", "claimed_by")
    queryset = queryset.prefetch_related(_pending_decisions())
    anchor_pk = after or before
    anchor = Case.objects.filter(pk=anchor_pk).first() if anchor_pk else None
    if anchor is not None and before:
        rows = list(_ordered(queryset.filter(_before(anchor)), reverse=True)[: size + 1])
        has_more_before = len(rows) > size
        rows = list(reversed(rows[:size]))
        return QueuePage(
            cases=rows, next_after=rows[-1].pk if rows else None,
            prev_before=rows[0].pk if rows and has_more_before else None,
            is_first=not has_more_before,
        )
    if anchor is None:
        rows = list(_ordered(queryset)[: size + 1])
    else:
        rows = list(_ordered(queryset.filter(_after(anchor)))[: size + 1])
        if len(rows) <= size and anchor.review_deadline_at is not None:
            undated = queryset.filter(review_deadline_at__isnull=True)
            rows += list(_ordered(undated)[: size + 1 - len(rows)])
    has_next = len(rows) > size
    rows = rows[:size]
    return QueuePage(
        cases=rows,
        next_after=rows[-1].pk if has_next and rows else None,
        prev_before=rows[0].pk if anchor is not None and rows else None,
        is_first=anchor is None,
    )


def bounded_count(queryset: QuerySet[Any], bound: int | None = None) -> tuple[int, bool]:
    """(count, capped): counts at most `bound` rows."""
    bound = bound or COUNT_BOUND
    count = queryset.order_by()[: bound + 1].count()
    return min(count, bound), count > bound


def case_tab_counts(*, user: User, filters: QueueFilters,
                    now: dt.datetime | None = None) -> dict[str, tuple[int, bool]]:
    now = now or timezone.now()
    return {tab: bounded_count(case_queue(user=user, tab=tab, filters=filters, now=now))
            for tab in TABS}


def review_cursor() -> int:
    """The newest case event's id: new arrivals are counted from here."""
    latest = CaseEvent.objects.order_by("-pk").values_list("pk", flat=True).first()
    return latest or 0


def case_new_arrivals(*, since_event: int, bound: int = 99) -> tuple[int, bool]:
    """Cases that entered review after `since_event` and are still waiting (primary-key range
    scan on the event table: cheap however long the history is)."""
    case_ids = (
        CaseEvent.objects.filter(pk__gt=since_event, to_state=State.AWAITING_REVIEW)
        .exclude(from_state=State.AWAITING_REVIEW)
        .values("case_id")
    )
    queryset = Case.objects.filter(pk__in=case_ids, state=State.AWAITING_REVIEW)
    return bounded_count(queryset, bound)


def case_get_for_review(case_id: int) -> Case:
    return (
        Case.objects.select_related("operation", "operation__agent", "claimed_by")
        .prefetch_related(_pending_decisions())
        .get(pk=case_id)
    )


def tool_choices() -> list[tuple[str, str]]:
    return [(name, name.replace("_", " ")) for name in tool_names()]


def provider_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in sorted({tool.provider for tool in latest_tools()})]


def review_reason_choices() -> list[tuple[str, str]]:
    return sorted(REVIEW_REASONS.items(), key=lambda item: item[1])


# --- the evidence panel --------------------------------------------------------------------

@dataclass
class Attempt:
    number: int
    fencing_token: int
    started_at: dt.datetime
    started_by: str
    reason: str
    outcome: str = "no answer recorded"
    outcome_at: dt.datetime | None = None
    error_class: str = ""
    stale_results: list[OperationEvent] = field(default_factory=list)


@dataclass
class TimelineEntry:
    at: dt.datetime
    source: str  # "operation" or "case"
    actor: str
    reason: str
    from_state: str
    to_state: str
    data: dict[str, Any]


@dataclass
class EvidencePanel:
    tool: Tool | None
    intent_params: dict[str, Any]
    params: dict[str, Any]
    attempts: list[Attempt]
    lookups: list[Evidence]
    timeline: list[TimelineEntry]
    notes: list[dict[str, Any]]
    key_retention_deadline: dt.datetime | None
    resend_deadline: dt.datetime | None
    resend_allowed: bool
    honours_keys: bool
    decisions: list[Decision]


def _attempts(events: Iterable[OperationEvent]) -> list[Attempt]:
    attempts: dict[int, Attempt] = {}
    for event in events:
        if event.to_status == OpStatus.IN_FLIGHT and event.from_status != OpStatus.IN_FLIGHT:
            attempts[event.fencing_token] = Attempt(
                number=len(attempts) + 1, fencing_token=event.fencing_token,
                started_at=event.created_at, started_by=event.actor, reason=event.reason,
            )
        elif event.reason == "stale_result_ignored" and event.fencing_token in attempts:
            attempts[event.fencing_token].stale_results.append(event)
        elif event.from_status == OpStatus.IN_FLIGHT and event.fencing_token in attempts:
            attempt = attempts[event.fencing_token]
            attempt.outcome = f"{event.to_status} ({event.reason})"
            attempt.outcome_at = event.created_at
            attempt.error_class = str(event.data.get("error_class", ""))
    return list(attempts.values())


def _redacted(tool: Tool | None, params: Mapping[str, Any]) -> dict[str, Any]:
    return tool.redacted(params) if tool else dict(params)


def _timeline(op_events: list[OperationEvent], case_events: list[CaseEvent]
              ) -> list[TimelineEntry]:
    entries = [
        TimelineEntry(at=e.created_at, source="operation", actor=e.actor, reason=e.reason,
                      from_state=e.from_status, to_state=e.to_status, data=e.data)
        for e in op_events
    ] + [
        TimelineEntry(at=e.created_at, source="case", actor=e.actor, reason=e.reason,
                      from_state=e.from_state, to_state=e.to_state, data=e.data)
        for e in case_events
    ]
    return sorted(entries, key=lambda entry: entry.at)


def _notes(case_events: list[CaseEvent], decisions: list[Decision]) -> list[dict[str, Any]]:
    """Free notes and every decision's note, oldest first."""
    notes = [
        {"at": e.created_at, "actor": e.actor, "text": e.data.get("note", ""), "kind": "note"}
        for e in case_events if e.reason == "note_added"
    ] + [
        {"at": d.created_at, "actor": staff_actor(d.decided_by), "text": d.note,
         "kind": f"{d.get_action_display()} ({d.get_status_display().lower()})"}
        for d in decisions
    ]
    return sorted(notes, key=lambda note: note["at"])


def case_evidence(case: Case) -> EvidencePanel:
    """Everything a reviewer needs to decide, read in five queries."""
    operation = case.operation
    try:
        tool: Tool | None = tool_of(operation)
    except UnknownTool:
        tool = None
    op_events = list(operation.events.order_by("created_at", "id"))
    case_events = list(case.events.order_by("created_at", "id"))
    decisions = list(case.decisions.select_related("decided_by", "approves").order_by(
        "created_at", "id"))
    capabilities = _capabilities(operation)
    return EvidencePanel(
        tool=tool,
        intent_params=_redacted(tool, operation.intent_params),
        params=_redacted(tool, operation.params),
        attempts=_attempts(op_events),
        lookups=list(case.evidence.select_related("created_by").order_by("created_at", "id")),
        timeline=_timeline(op_events, case_events),
        notes=_notes(case_events, decisions),
        key_retention_deadline=key_retention_deadline(operation),
        resend_deadline=resend_deadline(operation),
        resend_allowed=resend_allowed(operation),
        honours_keys=bool(capabilities and capabilities.honours_idempotency_keys),
        decisions=decisions,
    )
