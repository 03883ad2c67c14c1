from __future__ import annotations

import secrets
from typing import Any

from django.db import models
from django.db.models import Q


def new_status_token() -> str:
    # The customer's status link: 256 bits, so it cannot be guessed or enumerated.
    return secrets.token_urlsafe(32)


class AgentCredential(models.Model):
    """A bearer token for one agent. Only a hash is stored; the raw token is shown once."""

    name = models.CharField(max_length=100, unique=True)
    token_prefix = models.CharField(max_length=16, unique=True)
    token_hash = models.CharField(max_length=64)
    allowed_tools = models.JSONField(default=list, blank=True)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.token_prefix}…)"

    # DRF's IsAuthenticated-style checks look at this attribute on request.user.
    is_authenticated = True

    def may_use(self, tool_name: str) -> bool:
        return tool_name in self.allowed_tools


class Operation(models.Model):
    class Status(models.TextChoices):
        PREPARED = "prepared", "Prepared"
        IN_FLIGHT = "in_flight", "In flight"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        UNKNOWN = "unknown", "Unknown"

    TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED})

    operation_id = models.CharField(max_length=200, unique=True)
    agent = models.ForeignKey(AgentCredential, on_delete=models.PROTECT, related_name="operations")
    run_id = models.CharField(max_length=200, blank=True, db_index=True)
    tool_call_ids = models.JSONField(default=list, blank=True)
    tool = models.CharField(max_length=64)
    tool_version = models.PositiveIntegerField()
    provider = models.CharField(max_length=64)
    intent_params = models.JSONField()
    params = models.JSONField(help_text="All params as submitted, with secrets redacted.")
    params_hash = models.CharField(max_length=71)

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PREPARED)
    attempts = models.PositiveIntegerField(default=0)
    fencing_token = models.PositiveBigIntegerField(default=0)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    idempotency_key = models.CharField(max_length=100, unique=True)
    key_first_sent_at = models.DateTimeField(null=True, blank=True)
    provider_request_id = models.CharField(max_length=200, blank=True)
    result = models.JSONField(null=True, blank=True)
    error_class = models.CharField(max_length=100, blank=True)

    value_amount = models.BigIntegerField(null=True, blank=True, help_text="Minor units.")
    value_currency = models.CharField(max_length=3, blank=True)
    subject = models.CharField(max_length=200, blank=True, db_index=True)
    customer_ref = models.CharField(max_length=200, blank=True)
    status_token = models.CharField(max_length=64, unique=True, default=new_status_token)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["prepared", "in_flight", "succeeded", "failed", "unknown"]),
                name="operation_status_valid",
            ),
            # A claimed row always carries the lease that tells the sweeper when it died.
            models.CheckConstraint(
                condition=~Q(status="in_flight") | Q(lease_expires_at__isnull=False),
                name="operation_in_flight_has_lease",
            ),
        ]
        indexes = [
            # The lease sweeper: in_flight rows whose lease has expired.
            models.Index(
                fields=["lease_expires_at"],
                name="operation_inflight_lease_idx",
                condition=Q(status="in_flight"),
            ),
            # Metrics and the operator's overview: unknown rows by age.
            models.Index(
                fields=["updated_at"],
                name="operation_unknown_idx",
                condition=Q(status="unknown"),
            ),
            # The unsent sweeper: prepared rows by age (executor.retry_unsent).
            models.Index(
                fields=["updated_at"],
                name="operation_prepared_idx",
                condition=Q(status="prepared"),
            ),
            # A run's operations in order (GET /runs/{run_id}/operations).
            models.Index(fields=["run_id", "created_at"], name="operation_run_idx"),
        ]

    def __str__(self) -> str:
        return self.operation_id

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    @property
    def value_display(self) -> str:
        if self.value_amount is None:
            return ""
        return f"{self.value_amount / 100:,.2f} {self.value_currency}"


class AppendOnlyError(Exception):
    pass


class AppendOnlyModel(models.Model):
    """Rows that are written once and never changed or deleted (events, evidence)."""

    append_only_label = "Rows"

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise AppendOnlyError(f"{self.append_only_label} are append-only.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError(f"{self.append_only_label} are append-only.")


class OperationEvent(AppendOnlyModel):
    """One row per change of an operation, written in the same transaction as the change.

    Rows with from_status == to_status record facts that are not transitions (a stale result
    kept as evidence, a new tool-call ID seen).
    """

    append_only_label = "Operation events"

    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="events")
    from_status = models.CharField(max_length=16, blank=True)
    to_status = models.CharField(max_length=16)
    actor = models.CharField(max_length=200)
    fencing_token = models.PositiveBigIntegerField(default=0)
    reason = models.CharField(max_length=64)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.operation_id}: {self.from_status or '∅'} → {self.to_status} ({self.reason})"



class ToolVersion(models.Model):
    """A catalogue tool version as it was when an operation first used it.

    A used version is immutable: its fingerprint (params schema, intent fields, value, subject,
    provider) is recorded on first use, and a catalogue that later declares the same version
    differently is refused (by `manage.py check --database default`, by `migrate`, and by the
    first submission of each process) instead of silently changing old operations' meaning.
    """

    tool = models.CharField(max_length=64)
    version = models.PositiveIntegerField()
    fingerprint = models.CharField(max_length=71)
    first_used_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tool", "version"]
        constraints = [
            models.UniqueConstraint(fields=["tool", "version"], name="tool_version_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.tool} v{self.version}"
