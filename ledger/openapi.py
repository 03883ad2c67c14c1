"""The OpenAPI document says what the API does (drf-spectacular postprocessing hook).

Added to what drf-spectacular derives from the views and serializers:
- every error answer, as application/problem+json with the Problem schema;
- the headers: Location and Retry-After on 202, Idempotent-Replayed on a replay, Retry-After
  on 429 and 503, WWW-Authenticate on 401, X-Request-ID everywhere;
- the submission body per tool (`oneOf`, one branch per tool with its params schema), with the
  constraints the API enforces: patterns, lengths, no NUL, no invisible or bidirectional
  characters in intent fields. A request valid against this document is never refused as
  invalid (a refusal would be a documentation bug).
"""

from __future__ import annotations

import copy
import functools
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from ledger.executor import HIDDEN_CATEGORIES
from ledger.serializers import ERROR_CLASS_PATTERN

PROBLEM = "application/problem+json"
PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
PROBLEM_CODES = [
    "invalid", "unauthenticated", "authentication_failed", "not_authenticated", "permission_denied",
    "tool_not_allowed", "params_conflict", "not_found", "throttled", "stale_fencing_token",
    "overloaded", "payload_too_large", "parse_error", "unsupported_media_type",
    "method_not_allowed", "not_acceptable", "outcome_not_recorded", "unavailable",
    "internal_error", "error",
]

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "An RFC 9457 problem. `errors` maps fields to messages (400); "
                   "`differences` maps intent fields to stored/submitted values (422).",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "errors": {"type": "object"},
        "differences": {"type": "object"},
        "operation_id": {"type": "string"},
    },
}


def _header(description: str, *, required: bool = True, **schema: Any) -> dict[str, Any]:
    return {"description": description, "required": required,
            "schema": {"type": "string", **schema}}


REQUEST_ID = _header("The request's ID (from X-Request-ID, or made); it is in every log line.",
                     required=False)
RETRY_AFTER = _header("Seconds to wait before asking again.", pattern="^[0-9]+$")
LOCATION = _header("The operation resource to poll.")
REPLAYED = _header("A replay of a terminal operation: nothing was sent.", enum=["true"])
WWW_AUTHENTICATE = _header("The scheme to use: Bearer.", required=False)

ERRORS: dict[str, tuple[str, dict[str, Any]]] = {
    "400": ("Invalid body, query, operation ID or params; nothing was written.", {}),
    "401": ("No or bad credential.", {"WWW-Authenticate": WWW_AUTHENTICATE}),
    "403": ("Tool not allowed for this agent.", {}),
    "404": ("No such resource in this agent's namespace.", {}),
    "405": ("Method not allowed.", {}),
    "406": ("Not acceptable.", {}),
    "413": ("Request body too large.", {}),
    "414": ("Request line too long (refused by the web server, before the API).", {}),
    "415": ("Unsupported media type: send application/json.", {}),
    "422": ("Same operation ID, different intent: `differences` lists the fields.", {}),
    "429": ("Throttled (per agent, or failed authentications per address).",
            {"Retry-After": RETRY_AFTER}),
    "500": ("Internal error; do not retry under a new operation ID.",
            {"Retry-After": _header("Seconds to wait.", required=False)}),
    "503": ("Overloaded, or the outcome could not be recorded yet: retry with the same "
            "operation ID after Retry-After.",
            {"Retry-After": RETRY_AFTER, "Location": _header("The operation.", required=False)}),
}
# Which errors each operation can give (besides the ones every operation can).
# (404 everywhere: a path with a control character names nothing, whatever the route.)
EVERYWHERE = ("400", "401", "404", "405", "406", "414", "429", "500", "503")
# Answered by gunicorn (limit_request_line), not by the API: an HTML page, not a problem.
NOT_PROBLEM_JSON = {"414": {"text/html": {"schema": {"type": "string"}}}}
PER_OPERATION = {
    "v1_operations_create": ("403", "413", "415", "422"),
}


