"""POST /v1/effects/{kind}: idempotent execution of a side effect, with injectable faults.

The execution machinery here (key claim, replay, mismatch, in-progress, fault scenarios, the
atomic effect + stored-response commit) is shared by every provider API the sandbox speaks; a
Dialect says how one API spells its objects and errors (see sandbox.stripe_api).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from sandbox import store
from sandbox.app import Sandbox
from sandbox.config import MAGIC_PREFIX, is_fault, lag_of
from sandbox.replies import (
    LOST,
    Reply,
    encode,
    error_body,
    error_reply,
    invalid,
    new_id,
    not_found,
)

KINDS = frozenset({"refund", "email", "ticket"})
MAX_KEY_LENGTH = 255
MAX_REFERENCE_LENGTH = 255
MAX_PARAMS_DEPTH = 32

REPLAYED = ("Idempotent-Replayed", "true")
SERVER_ERROR = error_reply(500, "api_error", "internal error")
RATE_LIMITED = error_reply(
    429,
    "invalid_request_error",
    "Too many requests hit the API too quickly.",
    "rate_limit",
    headers=(("Retry-After", "1"),),
)


class InvalidRequest(ValueError):
    pass


@dataclass(frozen=True)
class EffectRequest:
    kind: str
    reference: str
    params: dict[str, Any]
    key: str | None

    def fingerprint(self) -> str:
        canonical = json.dumps(
            {"kind": self.kind, "reference": self.reference, "params": self.params},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Dialect:
    """How one provider API spells the shared behaviour."""

    id_prefix: str
    # The stored object for a new effect: (request, its new id, sandbox now) -> JSON object.
    render: Callable[[EffectRequest, str, float], dict[str, Any]]
    created_status: int
    mismatch_status: int
    rejection_code: str
    rejection_message: str
    # Stripe v1 stores whatever the endpoint answered once execution began, a 500 included, and
    # replays it; the generic API stores the effect's own answer even when a 500 went out.
    replays_server_errors: bool


def _render_effect(request: EffectRequest, effect_id: str, now: float) -> dict[str, Any]:
    return {
        "id": effect_id,
        "object": request.kind,
        "status": "succeeded",
        "reference": request.reference,
        "params": request.params,
        "created": now,
        "idempotency_key": request.key,
    }


# The IETF Idempotency-Key draft: 201 for a new effect, 422 for a key reused with other params.
GENERIC = Dialect(
    id_prefix="eff_",
    render=_render_effect,
    created_status=201,
    mismatch_status=422,
    rejection_code="sandbox_rejected",
    rejection_message="rejected by the sandbox",
    replays_server_errors=False,
)


def create_effect(
    sandbox: Sandbox,
    kind: str,
    raw: bytes,
    key_header: str | None,
    request_id: str,
    body_problem: Reply | None = None,
) -> Reply:
    payload = _loads(raw) if body_problem is None else None
    with sandbox.store.connect() as conn:
        now, _ = store.clock(conn)
        # Counted before anything can fail, so a test can prove whether a request was sent.
        seq = store.record_request(
            conn,
            kind=kind,
            reference=_reference_hint(payload),
            has_key=key_header is not None,
            received=now,
        )
        if body_problem is not None:
            return body_problem
        if kind not in KINDS:
            return not_found(f"unknown effect kind {kind!r}")
        try:
            request = parse_request(kind, payload, key_header)
        except InvalidRequest as exc:
            return invalid(str(exc))
        return Attempt(sandbox, conn, request, now, seq, request_id, GENERIC).run()


# --- parsing -----------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _loads(raw: bytes) -> Any:
    """The decoded body, or the sentinel _MALFORMED."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return _MALFORMED


_MALFORMED = object()


def _reference_hint(payload: Any) -> str | None:
    if isinstance(payload, dict) and isinstance(payload.get("reference"), str):
        return payload["reference"]
    return None


def parse_request(kind: str, payload: Any, key_header: str | None) -> EffectRequest:
    if payload is _MALFORMED:
        raise InvalidRequest("request body is not valid JSON")
    if not isinstance(payload, dict):
        raise InvalidRequest("request body must be a JSON object")
    reference = payload.get("reference")
    if not isinstance(reference, str) or not reference:
        raise InvalidRequest("reference is required and must be a non-empty string")
    if len(reference) > MAX_REFERENCE_LENGTH:
        raise InvalidRequest(f"reference must be at most {MAX_REFERENCE_LENGTH} characters")
    params = payload.get("params")
    if not isinstance(params, dict):
        raise InvalidRequest("params is required and must be a JSON object")
    if _depth(params) > MAX_PARAMS_DEPTH:
        raise InvalidRequest(f"params must not nest deeper than {MAX_PARAMS_DEPTH} levels")
    return EffectRequest(kind, reference, params, parse_key(key_header))


def parse_key(header: str | None) -> str | None:
    """The Idempotency-Key, accepting both Stripe's bare token and the IETF sf-string form."""
    if header is None:
        return None
    key = header.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if not key:
        raise InvalidRequest("Idempotency-Key must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidRequest(f"Idempotency-Key must be at most {MAX_KEY_LENGTH} characters")
    return key


def _children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, list):
        return value
    return []


def _depth(value: Any) -> int:
    # Iterative: a hostile body must not be able to blow the interpreter's stack.
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in _children(node))
    return deepest


