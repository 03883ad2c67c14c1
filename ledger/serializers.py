from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Iterable
from functools import cache
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.core.validators import RegexValidator
from django.urls import get_script_prefix, reverse
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import ISO_8601, serializers
from rest_framework.settings import api_settings

from ledger.identity import (
    IDENTIFIER_PATTERN,
    MAX_IDENTIFIER_LENGTH,
    MAX_OPERATION_ID_LENGTH,
    OPERATION_ID_RE,
    identifier_problem,
)
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


class FullMatchValidator(RegexValidator):
    """RegexValidator uses search(), where `$` also matches before a final newline: the value
    must match as a whole. drf-spectacular publishes .regex.pattern as the schema's pattern."""

    def __call__(self, value: Any) -> None:
        regex = re.compile(self.regex) if isinstance(self.regex, str) else self.regex
        if not isinstance(value, str) or not regex.fullmatch(value):
            raise serializers.ValidationError(self.message, code="invalid")


class StrictCharField(serializers.CharField):
    """A string, never trimmed, and never a number coerced to one (DRF's CharField turns 0
    into "0"): what the OpenAPI document says is a string must be one."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer, never a string or a float coerced to one (DRF's IntegerField takes "5"
    and 5.0), nor a boolean: what the OpenAPI document says is an integer must be one."""

    def to_internal_value(self, data: Any) -> int:
        if not isinstance(data, int) or isinstance(data, bool):
            self.fail("invalid")
        return super().to_internal_value(data)