@functools.cache
def hidden_characters_class() -> str:
    """A regex character class body listing every character an intent field refuses (the
    Unicode categories in executor.HIDDEN_CATEGORIES), computed from the same unicodedata."""
    ranges: list[tuple[int, int]] = []
    # The Basic Multilingual Plane only: a JSON Schema pattern is an ECMA-262 regex, where a
    # character beyond it is two UTF-16 code units and cannot be the end of a class range.
    # The few invisible characters beyond it (U+110BD, U+13430…, tags U+E0001, U+E0020…) are
    # refused all the same; the Problem's `errors` says so.
    for code in range(0x10000):
        # Surrogates are refused by the JSON parser already (and unusable in a pattern).
        if unicodedata.category(chr(code)) in HIDDEN_CATEGORIES - {"Cs"}:
            if ranges and ranges[-1][1] == code - 1:
                ranges[-1] = (ranges[-1][0], code)
            else:
                ranges.append((code, code))

    def char(code: int) -> str:
        return f"\\u{code:04x}"

    return "".join(char(a) if a == b else f"{char(a)}-{char(b)}" for a, b in ranges)


def _field_schema(spec: Any, *, intent: bool) -> dict[str, Any]:
    if spec.kind is int:
        schema: dict[str, Any] = {"type": "integer"}
        if spec.minimum is not None:
            schema["minimum"] = spec.minimum
        if spec.maximum is not None:
            schema["maximum"] = spec.maximum
        return schema
    schema = {"type": "string", "maxLength": spec.max_length}
    if spec.choices:
        schema["enum"] = list(spec.choices)
    # No string the API takes may hold a NUL; intent fields no hidden characters either.
    allowed = f"^[^{hidden_characters_class()}]*$" if intent else "^[^\\u0000]*$"
    if spec.pattern:
        schema["pattern"] = f"^(?:{spec.pattern})$"
        if not re.fullmatch(r"[A-Za-z0-9_\[\]{},:.~\\-]*", spec.pattern):
            schema["allOf"] = [{"pattern": allowed}]
    else:
        schema["pattern"] = allowed
    return schema


