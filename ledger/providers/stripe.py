"""Refunds through the official `stripe` SDK, classified with the same discipline as the
generic HTTP adapter (ledger.providers.http).

Each call builds its own `stripe.StripeClient`: the API key and base address are read from
settings at call time and nothing touches the SDK's module-level state. The SDK's automatic
retries are off (`max_network_retries=0`): a retry on the SDK's own schedule would be a send the
ledger neither claimed nor recorded. Every retry goes through the executor or the reconciler,
always with the operation's stored key.

Classification: a connect that failed never sent anything (NotSent); anything that failed once
the request may have left — a timeout, a reset, a 5xx, a 409 while Stripe still executes the
same key, a key reused with other params — is Unknown; Stripe's definitive 4xx (card, invalid
request, authentication, permission) are Rejected; 429 is NotSent (Stripe rate-limits before
executing anything). Error classes are built from exception classes and Stripe's error codes,
never from messages: `stripe.CardError.card_declined`, `stripe.APIConnectionError.ReadTimeout`.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import stripe

from ledger import metrics
from ledger.providers.base import (
    Capabilities,
    Confirmed,
    Found,
    LookupOutcome,
    NotFound,
    NotSent,
    Rejected,
    SendOutcome,
    Unavailable,
    Unknown,
    UnknownReason,
)
from ledger.providers.config import SettingsReader
from ledger.providers.http import ConnectorContext, classify_transport_error

if TYPE_CHECKING:
    from stripe.params import RefundCreateParams

    from ledger.models import Operation

logger = logging.getLogger(__name__)

DAY = 24 * 3600
# Stripe's limit for a metadata value; the memo is free text and not part of the intent.
MAX_METADATA_VALUE = 500
# A lookup pages through the payment intent's refunds; past this many it gives up (Unavailable)
# rather than answer "not found" from a partial read.
MAX_LISTED_REFUNDS = 1000
_ERROR_CODE = re.compile(r"[a-z0-9_]{1,60}")
# Refund statuses that mean no money moved, and a same-key replay returns the same answer.
_FAILED_REFUND_STATUSES = frozenset({"failed", "canceled"})
_DEFINITIVE_ERRORS: tuple[type[stripe.StripeError], ...] = (
    stripe.CardError,
    stripe.InvalidRequestError,
    stripe.AuthenticationError,
    stripe.PermissionError,
)

CAPABILITIES = Capabilities(
    honours_idempotency_keys=True,
    # Stripe v1 prunes keys once they are at least 24 hours old.
    key_retention_seconds=DAY,
    lookup_by_request_id=True,
    # Stripe cannot look up by idempotency key; our reference is metadata[operation_id].
    lookup_by_key=False,
    lookup_by_reference=True,
    lookup_consistency_seconds=30.0,
    # A list can lag behind a create: absence from it proves nothing, so escalate instead.
    authoritative_absence=False,
)


def payment_intent_for(invoice: str) -> str:
    """The payment intent an invoice was paid with (the sandbox accepts any `pi_…`)."""
    return f"pi_{invoice}"


# --- classification ----------------------------------------------------------------------------


def _code(exc: stripe.StripeError) -> str:
    error = exc.error
    raw = exc.code or (getattr(error, "code", None) if error is not None else None)
    if not raw:
        return ""
    # Codes are Stripe's short tokens; anything else is not trusted into our records.
    return raw if _ERROR_CODE.fullmatch(str(raw)) else "unrecognised"


def error_class_of(exc: stripe.StripeError) -> str:
    """A redacted classification: exception class, HTTP status where the class does not
    imply it, and Stripe's error code. Never the message, which may carry personal data."""
    if isinstance(exc, stripe.APIConnectionError):
        cause = exc.__cause__
        detail = type(cause).__name__ if cause is not None else ""
        return f"stripe.APIConnectionError.{detail}".rstrip(".")[:100]
    parts = ["stripe", type(exc).__name__]
    if not isinstance(exc, (*_DEFINITIVE_ERRORS, stripe.RateLimitError, stripe.IdempotencyError)):
        # APIError and anything unforeseen: the status is the useful part.
        parts.append(f"http_{exc.http_status or 0}")
    code = _code(exc)
    if code:
        parts.append(code)
    return ".".join(parts)[:100]


