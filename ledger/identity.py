"""Operation IDs: the business identity of one intent, chosen at the workflow boundary."""

from __future__ import annotations

import re

MAX_OPERATION_ID_LENGTH = 200
_SEGMENT = r"[A-Za-z0-9._~-]+"
OPERATION_ID_RE = re.compile(rf"^{_SEGMENT}(?::{_SEGMENT})+$")


class InvalidOperationId(ValueError):
    pass


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