def _thaw(value: Any) -> Any:
    """Plain dicts and lists from the catalogue's read-only mappings and tuples."""
    if isinstance(value, Mapping):
        return {key: _thaw(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_thaw(item) for item in value]
    return value


def _with_text_constraints(schema: dict[str, Any], intent: set[str]) -> dict[str, Any]:
    """Add what the API enforces beyond the catalogue's schema: no NUL in any string, no
    hidden characters in an intent field."""
    for name, prop in schema.get("properties", {}).items():
        if not isinstance(prop, dict) or prop.get("type") != "string" or "enum" in prop:
            continue
        allowed = (f"^[^{hidden_characters_class()}]*$" if name in intent
                   else "^[^\\u0000]*$")
        if "pattern" in prop:
            prop["allOf"] = [*prop.get("allOf", []), {"pattern": allowed}]
        else:
            prop["pattern"] = allowed
    return schema


def params_schema(tool: Any) -> dict[str, Any]:
    """The tool's params as JSON Schema: the catalogue's own when it has one."""
    declared = getattr(tool, "params_schema", None)
    if isinstance(declared, Mapping):
        schema = _with_text_constraints(_thaw(declared), set(tool.intent_fields))
        required = set(schema.get("required", ()))
        for name, prop in schema.get("properties", {}).items():
            if name not in required and isinstance(prop, dict):
                prop["nullable"] = True  # null is taken as "not given" (Tool.validate)
        return schema
    intent = set(tool.intent_fields)
    properties = {}
    for name, spec in tool.schema.items():
        properties[name] = _field_schema(spec, intent=name in intent)
        if not spec.required:
            properties[name]["nullable"] = True  # null is taken as "not given"
    return {
        "type": "object",
        "properties": properties,
        "required": [name for name, spec in tool.schema.items() if spec.required],
        "additionalProperties": False,
    }


def _submission_variants(result: dict[str, Any]) -> list[dict[str, Any]]:
    from ledger.tools import latest_tools

    schemas = result["components"]["schemas"]
    base = schemas["OperationSubmit"]
    for name, prop in base["properties"].items():
        # drf-spectacular spells allow_blank as oneOf [field, {maxLength: 0}]; the identifier
        # pattern admits "" already, and "" matching both branches would fail the oneOf.
        branches = prop.get("oneOf")
        if branches and len(branches) == 2 and branches[1].get("maxLength") == 0:
            base["properties"][name] = branches[0]
    variants = []
    for tool in latest_tools():
        variant = copy.deepcopy(base)
        variant["properties"]["tool"] = {"type": "string", "enum": [tool.name]}
        variant["properties"]["params"] = params_schema(tool)
        variant["additionalProperties"] = False  # the API refuses unknown fields
        variant["description"] = f"Submit an intent for the `{tool.name}` tool: {tool.description}"
        component = f"OperationSubmit_{tool.name}"
        schemas[component] = variant
        variants.append({"$ref": f"#/components/schemas/{component}"})
    return variants


def _outcome_variants(schemas: dict[str, Any]) -> None:
    """The outcome body, one variant per status: `failed` must name the definitive provider
    rejection (error_class required, not blank), which one flat object cannot say."""
    base = schemas["Outcome"]
    properties = base["properties"]
    result = properties["result"]
    # The outcome's free-form result is whatever JSON the provider answered; that it holds no
    # NUL only prose can say (OpenAPI 3.0 has no propertyNames; schemathesis.toml: no NUL).
    result["description"] = ("The provider's answer, any JSON object. No NUL character "
                             "(U+0000) in a name or a text.")
    result["additionalProperties"] = {}
    # The parser refuses a NUL anywhere in the body.
    properties["provider_reference"]["pattern"] = "^[^\\u0000]*$"
    variants = []
    for status in schemas[properties["status"]["$ref"].rsplit("/", 1)[1]]["enum"]:
        variant = copy.deepcopy(base)
        variant["properties"]["status"] = {"type": "string", "enum": [status]}
        if status == "failed":
            variant["properties"]["error_class"] = {
                "type": "string", "pattern": ERROR_CLASS_PATTERN,
                "description": "Which definitive provider rejection proved that nothing "
                               "happened (otherwise report unknown)."}
            variant["required"] = [*variant["required"], "error_class"]
        variant["description"] = f"Report the outcome `{status}`."
        schemas[f"Outcome_{status}"] = variant
        variants.append({"$ref": f"#/components/schemas/Outcome_{status}"})
    schemas["Outcome"] = {"oneOf": variants, "description": base.get("description", "")}


def postprocess(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict:
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["Problem"] = PROBLEM_SCHEMA
    # The claim's own endpoints refuse unknown fields too (a misspelt field would otherwise be
    # silently ignored); the outcome's free-form result holds text the parser accepts.
    for name in ("Heartbeat", "Outcome"):
        if name in schemas:
            schemas[name]["additionalProperties"] = False
    if "Outcome" in schemas:
        _outcome_variants(schemas)
    for path_item in result.get("paths", {}).values():
        for operation in path_item.values():
            _document_operation(result, operation)
    return result


def _document_operation(result: dict[str, Any], operation: dict[str, Any]) -> None:
    operation_id = operation.get("operationId", "")
    responses = operation.setdefault("responses", {})
    for status in (*EVERYWHERE, *PER_OPERATION.get(operation_id, ())):
        description, headers = ERRORS[status]
        existing = responses.get(status, {})
        responses[status] = {
            "description": existing.get("description") or description,
            "headers": {**headers, "X-Request-ID": REQUEST_ID},
            "content": NOT_PROBLEM_JSON.get(status, {PROBLEM: {"schema": PROBLEM_REF}}),
        }
    for status, response in responses.items():
        if status.startswith("2"):
            response.setdefault("headers", {})["X-Request-ID"] = REQUEST_ID
    if operation_id == "v1_operations_create":
        responses["200"]["headers"]["Idempotent-Replayed"] = REPLAYED
        responses["202"]["headers"].update({"Location": LOCATION, "Retry-After": RETRY_AFTER})
        responses["201"]["description"] = "Created; it reached a terminal state."
        operation["requestBody"]["content"] = {
            "application/json": {"schema": {"oneOf": _submission_variants(result)}}}
    if operation_id == "v1_operations_retrieve":
        responses["200"]["headers"]["Retry-After"] = _header(
            "While the operation is not terminal: seconds until it is worth asking again.",
            required=False, pattern="^[0-9]+$")
