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


def _normalise(value: Any, path: str) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, Mapping):
        normalised: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalizationError(f"{path}: object keys must be strings")
            nfc_key = unicodedata.normalize("NFC", key)
            if nfc_key in normalised:
                raise CanonicalizationError(f"{path}: duplicate key {nfc_key!r} after NFC")
            normalised[nfc_key] = _normalise(item, f"{path}.{nfc_key}")
        return normalised
    if isinstance(value, list | tuple):
        return [_normalise(item, f"{path}[{index}]") for index, item in enumerate(value)]
    # float, Decimal, NaN, Infinity and everything else.
    raise CanonicalizationError(
        f"{path}: {type(value).__name__} is not allowed; use integers (minor units) or strings"
    )


class _Unusual(Exception):
    """Something _plain() does not take as it stands; _normalise() decides (and words why)."""


def _plain(value: Any) -> Any:
    """_normalise() for the common case — exact dicts, lists, str, int, bool, None, keys that
    NFC cannot merge — without building a path for every member (only an error needs one)."""
    kind = type(value)
    if kind is str:
        return value if value.isascii() else unicodedata.normalize("NFC", value)
    if value is None or kind is bool or kind is int:
        return value
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str or not key.isascii():
                raise _Unusual  # a non-ASCII key could collide with another after NFC
            out[key] = _plain(item)
        return out
    if kind is list or kind is tuple:
        return [_plain(item) for item in value]
    raise _Unusual


def canonical_json(value: Any) -> str:
    try:
        normalised = _plain(value)
    except _Unusual:
        normalised = _normalise(value, "$")
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
