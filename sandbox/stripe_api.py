"""A Stripe-compatible slice of the API: refunds, enough for the official `stripe` SDK.

POST /v1/refunds         form-encoded like Stripe v1; Idempotency-Key; 200 with a refund object
GET  /v1/refunds/{id}    consistent read by id
GET  /v1/refunds         newest-first list (payment_intent / charge filters, limit,
                         starting_after), behind the same index lag as every other lookup

Execution reuses sandbox.effects: the same key store (replay with Idempotent-Replayed, mismatch,
409 while in progress, retention on the sandbox clock), the same fault scenarios and chaos, and
the same atomic effect + stored-response commit. A refund is an effect of kind `stripe.refund`
whose reference is metadata[operation_id], so the effects log counts its real executions.
Differences from the generic API are Stripe's: 200 on create, 400 for a key reused with other
params, 402 card_declined for `sandbox:reject`, and a 500 after execution began is stored and
replayed to same-key repeats (Stripe v1 documents exactly that).

Fault magic values are honoured in any metadata value or in `reason`, the only free-text
parameters; every other parameter is validated the way Stripe would.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

from sandbox import store
from sandbox.app import Sandbox
from sandbox.config import MAGIC_PREFIX, is_fault
from sandbox.effects import Attempt, Dialect, EffectRequest, InvalidRequest, parse_key
from sandbox.replies import Reply, error_reply, json_reply

KIND = "stripe.refund"
KINDS = frozenset({KIND})
REFUNDS = "/v1/refunds"
REFUND_PREFIX = "/v1/refunds/"

CREATE_PARAMS = frozenset({"amount", "currency", "payment_intent", "charge", "metadata", "reason"})
LIST_PARAMS = frozenset({"payment_intent", "charge", "limit", "starting_after"})
REASONS = ("duplicate", "fraudulent", "requested_by_customer")
MAX_METADATA_KEYS = 50
MAX_METADATA_KEY_LENGTH = 40
MAX_METADATA_VALUE_LENGTH = 500
MAX_FORM_FIELDS = 200
DEFAULT_LIST_LIMIT = 10
MAX_LIST_LIMIT = 100

# `name` or `name[sub]`: the only nesting a refund takes (metadata[...]).
_PARAM_NAME = re.compile(r"([a-z_]+)(?:\[([^\[\]]+)\])?")
_INTEGER = re.compile(r"[0-9]{1,12}")
_CURRENCY = re.compile(r"[A-Za-z]{3}")
_OBJECT_ID = re.compile(r"[A-Za-z0-9_.:~-]{1,255}")
_API_KEY = re.compile(r"(sk|rk)_test_[A-Za-z0-9_]+")


class StripeInvalid(ValueError):
    """A request Stripe would refuse before executing anything: nothing is stored."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400
    ) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
        self.status = status

    def reply(self) -> Reply:
        return error_reply(
            self.status, "invalid_request_error", str(self), self.code, param=self.param
        )


# --- objects -----------------------------------------------------------------------------------


def render_refund(request: EffectRequest, refund_id: str, now: float) -> dict[str, Any]:
    params = request.params
    return {
        "id": refund_id,
        "object": "refund",
        "amount": params["amount"],
        "balance_transaction": None,
        "charge": params.get("charge"),
        "created": int(now),
        "currency": params["currency"],
        "metadata": params["metadata"],
        "payment_intent": params.get("payment_intent"),
        "reason": params.get("reason"),
        "receipt_number": None,
        "source_transfer_reversal": None,
        "status": "succeeded",
        "transfer_reversal": None,
    }


STRIPE = Dialect(
    id_prefix="re_",
    render=render_refund,
    created_status=200,
    mismatch_status=400,
    rejection_code="card_declined",
    rejection_message="Your card was declined.",
    replays_server_errors=True,
)


# --- authentication ----------------------------------------------------------------------------


def _unauthorised(authorization: str | None) -> Reply | None:
    """Stripe's 401 unless a test-mode secret or restricted key is presented (Bearer or Basic).
    The key is never echoed, logged or stored."""
    scheme, _, credentials = (authorization or "").strip().partition(" ")
    key = credentials.strip()
    if scheme.lower() == "basic":
        try:
            key = base64.b64decode(key, validate=True).decode("utf-8").partition(":")[0]
        except ValueError:
            key = ""
    elif scheme.lower() != "bearer":
        key = ""
    if _API_KEY.fullmatch(key):
        return None
    message = "Invalid API Key provided." if key else "You did not provide an API key."
    return error_reply(401, "invalid_request_error", message)


