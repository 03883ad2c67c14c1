from __future__ import annotations

import secrets
from typing import Any

from django.db import models
from django.db.models import Q

from ledger.money import format_money


def new_status_token() -> str:
    # The customer's status link: 256 bits, so it cannot be guessed or enumerated.
    return secrets.token_urlsafe(32)


class Namespace(models.Model):
    """Where operation IDs are unique. Each credential gets its own namespace unless it is
    grouped explicitly with others (a fleet of workers of one service shares one), and an
    agent never learns anything about IDs outside its namespace."""

    name = models.CharField(max_length=100, unique=True)
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


PERSONAL_NAMESPACE_PREFIX = "agent/"


class AgentCredential(models.Model):
    """A bearer token for one agent. Only a hash is stored; the raw token is shown once."""

    name = models.CharField(max_length=100, unique=True)
    namespace = models.ForeignKey(
        Namespace, on_delete=models.PROTECT, related_name="credentials",
        help_text="Operation IDs are unique within a namespace; credentials that share one "
                  "see and replay each other's operations.",
    )
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

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.namespace_id is None:
            # Not grouped explicitly: a namespace of its own.
            self.namespace = Namespace.objects.create(
                name=f"{PERSONAL_NAMESPACE_PREFIX}{self.name}")
        super().save(*args, **kwargs)

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

    # Indexes are few on purpose: every non-HOT update writes an entry into each of them. Each
    # one that remains names the query it serves (Meta.constraints / Meta.indexes below).
    # Unique within its namespace (operation_unique_in_namespace), not across the ledger.
    operation_id = models.CharField(max_length=200)
    # No index of its own: operation_unique_in_namespace starts with it.
    namespace = models.ForeignKey(Namespace, on_delete=models.PROTECT, related_name="operations",
                                  db_index=False)
    # No index of its own: operation_agent_created_idx (the explorer's agent filter) starts
    # with it. Credentials are revoked, never deleted.
    agent = models.ForeignKey(AgentCredential, on_delete=models.PROTECT, related_name="operations",
                              db_index=False)
    run_id = models.CharField(max_length=200, blank=True)  # operation_run_idx covers it
    tool_call_ids = models.JSONField(default=list, blank=True)
    tool = models.CharField(max_length=64)
    tool_version = models.PositiveIntegerField()
    provider = models.CharField(max_length=64)
    intent_params = models.JSONField()
    params = models.JSONField(help_text="All params as submitted, with secrets redacted.")
    params_hash = models.CharField(max_length=71)

    class Execution(models.TextChoices):
        SERVER = "server", "Sent by the ledger"
        CLIENT = "client", "Sent by the agent (client-executed)"

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PREPARED)
    # Client-executed operations are claimed here but sent by the agent: the ledger never sends
    # them (no executor, no unsent sweeper, no same-key re-send by the reconciler).
    execution = models.CharField(max_length=8, choices=Execution.choices,
                                 default=Execution.SERVER)
    attempts = models.PositiveIntegerField(default=0)
    fencing_token = models.PositiveBigIntegerField(default=0)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)

    # Derived from the unique operation ID (canonical.provider_idempotency_key) and never read
    # by value, so no index: its uniqueness follows from operation_id's.
    idempotency_key = models.CharField(max_length=100)
    key_first_sent_at = models.DateTimeField(null=True, blank=True)
    provider_request_id = models.CharField(max_length=200, blank=True)
    result = models.JSONField(null=True, blank=True)
    error_class = models.CharField(max_length=100, blank=True)

    value_amount = models.BigIntegerField(null=True, blank=True, help_text="Minor units.")
    value_currency = models.CharField(max_length=3, blank=True)
    subject = models.CharField(max_length=200, blank=True)  # admin search is icontains: no index
    customer_ref = models.CharField(max_length=200, blank=True)
    status_token = models.CharField(max_length=64, default=new_status_token)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    # When the retention job blanked the free-text and secret params (ledger.retention).
    params_redacted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            # The executor's lookup (selectors.operation_lookup, operation_get_for_agent) and
            # the race-deciding INSERT … ON CONFLICT (namespace_id, operation_id) DO NOTHING:
            # every lookup by operation ID (submit, GET, replay) is within one namespace.
            models.UniqueConstraint(fields=["namespace", "operation_id"],
                                    name="operation_unique_in_namespace"),
            # The customer's status page (selectors.operation_get_by_status_token).
            models.UniqueConstraint(fields=["status_token"], name="operation_status_token_uniq"),
            models.CheckConstraint(
                condition=Q(status__in=["prepared", "in_flight", "succeeded", "failed", "unknown"]),
                name="operation_status_valid",
            ),
            models.CheckConstraint(condition=Q(execution__in=["server", "client"]),
                                   name="operation_execution_valid"),
            # A claimed row always carries the lease that tells the sweeper when it died.
            models.CheckConstraint(
                condition=~Q(status="in_flight") | Q(lease_expires_at__isnull=False),
                name="operation_in_flight_has_lease",
            ),
        ]
        indexes = [
            # The lease sweeper (reconciliation.services: status=in_flight, lease_expires_at <=
            # now) and the stuck-lease gauge (config.gauges).
            models.Index(
                fields=["lease_expires_at"],
                name="operation_inflight_lease_idx",
                condition=Q(status="in_flight"),
            ),
            # The unknown-past-SLA gauge (config.gauges: status=unknown, updated_at < …).
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
            # A run's page in a namespace, in keyset order (GET /runs/{run_id}/operations:
            # namespace and run_id equal, ordered by id), and the operators' explorer's search
            # by run ID across namespaces (run_id equal, one arm of its BitmapOr). One index
            # for both: run_id first.
            models.Index(fields=["run_id", "namespace", "id"], name="operation_run_idx"),
            # The retention job: terminal rows not yet redacted, by when they were resolved.
            models.Index(
                fields=["resolved_at"],
                name="operation_retention_idx",
                condition=Q(status__in=["succeeded", "failed"], params_redacted_at__isnull=True),
            ),
            # The first unresolved operation of a run, without reading the resolved ones.
            models.Index(
                fields=["namespace", "run_id", "id"],
                name="operation_ns_run_open_idx",
                condition=Q(status__in=["prepared", "in_flight", "unknown"]),
            ),
            # The operators' overview: unresolved rows by status, tool and provider (and the
            # in_flight/unknown/near-retention figures among them), read without touching the
            # terminal rows that make up nearly all of the table.
            models.Index(
                fields=["status", "tool", "provider"],
                name="operation_unresolved_idx",
                condition=Q(status__in=["prepared", "in_flight", "unknown"]),
            ),
            # The operations explorer: newest first, keyset pagination and time ranges.
            models.Index(fields=["created_at", "id"], name="operation_created_idx"),
            # The explorer's search by customer reference and by provider reference.
            models.Index(fields=["customer_ref"], name="operation_customer_ref_idx",
                         condition=~Q(customer_ref="")),
            models.Index(fields=["provider_request_id"], name="operation_provider_ref_idx",
                         condition=~Q(provider_request_id="")),
            # The explorer's search by subject (one arm of its BitmapOr) and its agent filter,
            # newest first; nothing on the agents' hot path reads these.
            models.Index(fields=["subject"], name="operation_subject_idx",
                         condition=~Q(subject="")),
            models.Index(fields=["agent", "created_at", "id"], name="operation_agent_created_idx"),
        ]

    def __str__(self) -> str:
        return self.operation_id

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.namespace_id is None and self.agent_id is not None:
            self.namespace_id = self.agent.namespace_id
        super().save(*args, **kwargs)

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    @property
    def value_display(self) -> str:
        if self.value_amount is None:
            return ""
        return format_money(self.value_amount, self.value_currency)


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


