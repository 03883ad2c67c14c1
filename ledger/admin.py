from __future__ import annotations

from typing import cast

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from ledger import auth, transitions
from ledger.models import AgentCredential, Operation, OperationEvent


@admin.register(AgentCredential)
class AgentCredentialAdmin(admin.ModelAdmin):
    list_display = ["name", "token_prefix", "allowed_tools", "is_active", "created_at",
                    "last_used_at"]
    list_filter = ["is_active"]
    search_fields = ["name", "token_prefix"]
    readonly_fields = ["token_prefix", "token_hash", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

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
    list_filter = ["status", "tool", "provider"]
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