def _is_idempotency_error(exc: stripe.StripeError) -> bool:
    error_type = getattr(exc.error, "type", None) if exc.error is not None else None
    return isinstance(exc, stripe.IdempotencyError) or error_type == "idempotency_error"


def classify_error(exc: stripe.StripeError) -> SendOutcome:
    error_class = error_class_of(exc)
    if isinstance(exc, stripe.APIConnectionError):
        cause = exc.__cause__
        if not isinstance(cause, Exception):
            return Unknown(error_class=error_class, reason=UnknownReason.CONNECTION_RESET)
        transport = classify_transport_error(cause)
        if isinstance(transport, Unknown):
            return Unknown(error_class=error_class, reason=transport.reason)
        return NotSent(error_class=error_class)
    if exc.http_status == 409:
        # Stripe is still executing the original request with this key.
        return Unknown(error_class=error_class, reason=UnknownReason.PROVIDER_IN_PROGRESS)
    if _is_idempotency_error(exc):
        # Our key is stored with other params: the original may have executed.
        return Unknown(error_class=error_class, reason=UnknownReason.KEY_REUSED)
    if isinstance(exc, stripe.RateLimitError):
        return NotSent(error_class=error_class)
    if isinstance(exc, _DEFINITIVE_ERRORS):
        return Rejected(error_class=error_class,
                        detail={"code": _code(exc), "http_status": exc.http_status})
    # APIError (5xx, an unreadable body) and anything unforeseen: it may have executed.
    reason = (UnknownReason.AMBIGUOUS_5XX if (exc.http_status or 0) >= 500
              else UnknownReason.AMBIGUOUS_RESPONSE)
    return Unknown(error_class=error_class, reason=reason)


def classify_refund(refund: Mapping[str, Any], *, replayed: bool) -> SendOutcome:
    status = str(refund.get("status") or "")
    if status in _FAILED_REFUND_STATUSES:
        return Rejected(error_class=f"stripe.Refund.{status}",
                        detail={"refund": str(refund.get("id", ""))})
    return Confirmed(result=dict(refund), provider_request_id=str(refund.get("id", "")),
                     replayed=replayed)


@dataclass(frozen=True)
class RefundFields:
    """Which of the tool's params hold what a refund needs (the catalogue may rename them)."""

    invoice: str = "invoice"
    amount: str = "amount"
    currency: str = "currency"
    payee: str = "payee"
    memo: str = "memo"


def refund_fields(refund: Mapping[str, Any], names: RefundFields | None = None
                  ) -> dict[str, Any]:
    """What a reconciler verifies against the intent: invoice, amount, currency, payee, and
    our reference. The invoice counts only if the refund went to that invoice's payment."""
    names = names or RefundFields()
    metadata = refund.get("metadata") or {}
    invoice = metadata.get("invoice")
    on_target = invoice is not None and refund.get("payment_intent") == payment_intent_for(
        invoice)
    currency = refund.get("currency")
    return {
        names.invoice: invoice if on_target else None,
        names.amount: refund.get("amount"),
        names.currency: currency.upper() if isinstance(currency, str) else currency,
        names.payee: metadata.get("payee"),
        "reference": metadata.get("operation_id"),
        "payment_intent": refund.get("payment_intent"),
    }


def _found(refunds: list[dict[str, Any]], names: RefundFields | None = None) -> LookupOutcome:
    if not refunds:
        return NotFound()
    # Newest first from the list: the oldest is the original.
    original = refunds[-1]
    return Found(fields=refund_fields(original, names),
                 provider_request_id=str(original.get("id", "")),
                 status=str(original.get("status", "")), matches=len(refunds), raw=original)


# --- transport ---------------------------------------------------------------------------------


