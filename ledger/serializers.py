from __future__ import annotations

from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.urls import reverse
from rest_framework import serializers

from ledger.identity import MAX_OPERATION_ID_LENGTH
from ledger.models import Operation

S = Operation.Status

CUSTOMER_STATUS = {
    S.PREPARED: "processing",
    S.IN_FLIGHT: "processing",
    S.UNKNOWN: "not_yet_confirmed",
    S.SUCCEEDED: "completed",
    S.FAILED: "not_completed",
}

GUIDANCE = {
    S.PREPARED: (
        "Not sent yet: it is safe to submit the same request again with the same operation ID, "
        "or poll this resource; never use a new operation ID for this intent."
    ),
    S.IN_FLIGHT: (
        "In progress: do not retry with a new operation ID; poll this resource until the status "
        "is succeeded or failed."
    ),
    S.UNKNOWN: (
        "Outcome unknown: do not retry with a new operation ID; poll this resource while the "
        "ledger confirms with the provider."
    ),
    S.SUCCEEDED: (
        "Completed: the action happened; use this result and do not submit it again."
    ),
    S.FAILED: (
        "Not completed: nothing happened; to try again submit a new intent under the next "
        "version of the operation ID (for example …:v2)."
    ),
}


class OperationSubmitSerializer(serializers.Serializer):
    operation_id = serializers.CharField(max_length=MAX_OPERATION_ID_LENGTH)
    tool = serializers.CharField(max_length=64)
    params = serializers.DictField()
    run_id = serializers.CharField(max_length=200, required=False, default="")
    tool_call_id = serializers.CharField(max_length=200, required=False, default="")
    customer_ref = serializers.CharField(max_length=200, required=False, default="")
    execution = serializers.ChoiceField(
        choices=["sync", "async"], required=False, default="sync",
        help_text="async: record the intent, answer 202 at once and let a worker send it.",
    )


class OperationSerializer(serializers.ModelSerializer):
    customer_status = serializers.SerializerMethodField()
    guidance = serializers.SerializerMethodField()
    value = serializers.SerializerMethodField()
    reconciliation = serializers.SerializerMethodField()
    status_url = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()

    class Meta:
        model = Operation
        fields = [
            "operation_id", "url", "tool", "tool_version", "status", "customer_status",
            "guidance", "params_hash", "attempts", "result", "error_class",
            "provider_request_id", "run_id", "subject", "value", "reconciliation",
            "status_url", "created_at", "updated_at", "sent_at", "resolved_at",
        ]
        read_only_fields = fields

    def get_customer_status(self, obj: Operation) -> str:
        return CUSTOMER_STATUS[S(obj.status)]

    def get_guidance(self, obj: Operation) -> str:
        return GUIDANCE[S(obj.status)]

    # SerializerMethodField's get_<field> name for `value` shadows Field.get_value(dictionary),
    # which DRF calls only to read a nested serializer's input. This serializer only renders
    # output (RunOperationsSerializer nests it for the schema, never to validate input).
    def get_value(self, obj: Operation) -> dict[str, Any] | None:  # type: ignore[override]
        if obj.value_amount is None:
            return None
        return {"amount": obj.value_amount, "currency": obj.value_currency}

    def get_reconciliation(self, obj: Operation) -> dict[str, Any] | None:
        try:
            case = obj.reconciliation_case
        except ObjectDoesNotExist:
            return None
        return case.summary()

    def _absolute(self, path: str) -> str:
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request else path

    def get_status_url(self, obj: Operation) -> str:
        return self._absolute(reverse("portal:status", args=[obj.status_token]))

    def get_url(self, obj: Operation) -> str:
        return self._absolute(reverse("api:operation-detail", args=[obj.operation_id]))


class RunOperationsSerializer(serializers.Serializer):
    run_id = serializers.CharField()
    count = serializers.IntegerField()
    operations = OperationSerializer(many=True)
    first_unresolved = OperationSerializer(allow_null=True)


class ToolValueSerializer(serializers.Serializer):
    amount_field = serializers.CharField(help_text="The param holding the amount, in minor units.")
    currency_field = serializers.CharField(help_text="The param holding the ISO 4217 currency.")


class ToolSerializer(serializers.Serializer):
    """A catalogue tool as agents and SDKs discover it (never its connector's settings)."""

    name = serializers.CharField()
    version = serializers.IntegerField(help_text="The version new operations are recorded with.")
    description = serializers.CharField()
    params_schema = serializers.JSONField(help_text="The params, as JSON Schema (draft 2020-12).")
    intent_fields = serializers.ListField(
        child=serializers.CharField(),
        help_text="The params that define the intent (the params hash covers these only).")
    free_text_fields = serializers.ListField(
        child=serializers.CharField(), help_text="Params the model may reword between retries.")
    secret_fields = serializers.ListField(
        child=serializers.CharField(), help_text="Params redacted in storage, logs and pages.")
    value = ToolValueSerializer(allow_null=True)
    high_value_thresholds = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Per currency, in minor units: at or above it (or in a currency not listed) "
                  "an unknown outcome always goes to a person.")
    four_eyes_thresholds = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Per currency: at or above it (or in a currency not listed) a staff decision "
                  "needs two people.")
    client_execution = serializers.BooleanField(
        help_text="Whether the agent may execute the call itself (execution: client).")


class ToolListSerializer(serializers.Serializer):
    tools = ToolSerializer(many=True)