def new_webhook_event_id() -> str:
    # Stable across every retry and re-delivery: receivers deduplicate on it (webhook-id).
    return f"evt_{secrets.token_urlsafe(18)}"


class WebhookEndpoint(models.Model):
    """Where one agent credential's events go, and the secret they are signed with.

    The secret must be readable to sign (HMAC), so it is stored as is; it is shown once when
    created or rotated and never in the admin, logs or errors. After a rotation the previous
    secret signs too (a second `v1,` signature) until previous_secret_expires_at.
    """

    agent = models.ForeignKey(AgentCredential, on_delete=models.PROTECT,
                              related_name="webhook_endpoints")
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=100)
    previous_secret = models.CharField(max_length=100, blank=True)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    rotated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["agent__name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["agent", "url"], name="webhook_endpoint_unique_url"),
        ]

    def __str__(self) -> str:
        return f"{self.agent.name} → {self.url}"


class WebhookEvent(AppendOnlyModel):
    """The outbox: one row per outcome-level change, written in the transaction of the change.

    The body sent is the event's type, its timestamp and the operation resource as the change
    left the operation: rendered when the row is written (`payload`), or, for a claim's first
    outcome (ledger.outbox.outbox_first_outcome_sql), kept as the operation row itself
    (`operation_snapshot`, which the statement that made the change writes) and rendered from
    it by the resource's one renderer when it is read (ledger.outbox.event_payload).
    """

    append_only_label = "Webhook events"

    class Type(models.TextChoices):
        SUCCEEDED = "operation.succeeded", "operation.succeeded"
        FAILED = "operation.failed", "operation.failed"
        UNKNOWN = "operation.unknown", "operation.unknown"
        AWAITING_REVIEW = "operation.awaiting_review", "operation.awaiting_review"
        RESOLVED = "operation.resolved", "operation.resolved"

    # Unique by a constraint, not unique=True: on PostgreSQL that would add a second
    # (varchar_pattern_ops) index for LIKE queries nobody makes.
    event_id = models.CharField(max_length=40, default=new_webhook_event_id)
    agent = models.ForeignKey(AgentCredential, on_delete=models.PROTECT,
                              related_name="webhook_events")
    operation = models.ForeignKey(Operation, on_delete=models.PROTECT,
                                  related_name="webhook_events")
    # The ledger event that caused it (none for a case's escalation to a person).
    operation_event = models.OneToOneField(OperationEvent, null=True, blank=True,
                                           on_delete=models.PROTECT,
                                           related_name="webhook_event")
    type = models.CharField(max_length=40, choices=Type.choices)
    payload = models.JSONField(null=True, blank=True)
    # The operation's columns as the change left them, without its params (kept out of the
    # outbox, as they are out of the resource: retention redacts them on the operation).
    operation_snapshot = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["event_id"], name="webhook_event_id_uniq"),
            models.CheckConstraint(
                condition=models.Q(payload__isnull=False)
                | models.Q(operation_snapshot__isnull=False),
                name="webhook_event_has_body"),
        ]

    def __str__(self) -> str:
        return f"{self.event_id} {self.type} ({self.operation_id})"


