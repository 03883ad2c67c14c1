from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q

from ledger.models import AppendOnlyModel, Operation


class Case(models.Model):
    """The work item that resolves one unknown operation."""

    class State(models.TextChoices):
        CHECKING = "checking", "Checking with the provider"
        AWAITING_REVIEW = "awaiting_review", "Awaiting review"
        RESOLVED = "resolved", "Resolved"

    class OpenReason(models.TextChoices):
        TIMEOUT_AFTER_SEND = "timeout_after_send", "Timeout after send"
        CONNECTION_RESET = "connection_reset", "Connection reset"
        AMBIGUOUS_5XX = "ambiguous_5xx", "Ambiguous 5xx"
        LEASE_EXPIRED = "lease_expired", "Lease expired (worker died)"
        PROVIDER_IN_PROGRESS = "provider_in_progress", "Provider still executing"
        AMBIGUOUS_RESPONSE = "ambiguous_response", "Ambiguous response"

    class Resolution(models.TextChoices):
        """How a case was resolved (the reason code of the resolving transition)."""

        STAFF_CONFIRMED = "staff_confirmed", "Confirmed by staff"
        STAFF_REJECTED = "staff_rejected", "Rejected by staff"
        LOOKUP_PROVED_SUCCESS = "lookup_proved_success", "Provider's record proved it happened"
        LOOKUP_PROVED_ABSENT = "lookup_proved_absent", "Provider proved it did not happen"
        PROVIDER_CONFIRMED = "provider_confirmed", "Provider confirmed it"
        PROVIDER_REJECTED = "provider_rejected", "Provider rejected it"
        LATE_CONFIRMATION = "late_confirmation", "Provider's late answer confirmed it"
        LATE_REJECTION = "late_rejection", "Provider's late answer rejected it"

    class ReviewReason(models.TextChoices):
        """Why a person has to look (reconciliation.transitions.REVIEW_REASONS)."""

        HIGH_VALUE = "high_value", "High value"
        ANOMALY = "anomaly", "Provider record differs"
        KEY_RETENTION_PASSED = "key_retention_passed", "Key retention passed"
        DEADLINE_PASSED = "deadline_passed", "Deadline passed"
        NOT_FOUND_NOT_AUTHORITATIVE = "not_found_not_authoritative", "Absent, not authoritative"
        NO_STRATEGY = "no_strategy", "No way to check"
        MANUAL = "manual", "Escalated by staff"

    operation = models.OneToOneField(
        Operation, on_delete=models.PROTECT, related_name="reconciliation_case"
    )
    state = models.CharField(max_length=20, choices=State.choices, default=State.CHECKING)
    open_reason = models.CharField(max_length=32, choices=OpenReason.choices)
    review_reason = models.CharField(max_length=32, blank=True, choices=ReviewReason.choices)
    attempts = models.PositiveIntegerField(default=0)
    next_check_at = models.DateTimeField(null=True, blank=True)
    last_checked_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField()
    strategies_tried = models.JSONField(default=list, blank=True)
    resolution = models.CharField(max_length=32, blank=True, choices=Resolution.choices)
    resolved_by = models.CharField(max_length=200, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    # Contradicting evidence arrived after a person decided: flagged, never silently flipped.
    flagged = models.BooleanField(default=False)
    # The review queue's SLA, and its sort key: soonest deadline, then highest value.
    review_deadline_at = models.DateTimeField(null=True, blank=True)
    value_amount = models.BigIntegerField(null=True, blank=True)
    # An exclusive, expiring claim by one staff member; deciding requires holding it.
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
        related_name="claimed_cases",
    )
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]
        permissions = [("review_case", "Can work the reconciliation review queue")]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["checking", "awaiting_review", "resolved"]),
                name="case_state_valid",
            ),
        ]
        indexes = [
            # The case sweeper: due checking cases by next check time.
            models.Index(fields=["next_check_at"], name="case_due_idx",
                         condition=Q(state="checking")),
            # The review queue: soonest review deadline, then highest value.
            models.Index(fields=["review_deadline_at", "-value_amount"], name="case_review_idx",
                         condition=Q(state="awaiting_review")),
        ]

    def __str__(self) -> str:
        operation = self.operation
        tool = operation.tool.replace("_", " ")
        return f"Case for {tool} {operation.operation_id} ({self.get_state_display()})"

    def summary(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "open_reason": self.open_reason,
            "review_reason": self.review_reason or None,
            "attempts": self.attempts,
            "last_checked_at": self.last_checked_at,
            "next_check_at": self.next_check_at,
            "resolution": self.resolution or None,
        }