class PooledHttpxClient(stripe.HTTPClient):
    """The SDK's transport seam over one pooled httpx client per process, with this call's
    timeout. (The SDK's own HTTPXClient builds two TLS contexts per instance and passes form
    bodies through a deprecated httpx path.) A transport failure is raised as the SDK's
    APIConnectionError with the httpx exception as its cause, which the classifier reads."""

    name = "httpx"
    _pools: dict[int, httpx.Client] = {}
    _lock = threading.Lock()

    def __init__(self, timeout: float) -> None:
        super().__init__()
        self._timeout = httpx.Timeout(timeout, connect=min(timeout, 3.0))

    @classmethod
    def _pool(cls) -> httpx.Client:
        # Keyed by pid: a forked Celery child must not share its parent's sockets.
        pid = os.getpid()
        pool = cls._pools.get(pid)
        if pool is None:
            with cls._lock:
                pool = cls._pools.get(pid)
                if pool is None:
                    pool = httpx.Client(limits=httpx.Limits(max_connections=64,
                                                            max_keepalive_connections=16))
                    cls._pools[pid] = pool
        return pool

    # The SDK's base class declares a str body and a private keyword (_usage) that its own request
    # loop never passes; like the SDK's own RequestsClient and HTTPXClient this returns the raw
    # bytes, which the SDK decodes itself.
    def request(  # type: ignore[override]
        self, method: str, url: str, headers: Mapping[str, str] | None, post_data: Any = None
    ) -> tuple[bytes, int, Mapping[str, str]]:
        try:
            response = self._pool().request(method, url, headers=headers, content=post_data,
                                            timeout=self._timeout)
        except httpx.HTTPError as exc:
            raise stripe.APIConnectionError(
                f"network error: {type(exc).__name__}", should_retry=False) from exc
        return response.content, response.status_code, response.headers

    def close(self) -> None:
        # The pool outlives this call.
        pass


# --- the adapter -------------------------------------------------------------------------------


class StripeRefundAdapter:
    """Refunds with POST /v1/refunds; lookups by refund id, else by listing the invoice's
    payment intent and matching metadata[operation_id]."""

    def __init__(
        self,
        *,
        name: str,
        base_url: Callable[[], str],
        api_key: Callable[[], str],
        capabilities: Capabilities = CAPABILITIES,
        fields: RefundFields | None = None,
    ) -> None:
        self.name = name
        self._base_url = base_url
        self._api_key = api_key
        self.capabilities = capabilities
        self.fields = fields or RefundFields()

    def __repr__(self) -> str:
        return f"StripeRefundAdapter({self.name!r})"

    def _client(self, timeout: float) -> stripe.StripeClient:
        return stripe.StripeClient(
            self._api_key(),
            base_addresses={"api": self._base_url()},
            max_network_retries=0,
            http_client=PooledHttpxClient(timeout),
        )

    def refund_params(self, operation: Operation) -> RefundCreateParams:
        intent, names = operation.intent_params, self.fields
        metadata = {
            "operation_id": operation.operation_id,
            "invoice": intent[names.invoice],
            "payee": intent[names.payee],
        }
        memo = operation.params.get(names.memo) if names.memo else None
        if memo:
            # Free text, not an intent field: shortened to what Stripe stores, not refused.
            metadata["memo"] = str(memo)[:MAX_METADATA_VALUE]
        return {
            "amount": intent[names.amount],
            "currency": str(intent[names.currency]).lower(),
            "payment_intent": payment_intent_for(intent[names.invoice]),
            "metadata": metadata,
        }

    def send(self, operation: Operation, *, key: str, timeout: float) -> SendOutcome:
        started = time.perf_counter()
        try:
            refund = self._client(timeout).v1.refunds.create(
                self.refund_params(operation), {"idempotency_key": key})
        except stripe.StripeError as exc:
            outcome = classify_error(exc)
        else:
            outcome = classify_refund(_as_dict(refund), replayed=_replayed(refund))
        finally:
            metrics.PROVIDER_LATENCY.labels(self.name, "send").observe(
                time.perf_counter() - started)
        logger.info(
            "provider send operation_id=%s provider=%s outcome=%s",
            operation.operation_id,
            self.name,
            type(outcome).__name__,
        )
        return outcome

    def lookup(self, operation: Operation, *, timeout: float) -> LookupOutcome:
        started = time.perf_counter()
        try:
            return self._lookup(self._client(timeout), operation)
        except stripe.StripeError as exc:
            return Unavailable(error_class=error_class_of(exc))
        finally:
            metrics.PROVIDER_LATENCY.labels(self.name, "lookup").observe(
                time.perf_counter() - started)

    def lookup_query(self, operation: Operation) -> dict[str, str]:
        query = {"refund_id": operation.provider_request_id} if operation.provider_request_id \
            else {}
        invoice = str(operation.intent_params.get(self.fields.invoice, ""))
        return query | {"payment_intent": payment_intent_for(invoice),
                        "metadata.operation_id": operation.operation_id}

    def _lookup(self, client: stripe.StripeClient, operation: Operation) -> LookupOutcome:
        if operation.provider_request_id:
            try:
                refund = client.v1.refunds.retrieve(operation.provider_request_id)
            except stripe.InvalidRequestError as exc:
                if exc.http_status != 404:
                    raise
            else:
                return _found([_as_dict(refund)], self.fields)
        invoice = operation.intent_params.get(self.fields.invoice, "")
        listed = client.v1.refunds.list(
            {"payment_intent": payment_intent_for(invoice), "limit": 100})
        ours = _matching(listed.auto_paging_iter(), operation.operation_id)
        if ours is None:
            return Unavailable(error_class="stripe.list_too_long")
        return _found(ours, self.fields)


