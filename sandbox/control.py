"""Read-side endpoints: provider lookups (/v1/effects) and the test control API (/_sandbox/)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

from sandbox import store
from sandbox.app import Sandbox
from sandbox.config import ConfigError
from sandbox.effects import KINDS
from sandbox.replies import Reply, invalid, json_reply, not_found

Query = Mapping[str, str]


# --- provider lookups --------------------------------------------------------------------------


def list_effects(sandbox: Sandbox, query: Query) -> Reply:
    key = query.get("idempotency_key") or None
    reference = query.get("reference") or None
    if key is None and reference is None:
        return invalid("give idempotency_key or reference")
    with sandbox.store.connect() as conn:
        now, _ = store.clock(conn)
        data = store.visible_effects(
            conn,
            key=key,
            reference=reference,
            now=now,
            index_lag=sandbox.config.index_lag_seconds,
            kinds=KINDS,
        )
    return json_reply(200, {"object": "list", "data": data})


def get_effect(sandbox: Sandbox, effect_id: str) -> Reply:
    # Reads by id are consistent: no index lag, unlike key/reference lookups.
    with sandbox.store.connect() as conn:
        effect = store.effect_by_id(conn, effect_id, KINDS)
    if effect is None:
        return not_found(f"no effect {effect_id!r}")
    return json_reply(200, effect)


# --- control API -------------------------------------------------------------------------------


def health(sandbox: Sandbox, query: Query) -> Reply:
    return json_reply(200, {"ok": True, "smtp_port": sandbox.smtp_port})


def effects_log(sandbox: Sandbox, query: Query) -> Reply:
    """Every execution through any of the sandbox's APIs, counted by our reference."""
    with sandbox.store.connect() as conn:
        rows = store.all_effects(conn, query.get("reference") or None)
    counts = Counter(reference for reference, _ in rows)
    return json_reply(200, {"data": [effect for _, effect in rows], "counts": dict(counts)})


def requests_log(sandbox: Sandbox, query: Query) -> Reply:
    with sandbox.store.connect() as conn:
        return json_reply(200, store.request_counts(conn))


def get_clock(sandbox: Sandbox, query: Query) -> Reply:
    with sandbox.store.connect() as conn:
        now, offset = store.clock(conn)
    return json_reply(200, {"now": now, "offset": offset})


def move_clock(sandbox: Sandbox, body: dict[str, Any]) -> Reply:
    unknown = set(body) - {"advance", "offset"}
    if unknown or len(body) != 1:
        return invalid('give exactly one of {"advance": seconds} or {"offset": seconds}')
    ((name, value),) = body.items()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return invalid(f"{name} must be a number of seconds")
    with sandbox.store.connect() as conn:
        store.set_clock(
            conn,
            offset=float(value) if name == "offset" else None,
            advance=float(value) if name == "advance" else None,
        )
    return get_clock(sandbox, {})


def get_config(sandbox: Sandbox, query: Query) -> Reply:
    return json_reply(200, sandbox.config.as_json())


def set_config(sandbox: Sandbox, body: dict[str, Any]) -> Reply:
    try:
        config = sandbox.configure(body)
    except ConfigError as exc:
        return invalid(str(exc))
    return json_reply(200, config.as_json())


def reset(sandbox: Sandbox, body: dict[str, Any]) -> Reply:
    with sandbox.store.connect() as conn:
        store.reset(conn)
    sandbox.reset_config()
    return json_reply(200, {"ok": True})


def parse_object(raw: bytes) -> dict[str, Any] | None:
    """A control body: empty means {}; anything but a JSON object is None."""
    if not raw.strip():
        return {}
    try:
        payload = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


CONTROL_GET = {
    "/_sandbox/health": health,
    "/_sandbox/effects": effects_log,
    "/_sandbox/requests": requests_log,
    "/_sandbox/clock": get_clock,
    "/_sandbox/config": get_config,
}

CONTROL_POST = {
    "/_sandbox/clock": move_clock,
    "/_sandbox/config": set_config,
    "/_sandbox/reset": reset,
}
