"""Operation IDs from business keys: `workflow-81:invoice-17:refund-2:v1`.

The same intent must always build the same ID, in every retry, process and regenerated tool
call. So the parts come from the business (the workflow, the object, the action and its sequence
number), never from the model's tool-call ID or a UUID made per attempt.
"""

from __future__ import annotations

import re

from agent_ledger_client.errors import UnsafeOperationId

MAX_OPERATION_ID_LENGTH = 200
_SEGMENT = re.compile(r"[A-Za-z0-9._~-]+")

# Tool-call IDs as the major model APIs spell them (OpenAI `call_…`/`fc_…`, Anthropic
# `toolu_…`, Bedrock `tooluse_…`, chat completion IDs): a prefix, then a random mix of letters
# and digits.
_TOOL_CALL = re.compile(
    r"^(call|fc|toolu|tool|tooluse|chatcmpl)[_-]"
    r"(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{8,}$", re.IGNORECASE)
_UUID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}",
                   re.IGNORECASE)
_LONG_HEX = re.compile(r"[0-9a-f]{16,}", re.IGNORECASE)
_ULID = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")


def looks_random(part: str) -> str | None:
    """Why `part` looks like a per-call identifier, or None when it looks like a business key."""
    if _TOOL_CALL.match(part):
        return "looks like a model's tool-call ID, which changes when the call is regenerated"
    if _UUID.search(part):
        return "contains a UUID; a random ID made per attempt gives every retry a new identity"
    if _LONG_HEX.search(part):
        return "contains a long random-looking hex string (a hash or a generated ID)"
    if _ULID.match(part):
        return "looks like a ULID generated per attempt"
    return None


def _part(name: str, value: object) -> str:
    text = str(value)
    if not text or not _SEGMENT.fullmatch(text):
        raise UnsafeOperationId(
            f"{name}={text!r}: use ASCII letters, digits and ._~- only (no colons or spaces)")
    reason = looks_random(text)
    if reason:
        raise UnsafeOperationId(f"{name}={text!r} {reason}; build IDs from business keys")
    return text


def operation_id(*, workflow: str, subject: str, action: str, sequence: int,
                 version: int = 1) -> str:
    """Build `workflow:subject:action-sequence:vN` from business keys.

    >>> operation_id(workflow="workflow-81", subject="invoice-17", action="refund", sequence=2)
    'workflow-81:invoice-17:refund-2:v1'

    `sequence` numbers repeated actions on the same object (the second refund of an invoice is
    sequence=2) and has no default: two genuine refunds must never share an ID by accident;
    `version` starts a new intent after a failed one (`…:v2`). Refuses tool-call IDs, UUIDs and
    other per-attempt random values.
    """
    for name, number in (("sequence", sequence), ("version", version)):
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise UnsafeOperationId(f"{name} must be an integer starting at 1")
    built = ":".join([_part("workflow", workflow), _part("subject", subject),
                      f"{_part('action', action)}-{sequence}", f"v{version}"])
    if len(built) > MAX_OPERATION_ID_LENGTH:
        raise UnsafeOperationId(f"operation ID longer than {MAX_OPERATION_ID_LENGTH} characters")
    return built


def check_operation_id(value: str) -> str:
    """Refuse an operation ID any of whose segments looks like a tool-call ID or a UUID
    (used where a model supplies the ID, as in the MCP server)."""
    if not isinstance(value, str) or not value:
        raise UnsafeOperationId("operation_id must be a non-empty string")
    for segment in value.split(":"):
        reason = looks_random(segment)
        if reason:
            raise UnsafeOperationId(f"operation_id segment {segment!r} {reason}")
    return value