class WebhookDelivery(models.Model):
    """One event to one endpoint: pending until a 2xx, retried with backoff, given up after
    the retry window. next_attempt_at doubles as the lease of the worker delivering it."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        GAVE_UP = "gave_up", "Gave up"

    event = models.ForeignKey(WebhookEvent, on_delete=models.PROTECT, related_name="deliveries")
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.PROTECT,
                                 related_name="deliveries")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=["pending", "delivered", "gave_up"]),
                                   name="webhook_delivery_status_valid"),
            models.UniqueConstraint(fields=["event", "endpoint"],
                                    name="webhook_delivery_once_per_endpoint"),
        ]
        indexes = [
            # The webhook sweep: pending deliveries that are due (or whose worker died).
            models.Index(fields=["next_attempt_at"], name="webhook_delivery_due_idx",
                         condition=Q(status="pending")),
        ]

    def __str__(self) -> str:
        return f"{self.event.event_id} → {self.endpoint.url} ({self.status})"


class WebhookAttempt(AppendOnlyModel):
    """One HTTP POST of a delivery: what came back, how long it took, or why it failed."""

    append_only_label = "Webhook attempts"

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.PROTECT,
                                 related_name="attempt_log")
    attempted_at = models.DateTimeField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(default=0)
    error = models.CharField(max_length=200, blank=True)
    actor = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["attempted_at", "id"]

    def __str__(self) -> str:
        return f"attempt {self.pk} of {self.delivery_id}: {self.status_code or self.error}"