def find_magic_fault(params: Any) -> str | None:
    """The first fault named by a magic string anywhere in params (depth-first, in order)."""
    stack = [params]
    while stack:
        node = stack.pop()
        if isinstance(node, str) and node.startswith(MAGIC_PREFIX):
            name = node.removeprefix(MAGIC_PREFIX)
            if is_fault(name):
                return name
        stack.extend(reversed(_children(node)))
    return None


# --- execution ---------------------------------------------------------------------------------


class Attempt:
    """One request's execution under its key, in the given dialect."""

    def __init__(
        self,
        sandbox: Sandbox,
        conn: sqlite3.Connection,
        request: EffectRequest,
        now: float,
        seq: int,
        request_id: str,
        dialect: Dialect,
    ) -> None:
        self.sandbox = sandbox
        self.conn = conn
        self.request = request
        self.now = now
        self.seq = seq
        self.request_id = request_id
        self.dialect = dialect
        self.config = sandbox.config

    def run(self) -> Reply:
        key = self.request.key
        if key is None:
            # Without a key there is nothing to deduplicate: every request is a first request.
            return self._execute(token="", first=True)
        claim = store.claim_key(
            self.conn,
            key,
            self.request.fingerprint(),
            self.now,
            self.config.key_retention_seconds,
        )
        match claim.state:
            case store.ClaimState.REPLAY:
                return self._replay(claim.response)
            case store.ClaimState.MISMATCH:
                return error_reply(
                    self.dialect.mismatch_status,
                    "idempotency_error",
                    "Idempotency-Key was already used with different request parameters",
                    "idempotency_key_mismatch",
                )
            case store.ClaimState.IN_PROGRESS:
                return error_reply(
                    409,
                    "idempotency_error",
                    "a request with this Idempotency-Key is still being processed",
                    "request_in_progress",
                    headers=(("Retry-After", "1"),),
                )
            case _:
                return self._execute(claim.token, first=claim.state is store.ClaimState.FIRST)

    def _replay(self, response: store.StoredResponse | None) -> Reply:
        assert response is not None
        headers = (REPLAYED, ("Original-Request", response.request_id))
        return Reply(status=response.status, body=response.body, headers=headers)

    def _choose_fault(self) -> str | None:
        magic = find_magic_fault(self.request.params)
        return magic if magic is not None else self.sandbox.roll_chaos()

    def _execute(self, token: str, *, first: bool) -> Reply:
        # A scenario fires on the first request for its key only; repeats behave normally.
        fault = self._choose_fault() if first else None
        if fault is not None:
            store.set_request_fault(self.conn, self.seq, fault)
        if fault in {"drop-before-commit", "rate-limit"}:
            # Nothing executed and nothing is stored: a same-key retry executes normally.
            if self.request.key is not None:
                store.drop_key(self.conn, self.request.key, token)
            return LOST if fault == "drop-before-commit" else RATE_LIMITED
        try:
            if fault == "reject":
                return self._reject(token)
            return self._succeed(token, fault)
        except store.ClaimLost:
            return error_reply(500, "api_error", "the idempotency record vanished (sandbox reset?)")

    def _reject(self, token: str) -> Reply:
        dialect = self.dialect
        body = encode(error_body("card_error", dialect.rejection_message, dialect.rejection_code))
        response = store.StoredResponse(402, body, self.request_id)
        store.commit_outcome(
            self.conn,
            key=self.request.key,
            token=token,
            effect=None,
            response=response,
            settled=True,
        )
        return Reply(status=402, body=body)

    def _succeed(self, token: str, fault: str | None) -> Reply:
        request, dialect = self.request, self.dialect
        effect_id = new_id(dialect.id_prefix)
        body = encode(dialect.render(request, effect_id, self.now))
        effect = store.NewEffect(
            id=effect_id,
            kind=request.kind,
            reference=request.reference,
            idempotency_key=request.key,
            created=self.now,
            lag=lag_of(fault),
            body=body.decode("utf-8"),
        )
        created = Reply(status=dialect.created_status, body=body)
        answer = SERVER_ERROR if fault == "500-after-commit" else created
        # What a same-key repeat will be answered with.
        saved = answer if dialect.replays_server_errors else created
        response = store.StoredResponse(saved.status, saved.body, self.request_id)
        # During a `timeout` sleep the key stays in_progress (409 to repeats) although the effect
        # and its response are already committed; a restart would mark it completed.
        store.commit_outcome(
            self.conn,
            key=request.key,
            token=token,
            effect=effect,
            response=response,
            settled=fault != "timeout",
        )
        return self._answer(answer, token, fault)

    def _answer(self, answer: Reply, token: str, fault: str | None) -> Reply:
        if fault == "lose-response":
            return LOST
        if fault == "timeout":
            key = self.request.key
            settle = None if key is None else partial(_settle, self.sandbox.store, key, token)
            return Reply(
                status=answer.status,
                body=answer.body,
                delay_seconds=self.config.timeout_sleep_seconds,
                before_send=settle,
            )
        return answer


def _settle(storage: store.Store, key: str, token: str) -> None:
    # Runs after the request's own connection is closed, so it needs a fresh one.
    with storage.connect() as conn:
        store.settle_key(conn, key, token)
