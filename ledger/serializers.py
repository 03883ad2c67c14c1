from __future__ import annotations

from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ledger.identity import MAX_OPERATION_ID_LENGTH
from ledger.models import Operation
from ledger.pacing import BASE_GUIDANCE, pace

S = Operation.Status

CUSTOMER_STATUS = {
    S.PREPARED: "processing",
    S.IN_FLIGHT: "processing",
    S.UNKNOWN: "not_yet_confirmed",
    S.SUCCEEDED: "completed",
    S.FAILED: "not_completed",
}

# Kept for callers that want the plain sentence per status; the resource's guidance follows
# the situation (ledger.pacing).
GUIDANCE = BASE_GUIDANCE


class OperationSubmitSerializer(serializers.Serializer):
    operation_id = serializers.CharField(max_length=MAX_OPERATION_ID_LENGTH)
    tool = serializers.CharField(max_length=64)
    params = serializers.DictField()
    run_id = serializers.CharField(max_length=200, required=False, default="")
    tool_call_id = serializers.CharField(max_length=200, required=False, default="")
    customer_ref = serializers.CharField(max_length=200, required=False, default="")
    execution = serializers.ChoiceField(
        choices=["sync", "async", "client"], required=False, default="sync",
        help_text=(
            "async: record the intent, answer 202 at once and let a worker send it. "
            "client: record and claim it, answer 202 with the claim (fencing token, lease, "
            "idempotency key); the agent calls the provider itself and reports the outcome."
        ),
    )


class ClaimSerializer(serializers.Serializer):
    fencing_token = serializers.IntegerField()
    lease_expires_at = serializers.DateTimeField()
    idempotency_key = serializers.CharField()


class HeartbeatSerializer(serializers.Serializer):
    fencing_token = serializers.IntegerField(min_value=1)


class HeartbeatResponseSerializer(serializers.Serializer):
    operation_id = serializers.CharField()
    fencing_token = serializers.IntegerField()
    lease_expires_at = serializers.DateTimeField()


# A redacted classification, never a raw exception text (it may carry secrets or personal data).
ERROR_CLASS_PATTERN = r"^[A-Za-z0-9_.:-]{1,100}$"


class OutcomeSerializer(serializers.Serializer):
    fencing_token = serializers.IntegerField(min_value=1)
    status = serializers.ChoiceField(choices=["succeeded", "failed", "unknown"])
    result = serializers.DictField(required=False, default=dict)
    provider_reference = serializers.CharField(max_length=200, required=False, default="",
                                               allow_blank=True)
    error_class = serializers.RegexField(ERROR_CLASS_PATTERN, required=False, default="",
                                         allow_blank=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["status"] == "failed" and not attrs["error_class"]:
            raise serializers.ValidationError({"error_class": [
                "is required with status failed: say which definitive provider rejection "
                "proved that nothing happened (otherwise report unknown)"]})
        return attrs


class OperationSerializer(serializers.ModelSerializer):
    customer_status = serializers.SerializerMethodField()
    guidance = serializers.SerializerMethodField()
    value = serializers.SerializerMethodField()
    reconciliation = serializers.SerializerMethodField()
    status_url = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()
    claim = serializers.SerializerMethodField()

    class Meta:
        model = Operation
        fields = [
            "operation_id", "url", "tool", "tool_version", "execution", "status",
            "customer_status", "claim",
            "guidance", "params_hash", "attempts", "result", "error_class",
            "provider_request_id", "run_id", "subject", "value", "reconciliation",
            "status_url", "created_at", "updated_at", "sent_at", "resolved_at",
        ]
        read_only_fields = fields

    def get_customer_status(self, obj: Operation) -> str:
        return CUSTOMER_STATUS[S(obj.status)]

    def get_guidance(self, obj: Operation) -> str:
        return pace(obj).guidance

    @extend_schema_field(ClaimSerializer(allow_null=True))
    def get_claim(self, obj: Operation) -> dict[str, Any] | None:
        """Only in the answer to the caller that won the claim (a client-executed submission)."""
        claim = self.context.get("claim")
        if claim is None or claim.operation.pk != obj.pk:
            return None
        return {
            "fencing_token": claim.fencing_token,
            "lease_expires_at": serializers.DateTimeField().to_representation(
                claim.operation.lease_expires_at),
            "idempotency_key": obj.idempotency_key,
        }

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
        if request is not None:
            return request.build_absolute_uri(path)
        return f"{str(self.context.get('base_url') or '').rstrip('/')}{path}"

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