class CaseEvent(AppendOnlyModel):
    append_only_label = "Case events"

    case = models.ForeignKey(Case, on_delete=models.PROTECT, related_name="events")
    from_state = models.CharField(max_length=20, blank=True)
    to_state = models.CharField(max_length=20)
    actor = models.CharField(max_length=200)
    reason = models.CharField(max_length=64)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        states = dict(Case.State.choices)
        before = states.get(self.from_state, "New") if self.from_state else "New"
        reason = self.reason.replace("_", " ")
        if self.from_state == self.to_state:
            return f"Case {self.case_id}: {reason}"
        after = states.get(self.to_state, self.to_state)
        return f"Case {self.case_id}: {before} → {after} ({reason})"



class Evidence(AppendOnlyModel):
    """Every provider call or lookup made while resolving a case: what was asked, what came
    back, when."""

    append_only_label = "Evidence rows"

    case = models.ForeignKey(Case, on_delete=models.PROTECT, related_name="evidence")
    kind = models.CharField(max_length=32)  # lookup, resend, stale_result, staff_check
    request = models.JSONField(default=dict, blank=True)
    response = models.JSONField(default=dict, blank=True)
    outcome = models.CharField(max_length=64)
    actor = models.CharField(max_length=200)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        kind = self.kind.replace("_", " ").capitalize()
        return f"{kind} on case {self.case_id}: {self.outcome.replace('_', ' ')}"



class Decision(models.Model):
    """A staff member's decision on a case, bound to the params hash it was made on.

    Below the four-eyes threshold one decision takes effect; at or above it a second, different
    staff member must approve the same action before it does.
    """

    class Action(models.TextChoices):
        CONFIRM = "confirm", "Confirm: it happened"
        REJECT = "reject", "Reject: it did not happen"
        RESEND = "resend", "Re-send with the same key"

    class Status(models.TextChoices):
        AWAITING_SECOND = "awaiting_second", "Awaiting second approval"
        APPLIED = "applied", "Applied"
        WITHDRAWN = "withdrawn", "Withdrawn"

    case = models.ForeignKey(Case, on_delete=models.PROTECT, related_name="decisions")
    action = models.CharField(max_length=16, choices=Action.choices)
    status = models.CharField(max_length=16, choices=Status.choices)
    reason_code = models.CharField(max_length=64)
    note = models.TextField()
    params_hash = models.CharField(max_length=71)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                   related_name="case_decisions")
    approves = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT,
                                 related_name="approvals")
    # A decision against the latest definitive evidence (reject after a matching lookup,
    # confirm after proven absence) is an override: its written reason and the evidence it
    # overrode are kept, and it always waits for a second, different reviewer.
    override_reason = models.TextField(blank=True)
    overrides_evidence = models.ForeignKey(
        Evidence, null=True, blank=True, on_delete=models.PROTECT, related_name="overridden_by",
    )
    # The amount the reviewer typed as checked at the provider (minor units), if they did.
    amount_checked = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(action__in=["confirm", "reject", "resend"]),
                name="decision_action_valid",
            ),
            # At most one pending proposal per person per case; a person may decide again
            # after an earlier decision was carried out (a re-send that stayed unknown).
            models.UniqueConstraint(
                fields=["case", "decided_by"], condition=Q(status="awaiting_second"),
                name="decision_one_pending_per_person",
            ),
            # Nobody approves the same proposal twice.
            models.UniqueConstraint(
                fields=["approves", "decided_by"], name="decision_one_approval_per_person",
            ),
        ]

    def __str__(self) -> str:
        return (f"{self.get_action_display()} on case {self.case_id} "
                f"({self.get_status_display().lower()})")

    @property
    def is_override(self) -> bool:
        return self.overrides_evidence_id is not None