def _matching(refunds: Iterable[Any], operation_id: str) -> list[dict[str, Any]] | None:
    """Our refunds among the listed ones (newest first), or None if the list was too long to
    read completely."""
    ours = []
    for seen, refund in enumerate(refunds, start=1):
        if seen > MAX_LISTED_REFUNDS:
            return None
        data = _as_dict(refund)
        if (data.get("metadata") or {}).get("operation_id") == operation_id:
            ours.append(data)
    return ours


def _as_dict(obj: Any) -> dict[str, Any]:
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


def _replayed(obj: Any) -> bool:
    response = getattr(obj, "last_response", None)
    headers = getattr(response, "headers", None) or {}
    return str(headers.get("Idempotent-Replayed", "")).lower() == "true"


# --- from the catalogue ------------------------------------------------------------------------

STRIPE_API = "https://api.stripe.com"


def build_stripe(reader: SettingsReader, context: ConnectorContext, *, name: str
                 ) -> StripeRefundAdapter:
    """`connector = "stripe"`: base_url (default the real Stripe API), api_key (env:NAME only),
    and which params hold invoice, amount, currency, payee and memo."""
    from ledger.providers.config import ConnectorConfigError

    base_url = reader.address("base_url", STRIPE_API)
    api_key = reader.secret("api_key")
    assert api_key is not None
    names = RefundFields(**{
        part: reader.string(f"{part}_field", default)
        for part, default in RefundFields().__dict__.items()})
    for part, field_name in names.__dict__.items():
        wanted = context.intent_fields if part != "memo" else context.properties
        if field_name not in wanted:
            kind = "an intent field" if part != "memo" else "a property of the schema"
            raise ConnectorConfigError(reader.key(f"{part}_field"),
                                       f"{field_name!r} is not {kind}")
    capabilities = Capabilities(**{
        **CAPABILITIES.__dict__,
        "lookup_consistency_seconds": reader.number("lookup_consistency_seconds",
                                                    CAPABILITIES.lookup_consistency_seconds)})
    reader.finish()
    secret_value = api_key.value
    return StripeRefundAdapter(name=name, base_url=lambda: str(base_url()),
                               api_key=lambda: secret_value, capabilities=capabilities,
                               fields=names)
