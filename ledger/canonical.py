"""Canonical JSON and the params hash (RFC 8785 in spirit, stricter on numbers).

Money is integers in minor units. A float anywhere in hashed data is refused rather than
rounded: two agents that mean the same refund must produce the same bytes, and 12.10 vs 12.1
is exactly the kind of difference a float hides.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Mapping
from typing import Any


class CanonicalizationError(ValueError):
    pass


class _Refused(Exception):
    """A value canonical JSON does not take; the path to it is collected on the way out (only a
    refusal needs one, so the common case builds none)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.trail: list[str] = []  # innermost step first


def _nfc(text: str) -> str:
    return text if text.isascii() else unicodedata.normalize("NFC", text)


def _normalise(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return _nfc(value)
    if isinstance(value, Mapping):
        normalised: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Refused("object keys must be strings")
            nfc_key = _nfc(key)
            if nfc_key in normalised:
                raise _Refused(f"duplicate key {nfc_key!r} after NFC")
            try:
                normalised[nfc_key] = _normalise(item)
            except _Refused as exc:
                exc.trail.append(f".{nfc_key}")
                raise
        return normalised
    if isinstance(value, list | tuple):
        items = []
        for index, item in enumerate(value):
            try:
                items.append(_normalise(item))
            except _Refused as exc:
                exc.trail.append(f"[{index}]")
                raise
        return items
    # float, Decimal, NaN, Infinity and everything else.
    raise _Refused(
        f"{type(value).__name__} is not allowed; use integers (minor units) or strings")


def canonical_json(value: Any) -> str:
    try:
        normalised = _normalise(value)
    except _Refused as exc:
        path = "$" + "".join(reversed(exc.trail))
        raise CanonicalizationError(f"{path}: {exc.reason}") from None
    return json.dumps(
        normalised,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def params_hash(tool_name: str, intent: Mapping[str, Any]) -> str:
    payload = canonical_json({"tool": tool_name, "intent": dict(intent)})
    return "sha256:" + hashlib.sha256(payload.encode("utf-8")).hexdigest()


def provider_idempotency_key(*, operation_id: str, params_hash: str, namespace: str = "") -> str:
    # Derived from the stored row, never random: every retry, process and worker that sends this
    # operation sends the same key. A new version of the intent (…:v2) gets a new key, and the
    # same operation ID in two namespaces gets two keys (the key is stored with the row).
    material = f"agent-ledger:v1\n{operation_id}\n{params_hash}"
    if namespace:
        material += f"\nnamespace:{namespace}"
    digest = hashlib.sha256(material.encode()).hexdigest()
    return f"al_{digest[:40]}"
