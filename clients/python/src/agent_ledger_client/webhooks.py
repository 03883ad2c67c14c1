"""Verify the ledger's webhooks (Standard Webhooks: `webhook-id`, `webhook-timestamp`,
`webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, secret `whsec_…`).

    event = verify_webhook(request.body, request.headers, secret=os.environ["WEBHOOK_SECRET"])
    event["type"], event["data"]["operation_id"]

Deliveries are at least once: deduplicate on `webhook-id`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

from agent_ledger_client.errors import WebhookVerificationError

DEFAULT_TOLERANCE_SECONDS = 5 * 60


def _secret_bytes(secret: str | bytes) -> bytes:
    if isinstance(secret, bytes):
        return secret
    raw = secret.removeprefix("whsec_")
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise WebhookVerificationError("the webhook secret is not whsec_<base64>") from None


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    raise WebhookVerificationError(f"missing {name} header")


def sign_webhook(body: bytes | str, *, secret: str | bytes, msg_id: str, timestamp: int) -> str:
    """The `webhook-signature` value the ledger sends for this body (useful in tests)."""
    payload = body.encode() if isinstance(body, str) else body
    signed = f"{msg_id}.{timestamp}.".encode() + payload
    digest = hmac.new(_secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify_webhook(body: bytes | str, headers: Mapping[str, str], *, secret: str | bytes,
                   tolerance: int = DEFAULT_TOLERANCE_SECONDS,
                   now: float | None = None) -> dict[str, Any]:
    """Return the parsed event, or raise WebhookVerificationError.

    Checks the timestamp is within `tolerance` seconds (replay protection) and that one of the
    `v1` signatures matches, in constant time. Pass the raw body bytes as received.
    """
    msg_id = _header(headers, "webhook-id")
    timestamp_text = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    try:
        timestamp = int(timestamp_text)
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not an integer") from None
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise WebhookVerificationError("webhook-timestamp is outside the tolerance")
    expected = sign_webhook(body, secret=secret, msg_id=msg_id, timestamp=timestamp)
    matched = False
    for candidate in signatures.split():
        version, _, _signature = candidate.partition(",")
        if version == "v1" and hmac.compare_digest(candidate.encode(), expected.encode()):
            matched = True
    if not matched:
        raise WebhookVerificationError("no matching webhook signature")
    payload = body.decode() if isinstance(body, bytes) else body
    try:
        event = json.loads(payload)
    except ValueError:
        raise WebhookVerificationError("the webhook body is not JSON") from None
    if not isinstance(event, dict):
        raise WebhookVerificationError("the webhook body is not a JSON object")
    return event