class ExactIdentifierField(StrictCharField):
    """An identifier taken exactly as sent: never trimmed (DRF trims by default), refused when
    it has surrounding whitespace or control, invisible or bidirectional characters. The
    pattern is published in the OpenAPI document, so a schema-valid value is always accepted."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", MAX_IDENTIFIER_LENGTH)
        # Empty is the same as not given.
        super().__init__(allow_blank=True, **kwargs)
        # For the OpenAPI document (drf-spectacular reads RegexValidator.regex as the pattern).
        self.validators.append(FullMatchValidator(IDENTIFIER_PATTERN, message="is not allowed"))

    def run_validators(self, value: Any) -> None:
        problem = identifier_problem(value) if isinstance(value, str) else None
        if problem:
            raise serializers.ValidationError(problem, code="invalid")
        super().run_validators(value)


class _NoUnknownFields(serializers.Serializer):
    """A misspelt field ("operationId", "customerRef") is refused, not silently dropped: the
    caller would believe it was recorded."""

    unknown_field_message = "is not a field of this request"

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: [self.unknown_field_message]
                                               for name in unknown})
        return attrs


class OperationSubmitSerializer(_NoUnknownFields):
    unknown_field_message = "is not a field of a submission"

    operation_id = StrictCharField(
        max_length=MAX_OPERATION_ID_LENGTH,
        validators=[FullMatchValidator(
            OPERATION_ID_RE.pattern,
            message=(
                "operation_id must be at least two colon-separated segments of ASCII letters, "
                "digits and ._~- (for example workflow-81:invoice-17:refund-2:v1)"
            ),
        )],
    )
    tool = StrictCharField(max_length=64)
    params = serializers.DictField()
    run_id = ExactIdentifierField(required=False, default="")
    tool_call_id = ExactIdentifierField(required=False, default="")
    customer_ref = ExactIdentifierField(required=False, default="")
    execution = serializers.ChoiceField(
        choices=["sync", "async", "client"], required=False, default="sync",
        help_text=(
            "async: record the intent, answer 202 at once and let a worker send it. "
            "client: record and claim it, answer 202 with the claim (fencing token, lease, "
            "idempotency key); the agent calls the provider itself and reports the outcome."
        ),
    )


_SUBMIT_TEXT_FIELDS = (
    ("operation_id", MAX_OPERATION_ID_LENGTH, True),
    ("tool", 64, True),
    ("run_id", 200, False),
    ("tool_call_id", 200, False),
    ("customer_ref", 200, False),
)


_SUBMIT_KEYS = frozenset(OperationSubmitSerializer._declared_fields)
# Plain names only; anything else (whitespace, NUL, a lone surrogate) goes through the
# serializer, which words the error.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_IDENTIFIER = re.compile(IDENTIFIER_PATTERN)


def submit_fields_fast(body: Any) -> dict[str, Any] | None:
    """OperationSubmitSerializer's validated_data for a plainly valid body, without building
    the serializer (DRF deep-copies its fields for every instance). None for anything it does
    not accept exactly as it stands — an unknown or missing field, a blank value, a number
    where text goes, surrounding whitespace, a control, invisible or bidirectional character —
    and the caller validates with the serializer, so every error reads exactly as DRF words it
    (tests/ledger/test_efficiency.py compares the two)."""
    if not isinstance(body, dict) or not isinstance(body.get("params"), dict):
        return None
    if not body.keys() <= _SUBMIT_KEYS:
        return None
    data: dict[str, Any] = {}
    for name, max_length, required in _SUBMIT_TEXT_FIELDS:
        if name not in body:
            if required:
                return None
            data[name] = ""
            continue
        value = body[name]
        if not isinstance(value, str) or not value or len(value) > max_length:
            return None
        if name == "operation_id":
            if not OPERATION_ID_RE.fullmatch(value):
                return None
        elif name == "tool":
            if not _TOOL_NAME.fullmatch(value):
                return None
        elif identifier_problem(value) or not _IDENTIFIER.fullmatch(value):
            return None
        data[name] = value
    execution = body.get("execution", "sync")
    if execution not in ("sync", "async") or not isinstance(execution, str):
        return None
    data["execution"] = execution
    data["params"] = {str(k): v for k, v in body["params"].items()}
    return data


class ClaimSerializer(serializers.Serializer):
    fencing_token = serializers.IntegerField()
    lease_expires_at = serializers.DateTimeField()
    idempotency_key = serializers.CharField()


# The largest token the ledger can hold (Operation.fencing_token, OperationEvent.fencing_token
# are PositiveBigIntegerField: a signed 64-bit column). A larger one names no claim and could
# not even be kept as evidence (the database refuses it), so it is refused as invalid.
MAX_FENCING_TOKEN = 2**63 - 1


def fencing_token_field() -> serializers.IntegerField:
    return StrictIntegerField(min_value=1, max_value=MAX_FENCING_TOKEN)


class HeartbeatSerializer(_NoUnknownFields):
    fencing_token = fencing_token_field()


class HeartbeatResponseSerializer(serializers.Serializer):
    operation_id = serializers.CharField()
    fencing_token = serializers.IntegerField()
    lease_expires_at = serializers.DateTimeField()


# A redacted classification, never a raw exception text (it may carry secrets or personal data).
ERROR_CLASS_PATTERN = r"^[A-Za-z0-9_.:-]{1,100}$"


class OutcomeSerializer(_NoUnknownFields):
    fencing_token = fencing_token_field()
    status = serializers.ChoiceField(choices=["succeeded", "failed", "unknown"])
    result = serializers.DictField(required=False, default=dict)
    # Strict: a number where the document says string is refused, not turned into text.
    provider_reference = StrictCharField(max_length=200, required=False, default="",
                                         allow_blank=True, trim_whitespace=True)
    error_class = StrictCharField(
        required=False, default="", allow_blank=True,
        validators=[FullMatchValidator(ERROR_CLASS_PATTERN, message="has an invalid format")])

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
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
    @extend_schema_field({
        "type": "object", "nullable": True, "description": "The amount in minor units.",
        "properties": {"amount": {"type": "integer"}, "currency": {"type": "string"}},
    })
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
            return absolute_url(request, path)
        return f"{str(self.context.get('base_url') or '').rstrip('/')}{path}"

    def get_status_url(self, obj: Operation) -> str:
        return self._absolute(url_with_arg("portal:status", obj.status_token))

    def get_url(self, obj: Operation) -> str:
        return self._absolute(url_with_arg("api:operation-detail", obj.operation_id))


def absolute_url(request: Any, path: str) -> str:
    """request.build_absolute_uri(path) for a path url_with_arg built (absolute, already
    quoted, no "//"), with the scheme and host worked out once per request instead of once per
    URL (tests/ledger/test_efficiency.py compares the two)."""
    if not path.startswith("/") or "//" in path or not path.isascii():
        return str(request.build_absolute_uri(path))
    base = getattr(request, "_ledger_absolute_base", None)
    if base is None:
        base = request.build_absolute_uri("/")[:-1]
        request._ledger_absolute_base = base
    return f"{base}{path}"


# What django.urls.reverse leaves unquoted in a path (its RFC 3986 sub-delimiters and "/~:@").
_PATH_SAFE = "!$&'()*+,;=/~:@"
_MARKER = "a0a0a0a0"


@cache
def _around_arg(name: str, script_prefix: str) -> tuple[str, str]:
    url = reverse(name, args=[_MARKER])
    before, found, after = url.partition(_MARKER)
    assert found, url
    return before, after


def url_with_arg(name: str, arg: str) -> str:
    """reverse(name, args=[arg]) for a URL pattern with one plain string argument, without
    reverse()'s cost on every resource rendered (tests/ledger/test_efficiency.py compares the
    two): the path around the argument is found once per script prefix, and the argument is
    quoted as reverse() quotes it."""
    if "/" in arg or not arg:  # no match for a str converter: let reverse() say so
        return reverse(name, args=[arg])
    before, after = _around_arg(name, get_script_prefix())
    return f"{before}{quote(arg, safe=_PATH_SAFE)}{after}"


def iso_datetime(value: dt.datetime, zone: dt.tzinfo | None = None) -> str:
    """DRF's DateTimeField.to_representation in its default ISO 8601 format: an aware value in
    the current time zone (`zone`, when the caller looked it up already), "+00:00" written "Z"
    (a naive one takes DRF's own path)."""
    if value.tzinfo is None:
        rendered: str = serializers.DateTimeField().to_representation(value)
        return rendered
    text = value.astimezone(zone or timezone.get_current_timezone()).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


_plan_lock = threading.Lock()
_PLAIN_FIELDS: dict[type[Any], str] = {serializers.CharField: "str",
                                       serializers.IntegerField: "int"}
_plan: list[tuple[str, Any, str]] | None = None


def _render_plan() -> list[tuple[str, Any, str]]:
    """OperationSerializer's fields, built and bound once per process (DRF builds them again
    for every serializer instance, which costs more than rendering). Method fields are called
    on a per-call instance that carries the request; every other field renders through its one
    shared bound field, which holds no per-call state."""
    global _plan
    if _plan is None:
        with _plan_lock:
            if _plan is None:
                template = OperationSerializer()
                plan: list[tuple[str, Any, str]] = []
                for name, field in template.fields.items():
                    if isinstance(field, serializers.SerializerMethodField):
                        plan.append((name, field.method_name, "method"))
                    elif (type(field) is serializers.DateTimeField
                          and len(field.source_attrs) == 1
                          and getattr(field, "format", api_settings.DATETIME_FORMAT) == ISO_8601
                          and not hasattr(field, "timezone") and settings.USE_TZ):
                        plan.append((name, field.source_attrs[0], "datetime"))
                    elif type(field) in _PLAIN_FIELDS and len(field.source_attrs) == 1:
                        # DRF's CharField renders str(value), IntegerField int(value): the
                        # same without its attribute lookup machinery.
                        plan.append((name, field.source_attrs[0], _PLAIN_FIELDS[type(field)]))
                    else:
                        plan.append((name, field, "field"))
                _plan = plan
    return _plan


def operation_resource(operation: Operation, *, request: Any = None,
                       context: dict[str, Any] | None = None) -> dict[str, Any]:
    """The operation resource, exactly as OperationSerializer(operation, context=…).data
    renders it (tests/ledger/test_efficiency.py compares them), without building a serializer.
    A SerializerMethodField added to OperationSerializer is rendered here too, with this
    context (plus the request)."""
    renderer = object.__new__(OperationSerializer)
    renderer.parent = None  # type: ignore[assignment]
    renderer._context = {**(context or {}), **({"request": request} if request else {})}
    out: dict[str, Any] = {}
    zone = timezone.get_current_timezone()
    for name, target, kind in _render_plan():
        if kind == "method":
            out[name] = getattr(renderer, target)(operation)
        elif kind == "field":
            attribute = target.get_attribute(operation)
            out[name] = None if attribute is None else target.to_representation(attribute)
        elif kind == "datetime":
            attribute = getattr(operation, target)
            out[name] = None if attribute is None else iso_datetime(attribute, zone)
        else:  # "str" or "int": a model attribute DRF's CharField/IntegerField would convert
            attribute = getattr(operation, target)
            out[name] = None if attribute is None else (str if kind == "str" else int)(
                attribute)
    return out


def operation_resources(operations: Iterable[Operation], *, request: Any = None,
                        ) -> list[dict[str, Any]]:
    return [operation_resource(op, request=request) for op in operations]


RUN_CURSOR_PATTERN = r"^v1\.[0-9]{1,18}$"


class RunOperationsSerializer(serializers.Serializer):
    run_id = serializers.CharField()
    count = serializers.IntegerField(help_text="Operations in this page.")
    operations = OperationSerializer(many=True)
    first_unresolved = OperationSerializer(allow_null=True)
    next = serializers.URLField(allow_null=True, help_text="The next page, or null at the end.")


class RunPageQuerySerializer(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=200, required=False, default=50)
    after = serializers.CharField(
        required=False, max_length=40, trim_whitespace=False,
        validators=[FullMatchValidator(RUN_CURSOR_PATTERN, message="is not a cursor")],
        help_text="The cursor from the previous page's `next`; opaque: use it as given.")


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
