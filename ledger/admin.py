from __future__ import annotations

import json
from typing import cast

from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from ledger import auth, outbox, transitions, webhooks
from ledger.models import (
    AgentCredential,
    Namespace,
    Operation,
    OperationEvent,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)


@admin.register(Namespace)
class NamespaceAdmin(admin.ModelAdmin):
    """Where operation IDs are unique. Group a fleet's credentials by choosing the same
    namespace for them (here, or `manage.py create_agent NAME --namespace FLEET`)."""

    list_display = ["name", "description", "credential_count", "created_at"]
    search_fields = ["name"]
    readonly_fields = ["created_at"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Namespace]:
        return super().get_queryset(request).annotate(_credentials=Count("credentials"))

    @admin.display(description="credentials", ordering="_credentials")
    def credential_count(self, obj: Namespace) -> int:
        return getattr(obj, "_credentials", 0)


@admin.register(AgentCredential)
class AgentCredentialAdmin(admin.ModelAdmin):
    list_display = ["name", "namespace", "token_prefix", "allowed_tools", "is_active",
                    "created_at", "last_used_at"]
    list_filter = ["is_active"]
    list_select_related = ["namespace"]
    search_fields = ["name", "token_prefix", "namespace__name"]
    readonly_fields = ["token_prefix", "token_hash", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> list[str]:
        fields = list(super().get_readonly_fields(request, obj))
        # A credential that has recorded operations keeps its namespace: moving it would hide
        # its operations from it and let their IDs be reused for other intents.
        if isinstance(obj, AgentCredential) and obj.operations.exists():
            fields.append("namespace")
        return fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Tokens are minted by `manage.py create_agent`, which shows the raw token once.
        return False

    @admin.action(description="Revoke selected credentials")
    def revoke(self, request: HttpRequest, queryset: QuerySet[AgentCredential]) -> None:
        for agent in queryset:
            auth.agent_revoke(agent=agent)
        self.message_user(request, f"Revoked {queryset.count()} credential(s).")


class OperationEventInline(admin.TabularInline):
    model = OperationEvent
    extra = 0
    can_delete = False
    fields = ["created_at", "from_status", "to_status", "actor", "fencing_token", "reason", "data"]
    # Plain field names only (no fieldset groups), so the same list is the read-only one.
    readonly_fields = cast("list[str]", fields)

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Operation)
class OperationAdmin(admin.ModelAdmin):
    # Fits a 1,280 px screen (see static/css/admin.css: long IDs wrap inside their cell).
    list_display = ["operation_id", "tool_name", "status", "value", "subject", "agent_name",
                    "created_at"]
    list_filter = ["status", "execution", "tool", "provider"]
    # "^status_token": the short reference a customer quotes is the start of their status link.
    search_fields = ["operation_id", "run_id", "subject", "customer_ref", "provider_request_id",
                     "^status_token"]
    list_select_related = ["agent"]
    date_hierarchy = "created_at"
    inlines = [OperationEventInline]
    actions = ["expire_leases"]

    @admin.display(description="tool", ordering="tool")
    def tool_name(self, operation: Operation) -> str:
        return operation.tool.replace("_", " ")

    @admin.display(description="value", ordering="value_amount")
    def value(self, operation: Operation) -> str:
        return operation.value_display or "—"

    @admin.display(description="agent", ordering="agent__name")
    def agent_name(self, operation: Operation) -> str:
        return operation.agent.name

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> list[str]:
        # Nothing about an operation is edited by hand: status moves only through transitions.
        return [f.name for f in Operation._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    @admin.action(description="Mark in-flight rows with an expired lease as unknown")
    def expire_leases(self, request: HttpRequest, queryset: QuerySet[Operation]) -> None:
        moved = 0
        for operation in queryset.filter(status=Operation.Status.IN_FLIGHT):
            if transitions.operation_expire_lease(operation=operation).status == "unknown":
                moved += 1
        self.message_user(request, f"{moved} operation(s) moved to unknown.", messages.INFO)


@admin.register(OperationEvent)
class OperationEventAdmin(admin.ModelAdmin):
    list_display = ["operation", "from_status", "to_status", "actor", "fencing_token", "reason",
                    "created_at"]
    list_filter = ["to_status", "reason"]
    search_fields = ["operation__operation_id", "operation__run_id", "actor"]
    list_select_related = ["operation"]

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> list[str]:
        return [f.name for f in OperationEvent._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


# --- webhooks ----------------------------------------------------------------------------------

class _ReadOnlyAdmin(admin.ModelAdmin):
    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> list[str]:
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


def _redeliver(request: HttpRequest, deliveries: QuerySet[WebhookDelivery]) -> int:
    actor = f"staff:{request.user.get_username()}"
    count = 0
    for delivery in deliveries:
        webhooks.delivery_requeue(delivery=delivery, actor=actor)
        count += 1
    return count


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    """Secrets never appear here: `manage.py webhooks add|rotate` shows them once."""

    list_display = ["agent", "url", "is_active", "created_at", "rotated_at"]
    list_filter = ["is_active"]
    search_fields = ["agent__name", "url"]
    list_select_related = ["agent"]
    fields = ["agent", "url", "is_active", "created_at", "rotated_at",
              "previous_secret_expires_at"]
    readonly_fields = ["agent", "url", "is_active", "created_at", "rotated_at",
                       "previous_secret_expires_at"]
    actions = ["deactivate"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    @admin.action(description="Stop delivering to selected endpoints")
    def deactivate(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        for endpoint in queryset:
            webhooks.endpoint_remove(endpoint=endpoint)
        self.message_user(request, f"Deactivated {queryset.count()} endpoint(s).")


class WebhookDeliveryInline(admin.TabularInline):
    model = WebhookDelivery
    extra = 0
    can_delete = False
    fields = ["endpoint", "status", "attempts", "next_attempt_at", "last_attempt_at",
              "delivered_at"]
    readonly_fields = cast("list[str]", fields)
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(WebhookEvent)
class WebhookEventAdmin(_ReadOnlyAdmin):
    list_display = ["event_id", "type", "operation", "agent", "created_at"]
    list_filter = ["type"]
    search_fields = ["event_id", "operation__operation_id", "operation__run_id"]
    list_select_related = ["operation", "agent"]
    inlines = [WebhookDeliveryInline]
    actions = ["redeliver"]
    # The body as every delivery sends it, whether the row holds it rendered or as the
    # operation's snapshot (ledger.outbox.event_payload).
    exclude = ["payload", "operation_snapshot"]

    def get_readonly_fields(self, request: HttpRequest, obj: object = None) -> list[str]:
        return [*(name for name in super().get_readonly_fields(request, obj)
                  if name not in self.exclude), "body"]

    @admin.display(description="Body sent")
    def body(self, obj: WebhookEvent) -> str:
        text = json.dumps(outbox.event_payload(obj), indent=2, ensure_ascii=False)
        return format_html("<pre>{}</pre>", text)

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return request.method in ("GET", "HEAD") and super().has_change_permission(request, obj)

    @admin.action(description="Re-deliver selected events to every endpoint they went to")
    def redeliver(self, request: HttpRequest, queryset: QuerySet[WebhookEvent]) -> None:
        count = _redeliver(request, WebhookDelivery.objects.filter(event__in=queryset))
        self.message_user(request, f"{count} delivery(ies) queued again.")


class WebhookAttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    can_delete = False
    fields = ["attempted_at", "status_code", "latency_ms", "error", "actor"]
    readonly_fields = cast("list[str]", fields)

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(_ReadOnlyAdmin):
    list_display = ["event", "endpoint", "status", "attempts", "next_attempt_at",
                    "last_attempt_at", "delivered_at"]
    list_filter = ["status"]
    search_fields = ["event__event_id", "event__operation__operation_id", "endpoint__url"]
    list_select_related = ["event", "endpoint", "endpoint__agent"]
    inlines = [WebhookAttemptInline]
    actions = ["redeliver"]

    @admin.action(description="Re-deliver selected deliveries now")
    def redeliver(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        count = _redeliver(request, queryset)
        self.message_user(request, f"{count} delivery(ies) queued again.")


@admin.register(WebhookAttempt)
class WebhookAttemptAdmin(_ReadOnlyAdmin):
    list_display = ["delivery", "attempted_at", "status_code", "latency_ms", "error", "actor"]
    list_filter = ["status_code"]
    search_fields = ["delivery__event__event_id"]
    list_select_related = ["delivery", "delivery__event", "delivery__endpoint"]

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return request.method in ("GET", "HEAD") and super().has_change_permission(request, obj)
