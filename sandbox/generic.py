"""A generic JSON API under /generic/<collection>, for tools declared only in a catalogue.

POST /generic/<collection>           any JSON object; Idempotency-Key; 201 with the stored object
                                     (the body's fields plus id, object, status, created)
GET  /generic/<collection>/<id>      consistent read by id
GET  /generic/<collection>?key=K     lookups by idempotency key or by our reference, behind the
GET  /generic/<collection>?reference=R    same index lag as every other lookup: {"data": [...]}

Every request needs `Authorization: Bearer <any token>` (401 otherwise), so a catalogue's
credential header is exercised. The collection is whatever path the catalogue's URL template
names, so any tool can have its own. Our reference is the body's `reference` field, or the
field named by `?reference_field=` on the POST. Execution is sandbox.effects' (the key store
with replay, mismatch, 409 while in progress and retention; the fault scenarios, magic values
anywhere in the body, and chaos; the atomic effect + stored response), so the effects log
counts its executions like any other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sandbox import store
from sandbox.app import Sandbox
from sandbox.effects import (
    _MALFORMED,
    GENERIC,
    MAX_PARAMS_DEPTH,
    MAX_REFERENCE_LENGTH,
    Attempt,
    Dialect,
    EffectRequest,
    InvalidRequest,
    _depth,
    _loads,
    parse_key,
)
from sandbox.replies import Reply, error_reply, invalid, json_reply, not_found

PREFIX = "/generic/"
_COLLECTION = re.compile(r"[a-z0-9_-]{1,64}")
_FIELD = re.compile(r"[A-Za-z0-9_]{1,64}")


def _render(request: EffectRequest, effect_id: str, now: float) -> dict[str, Any]:
    return {**request.params, "id": effect_id, "object": request.kind.removeprefix("generic."),
            "status": "succeeded", "created": now, "idempotency_key": request.key}


JSON_API = Dialect(
    id_prefix="gen_",
    render=_render,
    created_status=201,
    mismatch_status=GENERIC.mismatch_status,
    rejection_code=GENERIC.rejection_code,
    rejection_message=GENERIC.rejection_message,
    replays_server_errors=False,
)


def split(path: str) -> tuple[str, str | None] | None:
    """(collection, id or None) for a /generic/ path, or None if it is not one."""
    parts = path.removeprefix(PREFIX).split("/")
    if len(parts) > 2 or not _COLLECTION.fullmatch(parts[0]):
        return None
    return parts[0], (parts[1] if len(parts) == 2 else None)


def _kind(collection: str) -> str:
    return f"generic.{collection}"


def unauthorised(authorization: str | None) -> Reply | None:
    """Like any real API, this one wants a credential (any bearer token will do)."""
    if authorization and authorization.startswith("Bearer ") and len(authorization) > 7:
        return None
    return error_reply(401, "authentication_error", "send Authorization: Bearer <token>",
                       "unauthenticated")


def create(sandbox: Sandbox, collection: str, raw: bytes, query: Mapping[str, str],
           key_header: str | None, request_id: str, body_problem: Reply | None, *,
           authorization: str | None) -> Reply:
    denied = unauthorised(authorization)
    if denied is not None:
        # Refused before anything is recorded: not even counted as a request for an effect.
        return denied
    payload = _loads(raw) if body_problem is None else None
    field = query.get("reference_field", "reference")
    reference = payload.get(field) if isinstance(payload, dict) else None
    with sandbox.store.connect() as conn:
        now, _ = store.clock(conn)
        seq = store.record_request(conn, kind=_kind(collection),
                                   reference=reference if isinstance(reference, str) else None,
                                   has_key=key_header is not None, received=now)
        if body_problem is not None:
            return body_problem
        try:
            request = _parse(collection, payload, field, key_header)
        except InvalidRequest as exc:
            return invalid(str(exc))
        return Attempt(sandbox, conn, request, now, seq, request_id, JSON_API).run()


def _parse(collection: str, payload: Any, field: str, key_header: str | None) -> EffectRequest:
    if payload is _MALFORMED:
        raise InvalidRequest("request body is not valid JSON")
    if not isinstance(payload, dict):
        raise InvalidRequest("request body must be a JSON object")
    if not _FIELD.fullmatch(field):
        raise InvalidRequest("reference_field must be a plain field name")
    reference = payload.get(field)
    if not isinstance(reference, str) or not reference:
        raise InvalidRequest(f"{field} is required and must be a non-empty string")
    if len(reference) > MAX_REFERENCE_LENGTH:
        raise InvalidRequest(f"{field} must be at most {MAX_REFERENCE_LENGTH} characters")
    if _depth(payload) > MAX_PARAMS_DEPTH:
        raise InvalidRequest(f"the body must not nest deeper than {MAX_PARAMS_DEPTH} levels")
    return EffectRequest(_kind(collection), reference, payload, parse_key(key_header))


def lookup(sandbox: Sandbox, collection: str, query: Mapping[str, str]) -> Reply:
    key = query.get("key") or None
    reference = query.get("reference") or None
    if key is None and reference is None:
        return invalid("give key or reference")
    with sandbox.store.connect() as conn:
        now, _ = store.clock(conn)
        data = store.visible_effects(conn, key=key, reference=reference, now=now,
                                     index_lag=sandbox.config.index_lag_seconds,
                                     kinds={_kind(collection)})
    return json_reply(200, {"object": "list", "data": data})


def get(sandbox: Sandbox, collection: str, effect_id: str) -> Reply:
    # Reads by id are consistent: no index lag, unlike key/reference lookups.
    with sandbox.store.connect() as conn:
        effect = store.effect_by_id(conn, effect_id, {_kind(collection)})
    if effect is None:
        return not_found(f"no {collection} {effect_id!r}")
    return json_reply(200, effect)