# --- parsing -----------------------------------------------------------------------------------


def parse_form(raw: bytes) -> dict[str, Any]:
    """`a=1&metadata[k]=v` -> {"a": "1", "metadata": {"k": "v"}}; every value stays a string."""
    try:
        text = raw.decode("utf-8")
        pairs = parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS)
    except (UnicodeDecodeError, ValueError):
        raise StripeInvalid(
            "Invalid request body: expected application/x-www-form-urlencoded"
        ) from None
    form: dict[str, Any] = {}
    for name, value in pairs:
        match = _PARAM_NAME.fullmatch(name)
        if match is None:
            raise StripeInvalid(f"Invalid parameter name: {name[:60]}", code="parameter_unknown")
        base, sub = match.groups()
        if sub is None:
            if base in form:
                raise StripeInvalid(f"Duplicate parameter: {base}", param=base)
            form[base] = value
            continue
        bucket = form.setdefault(base, {})
        if not isinstance(bucket, dict) or sub in bucket:
            raise StripeInvalid(f"Invalid parameter: {base}[{sub[:40]}]", param=base)
        bucket[sub] = value
    return form


def _reference_hint(raw: bytes) -> str | None:
    """metadata[operation_id] for the request log, even when the request is refused."""
    try:
        metadata = parse_form(raw).get("metadata")
    except StripeInvalid:
        return None
    value = metadata.get("operation_id") if isinstance(metadata, dict) else None
    return value or None


def _positive_integer(form: Mapping[str, Any], name: str) -> int:
    raw = form.get(name)
    if raw is None or raw == "":
        raise StripeInvalid(f"Missing required param: {name}.", param=name,
                            code="parameter_missing")
    if not isinstance(raw, str) or not _INTEGER.fullmatch(raw) or int(raw) < 1:
        raise StripeInvalid(f"Invalid positive integer: {name}", param=name,
                            code="parameter_invalid_integer")
    return int(raw)


def _currency(form: Mapping[str, Any]) -> str:
    # Stripe takes defaults from the charge; the sandbox has no charges, so it is required.
    raw = form.get("currency")
    if not raw:
        raise StripeInvalid("Missing required param: currency.", param="currency",
                            code="parameter_missing")
    if not isinstance(raw, str) or not _CURRENCY.fullmatch(raw):
        raise StripeInvalid(f"Invalid currency: {str(raw)[:10]}", param="currency",
                            code="parameter_invalid_string")
    return raw.lower()


def _target(form: Mapping[str, Any]) -> dict[str, str]:
    given = {name: form[name] for name in ("payment_intent", "charge") if form.get(name)}
    if not given:
        raise StripeInvalid("One of `charge` or `payment_intent` is required.",
                            code="parameter_missing")
    if len(given) > 1:
        raise StripeInvalid("Only one of `charge` or `payment_intent` may be given.",
                            param="charge")
    ((name, value),) = given.items()
    prefixes = ("pi_",) if name == "payment_intent" else ("ch_", "py_")
    if not isinstance(value, str) or not value.startswith(prefixes) or not _OBJECT_ID.fullmatch(
        value
    ):
        # The sandbox has no payment objects: any well-formed ID stands for one that exists.
        raise StripeInvalid(f"No such {name}: '{str(value)[:60]}'", param=name,
                            code="resource_missing")
    return {name: value}


