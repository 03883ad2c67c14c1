"""A generic HTTP adapter that speaks the IETF Idempotency-Key header convention.

The classification is the whole point of this module. A failed connect means the request never
left; anything that fails after the first byte may have been sent — a timeout proves only that
no answer arrived — so it is Unknown, never Rejected.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httpx

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

if TYPE_CHECKING:
    from ledger.models import Operation

logger = logging.getLogger(__name__)

# Errors raised before a single byte of the request could have been written.
_NOT_SENT_ERRORS: tuple[type[Exception], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
)


def classify_transport_error(exc: Exception) -> SendOutcome:
    name = type(exc).__name__
    if isinstance(exc, _NOT_SENT_ERRORS):
        return NotSent(error_class=f"transport.{name}")
    # WriteTimeout, ReadTimeout, RemoteProtocolError, ReadError, WriteError: may have been sent.
    reason = (UnknownReason.TIMEOUT_AFTER_SEND if isinstance(exc, httpx.TimeoutException)
              else UnknownReason.CONNECTION_RESET)
    return Unknown(error_class=f"transport.{name}", reason=reason)


def classify_response(response: httpx.Response) -> SendOutcome:
    status = response.status_code
    body = _json_or_empty(response)
    if 200 <= status < 300:
        return Confirmed(
            result=body,
            provider_request_id=str(body.get("id") or response.headers.get("Request-Id", "")),
            replayed=response.headers.get("Idempotent-Replayed", "").lower() == "true",
        )
    raw_error = body.get("error")
    error: dict[str, Any] = raw_error if isinstance(raw_error, dict) else {}
    code = str(error.get("code") or error.get("type") or status)
    if status == 409:
        # The provider is still executing the original request with this key.
        return Unknown(error_class=f"http_409.{code}", reason=UnknownReason.PROVIDER_IN_PROGRESS)
    if status == 422 and error.get("type") == "idempotency_error":
        # Our key was already used with other params: the original may have executed.
        return Unknown(error_class=f"http_422.{code}", reason=UnknownReason.KEY_REUSED)
    if status == 429:
        return NotSent(error_class="http_429.rate_limited")
    if 400 <= status < 500:
        return Rejected(error_class=f"http_{status}.{code}", detail={"code": code})
    reason = UnknownReason.AMBIGUOUS_5XX if status >= 500 else UnknownReason.AMBIGUOUS_RESPONSE
    return Unknown(error_class=f"http_{status}.{code}", reason=reason)


def _json_or_empty(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


class IdempotentHttpAdapter:
    """POST {base}/v1/effects/{kind} with an Idempotency-Key; look up by id, key or reference."""

    def __init__(
        self,
        *,
        name: str,
        base_url: Callable[[], str],
        capabilities: Capabilities,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.name = name
        self._base_url = base_url
        self.capabilities = capabilities
        self._transport = transport
        self._clients: dict[tuple[int, str], httpx.Client] = {}
        self._lock = threading.Lock()

    def _client(self) -> httpx.Client:
        """One pooled client per process and base URL: building a client (and its TLS context)
        per call costs more than the call. Keyed by pid because a forked Celery child must not
        share its parent's sockets."""
        key = (os.getpid(), self._base_url())
        client = self._clients.get(key)
        if client is None:
            with self._lock:
                client = self._clients.get(key)
                if client is None:
                    client = httpx.Client(
                        base_url=key[1],
                        transport=self._transport,
                        headers={"User-Agent": "agent-ledger/1"},
                        limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
                    )
                    self._clients[key] = client
        return client

    @staticmethod
    def _timeout(timeout: float) -> httpx.Timeout:
        return httpx.Timeout(timeout, connect=min(timeout, 3.0))

    def send(self, operation: Operation, *, key: str, timeout: float) -> SendOutcome:
        from ledger.tools import get_tool

        kind = get_tool(operation.tool).provider_kind
        headers = {"Idempotency-Key": key} if self.capabilities.honours_idempotency_keys else {}
        body = {"reference": operation.operation_id, "params": operation.params}
        started = time.perf_counter()
        try:
            response = self._client().post(f"/v1/effects/{kind}", json=body, headers=headers,
                                           timeout=self._timeout(timeout))
        except httpx.HTTPError as exc:
            outcome = classify_transport_error(exc)
        else:
            outcome = classify_response(response)
        finally:
            elapsed = time.perf_counter() - started
            metrics.PROVIDER_LATENCY.labels(self.name, "send").observe(elapsed)
        logger.info(
            "provider send",
            extra={"operation_id": operation.operation_id, "provider": self.name,
                   "outcome": type(outcome).__name__},
        )
        return outcome

    def lookup(self, operation: Operation, *, timeout: float) -> LookupOutcome:
        started = time.perf_counter()
        try:
            return self._lookup(self._client(), operation, self._timeout(timeout))
        except httpx.HTTPError as exc:
            return Unavailable(error_class=f"transport.{type(exc).__name__}")
        finally:
            metrics.PROVIDER_LATENCY.labels(self.name, "lookup").observe(
                time.perf_counter() - started
            )

    def lookup_query(self, operation: Operation) -> dict[str, str]:
        caps = self.capabilities
        query: dict[str, str] = {}
        if caps.lookup_by_request_id and operation.provider_request_id:
            query["effect_id"] = operation.provider_request_id
        if caps.lookup_by_key and caps.honours_idempotency_keys:
            query["idempotency_key"] = operation.idempotency_key
        elif caps.lookup_by_reference:
            query["reference"] = operation.operation_id
        return query

    def _lookup(
        self, client: httpx.Client, operation: Operation, timeout: httpx.Timeout
    ) -> LookupOutcome:
        caps = self.capabilities
        if caps.lookup_by_request_id and operation.provider_request_id:
            response = client.get(f"/v1/effects/{operation.provider_request_id}",
                                  timeout=timeout)
            if response.status_code == 200:
                return _found([response.json()])
            if response.status_code != 404:
                return Unavailable(error_class=f"http_{response.status_code}")
        if caps.lookup_by_key and caps.honours_idempotency_keys:
            query = {"idempotency_key": operation.idempotency_key}
        elif caps.lookup_by_reference:
            query = {"reference": operation.operation_id}
        else:
            return Unavailable(error_class="lookup_not_supported")
        response = client.get("/v1/effects", params=query, timeout=timeout)
        if response.status_code != 200:
            return Unavailable(error_class=f"http_{response.status_code}")
        return _found(_json_or_empty(response).get("data") or [])


def _found(effects: list[dict[str, Any]]) -> LookupOutcome:
    if not effects:
        return NotFound()
    first = effects[0]
    return Found(
        fields=dict(first.get("params") or {}) | {"reference": first.get("reference")},
        provider_request_id=str(first.get("id", "")),
        status=str(first.get("status", "")),
        matches=len(effects),
        raw=first,
    )
