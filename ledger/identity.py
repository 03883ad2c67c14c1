"""Operation IDs: the business identity of one intent, chosen at the workflow boundary."""

from __future__ import annotations

import re

MAX_OPERATION_ID_LENGTH = 200
_SEGMENT = r"[A-Za-z0-9._~-]+"
OPERATION_ID_RE = re.compile(rf"^{_SEGMENT}(?::{_SEGMENT})+$")


# Free-form identifiers an agent passes along (run_id, tool_call_id, customer_ref) are kept
# exactly as sent: no trimming, so a value with surrounding whitespace, a control character or
# an invisible/bidirectional formatting character is refused rather than silently changed.
# One pattern, used by the validator and published in the OpenAPI document.
# (Lone surrogates never get this far: the JSON parser refuses them in any string.)
_NON_PRINTING = (
    "\\x00-\\x1f\\x7f-\\x9f"  # C0 and C1 controls
    "\\u00ad\\u061c\\u180e\\u200b-\\u200f\\u2028-\\u202e\\u2060-\\u206f\\ufeff\\ufff9-\\ufffb"
)
_EDGE = rf"[^\s{_NON_PRINTING}]"
# Empty means "not given"; otherwise no whitespace at either end and nothing non-printing.
IDENTIFIER_PATTERN = rf"^(?:{_EDGE}(?:[^{_NON_PRINTING}]*{_EDGE})?)?$"
IDENTIFIER_RE = re.compile(IDENTIFIER_PATTERN)
MAX_IDENTIFIER_LENGTH = 200


class InvalidOperationId(ValueError):
    pass


def identifier_problem(value: str) -> str | None:
    """Why an agent-chosen identifier is refused, or None when it is taken as sent."""
    if any("\ud800" <= char <= "\udfff" for char in value):
        return "must not contain lone surrogates"
    if IDENTIFIER_RE.fullmatch(value):
        return None
    if value != value.strip():
        return "must not start or end with whitespace"
    return "must not contain control, invisible or bidirectional formatting characters"


def validate_operation_id(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidOperationId("operation_id must be a non-empty string")
    if len(value) > MAX_OPERATION_ID_LENGTH:
        raise InvalidOperationId(
            f"operation_id is longer than {MAX_OPERATION_ID_LENGTH} characters"
        )
    if not OPERATION_ID_RE.fullmatch(value):
        raise InvalidOperationId(
            "operation_id must be at least two colon-separated segments of ASCII letters, "
            "digits and ._~- (for example workflow-81:invoice-17:refund-2:v1)"
        )
    return value


def build_operation_id(
    *, workflow: str, subject: str, action: str, sequence: int, version: int = 1
) -> str:
    """`workflow-81:invoice-17:refund-2:v1` — the same intent always builds the same ID."""
    if sequence < 1 or version < 1:
        raise InvalidOperationId("sequence and version start at 1")
    return validate_operation_id(f"{workflow}:{subject}:{action}-{sequence}:v{version}")