def _metadata(form: Mapping[str, Any]) -> dict[str, str]:
    raw = form.get("metadata", {})
    if not isinstance(raw, dict):
        raise StripeInvalid("Invalid object: metadata", param="metadata")
    # An empty value unsets a key in Stripe; on a create it simply is not there.
    metadata = {key: value for key, value in raw.items() if value != ""}
    if len(metadata) > MAX_METADATA_KEYS:
        raise StripeInvalid(f"Metadata can have at most {MAX_METADATA_KEYS} keys.",
                            param="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_LENGTH:
            raise StripeInvalid(
                f"Metadata keys can have up to {MAX_METADATA_KEY_LENGTH} characters.",
                param=f"metadata[{key[:40]}]")
        if len(value) > MAX_METADATA_VALUE_LENGTH:
            raise StripeInvalid(
                f"Metadata values can have up to {MAX_METADATA_VALUE_LENGTH} characters, but "
                f"you passed in a value that is {len(value)} characters long.",
                param=f"metadata[{key}]")
    return metadata


def _reason(form: Mapping[str, Any]) -> dict[str, str]:
    reason = form.get("reason")
    if reason is None or reason == "":
        return {}
    magic = isinstance(reason, str) and reason.startswith(MAGIC_PREFIX) and is_fault(
        reason.removeprefix(MAGIC_PREFIX))
    if reason not in REASONS and not magic:
        raise StripeInvalid(f"Invalid reason: must be one of {', '.join(REASONS)}",
                            param="reason", code="parameter_invalid_string")
    return {"reason": reason}


def parse_refund(raw: bytes, key_header: str | None) -> EffectRequest:
    form = parse_form(raw)
    unknown = sorted(set(form) - CREATE_PARAMS)
    if unknown:
        raise StripeInvalid(f"Received unknown parameter: {unknown[0]}", param=unknown[0],
                            code="parameter_unknown")
    metadata = _metadata(form)
    params: dict[str, Any] = {
        "amount": _positive_integer(form, "amount"),
        "currency": _currency(form),
        **_target(form),
        "metadata": metadata,
        **_reason(form),
    }
    try:
        key = parse_key(key_header)
    except InvalidRequest as exc:
        raise StripeInvalid(str(exc)) from None
    return EffectRequest(KIND, metadata.get("operation_id", ""), params, key)


# --- endpoints ---------------------------------------------------------------------------------


def create_refund(
    sandbox: Sandbox,
    raw: bytes,
    *,
    authorization: str | None,
    key_header: str | None,
    request_id: str,
    body_problem: Reply | None = None,
) -> Reply:
    with sandbox.store.connect() as conn:
        now, _ = store.clock(conn)
        # Counted before anything can fail, so a test can prove whether a request was sent.
        seq = store.record_request(
            conn,
            kind=KIND,
            reference=None if body_problem else _reference_hint(raw),
            has_key=key_header is not None,
            received=now,
        )
        if body_problem is not None:
            return body_problem
        refused = _unauthorised(authorization)
        if refused is not None:
            return refused
        try:
            request = parse_refund(raw, key_header)
        except StripeInvalid as exc:
            return exc.reply()
        return Attempt(sandbox, conn, request, now, seq, request_id, STRIPE).run()


def get_refund(sandbox: Sandbox, refund_id: str, *, authorization: str | None) -> Reply:
    refused = _unauthorised(authorization)
    if refused is not None:
        return refused
    # Reads by id are consistent: no index lag, unlike the list.
    with sandbox.store.connect() as conn:
        refund = store.effect_by_id(conn, refund_id, KINDS)
    if refund is None:
        return error_reply(404, "invalid_request_error", f"No such refund: '{refund_id[:60]}'",
                           "resource_missing", param="id")
    return json_reply(200, refund)


def _list_limit(query: Mapping[str, str]) -> int:
    raw = query.get("limit")
    if raw is None:
        return DEFAULT_LIST_LIMIT
    if not _INTEGER.fullmatch(raw) or not 1 <= int(raw) <= MAX_LIST_LIMIT:
        raise StripeInvalid(f"limit must be an integer between 1 and {MAX_LIST_LIMIT}",
                            param="limit", code="parameter_invalid_integer")
    return int(raw)


def list_refunds(sandbox: Sandbox, query: Mapping[str, str], *,
                 authorization: str | None) -> Reply:
    refused = _unauthorised(authorization)
    if refused is not None:
        return refused
    unknown = sorted(set(query) - LIST_PARAMS)
    try:
        if unknown:
            raise StripeInvalid(f"Received unknown parameter: {unknown[0]}", param=unknown[0],
                                code="parameter_unknown")
        limit = _list_limit(query)
        data, has_more = _page(sandbox, query, limit)
    except StripeInvalid as exc:
        return exc.reply()
    return json_reply(
        200, {"object": "list", "data": data, "has_more": has_more, "url": REFUNDS}
    )


def _page(sandbox: Sandbox, query: Mapping[str, str], limit: int) -> tuple[list[Any], bool]:
    matching = {name: query[name] for name in ("payment_intent", "charge") if query.get(name)}
    starting_after = query.get("starting_after") or None
    with sandbox.store.connect() as conn:
        now, _ = store.clock(conn)
        try:
            return store.visible_page(
                conn,
                kinds=KINDS,
                matching=matching,
                now=now,
                index_lag=sandbox.config.index_lag_seconds,
                starting_after=starting_after,
                limit=limit,
            )
        except LookupError:
            raise StripeInvalid(f"No such refund: '{(starting_after or '')[:60]}'",
                                param="starting_after", code="resource_missing") from None
