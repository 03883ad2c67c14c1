"""The generic HTTP/JSON connector, configured per tool in the catalogue (no Python per API).

The classification is the whole point of this module. A failed connect means the request never
left; anything that fails after the first byte may have been sent — a timeout proves only that
no answer arrived — so it is Unknown, never Rejected. What a status code means is the tool's
setting (`rejection_statuses`, `in_progress_statuses`, `rate_limit_statuses`); a 4xx that the
catalogue lists in none of them, when it lists rejections explicitly, is Unknown (fail safe).

A tool's connector settings (see README, "Guard your own tool"):
    base_url, headers (secrets only as env:NAME), idempotency_header (default Idempotency-Key,
    "" for none), key_retention_seconds, lookup_consistency_seconds, lookup_authoritative,
    [send]   method, url (template), body (template), status lists, reference / result pointers
    [lookup] by_provider_reference / by_key / by_reference (URL templates), items, id, status,
             succeeded / pending values, fields (intent field or `reference` → JSON Pointer)
Templates take {operation_id}, {key}, {provider_reference}, {tool}, {params.NAME}; a body string
that is exactly one placeholder keeps the value's JSON type, and "{params}" is every param.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, urlsplit

import httpx

from ledger import metrics
from ledger.providers import transport
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
from ledger.providers.config import ConnectorConfigError, Secret, SettingsReader, resolve_env

if TYPE_CHECKING:
    from ledger.models import Operation

logger = logging.getLogger(__name__)

DAY = 24 * 3600
MAX_RETRY_AFTER_SECONDS = 3600.0
# Header names whose value is a credential: the catalogue must reference them (env:NAME).
_SECRET_HEADER = re.compile(r"(?i)authorization|cookie|.*(key|token|secret|password).*")

# Errors raised before a single byte of the request could have been written.
_NOT_SENT_ERRORS: tuple[type[Exception], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
)


def classify_transport_error(exc: Exception) -> SendOutcome:
    """An httpx error (the Stripe SDK's transport, a proxied call) or one of
    ledger.providers.transport's, which carry the same names."""
    name = type(exc).__name__
    if isinstance(exc, transport.TransportError):
        sent, timeout = exc.may_have_been_sent, isinstance(exc, transport.TIMEOUTS)
    else:
        sent = not isinstance(exc, _NOT_SENT_ERRORS)
        timeout = isinstance(exc, httpx.TimeoutException)
    if not sent:
        return NotSent(error_class=f"transport.{name}")
    # WriteTimeout, ReadTimeout, RemoteProtocolError, ReadError, WriteError: may have been sent.
    reason = UnknownReason.TIMEOUT_AFTER_SEND if timeout else UnknownReason.CONNECTION_RESET
    return Unknown(error_class=f"transport.{name}", reason=reason)


# What the connector's calls raise: the lean transport's errors, or httpx's on its path.
TRANSPORT_ERRORS = (transport.TransportError, httpx.HTTPError)


# --- JSON Pointer (RFC 6901) -------------------------------------------------------------------

MISSING: Any = object()


def check_pointer(key: str, pointer: Any) -> str:
    if not isinstance(pointer, str) or (pointer and not pointer.startswith("/")):
        raise ConnectorConfigError(key, "must be a JSON Pointer (\"\" or starting with /)")
    return pointer


def resolve_pointer(document: Any, pointer: str) -> Any:
    """The value at `pointer`, or MISSING."""
    if pointer == "":
        return document
    node = document
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping):
            if token not in node:
                return MISSING
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return MISSING
    return node


# --- templates ---------------------------------------------------------------------------------

_PLACEHOLDER = re.compile(r"\{([a-z_]+(?:\.[A-Za-z0-9_-]+)?)\}")
_SIMPLE_NAMES = frozenset({"operation_id", "key", "provider_reference", "tool", "params",
                           "intent"})


def check_template(key: str, text: str, properties: Collection[str]) -> None:
    for name in _PLACEHOLDER.findall(text):
        if name.startswith("params."):
            if name.removeprefix("params.") not in properties:
                raise ConnectorConfigError(key, f"{{{name}}} names no property of the schema")
        elif name not in _SIMPLE_NAMES:
            raise ConnectorConfigError(key, f"unknown placeholder {{{name}}}")


def _check_body(key: str, template: Any, properties: Collection[str]) -> None:
    if isinstance(template, str):
        check_template(key, template, properties)
    elif isinstance(template, Mapping):
        for name, value in template.items():
            _check_body(f"{key}.{name}", value, properties)
    elif isinstance(template, list):
        for index, value in enumerate(template):
            _check_body(f"{key}[{index}]", value, properties)
    elif isinstance(template, float):
        raise ConnectorConfigError(key, "floats are not allowed (money is integers)")


def _variables(operation: Operation, key: str) -> dict[str, Any]:
    return {"operation_id": operation.operation_id, "key": key,
            "provider_reference": operation.provider_request_id, "tool": operation.tool,
            "params": dict(operation.params), "intent": dict(operation.intent_params)}


def _lookup_variable(variables: Mapping[str, Any], name: str) -> Any:
    if name.startswith("params."):
        return variables["params"].get(name.removeprefix("params."), MISSING)
    return variables.get(name, MISSING)


def render_url(template: str, variables: Mapping[str, Any]) -> str:
    def one(match: re.Match[str]) -> str:
        value = _lookup_variable(variables, match.group(1))
        return "" if value is MISSING or value is None else quote(str(value), safe="")

    return _PLACEHOLDER.sub(one, template)


def render_body(template: Any, variables: Mapping[str, Any]) -> Any:
    if isinstance(template, str):
        whole = _PLACEHOLDER.fullmatch(template)
        if whole:
            return _lookup_variable(variables, whole.group(1))
        return _PLACEHOLDER.sub(
            lambda m: "" if (v := _lookup_variable(variables, m.group(1))) is MISSING
            else str(v), template)
    if isinstance(template, Mapping):
        rendered = {name: render_body(value, variables) for name, value in template.items()}
        return {name: value for name, value in rendered.items() if value is not MISSING}
    if isinstance(template, list):
        return [item for item in (render_body(v, variables) for v in template)
                if item is not MISSING]
    return template


# --- classification ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ResponseRules:
    """What the provider's status codes and bodies mean. The defaults are the IETF
    Idempotency-Key draft's conventions, which the sandbox's generic API follows."""

    # None: every 4xx that is not in progress, rate limited or a key mismatch.
    rejection_statuses: frozenset[int] | None = None
    in_progress_statuses: frozenset[int] = frozenset({409})
    rate_limit_statuses: frozenset[int] = frozenset({429})
    # A key reused with other params (the original may have executed): status + body marker.
    key_mismatch_status: int | None = 422
    key_mismatch_pointer: str = "/error/type"
    key_mismatch_value: str = "idempotency_error"
    reference_pointer: str = "/id"
    result_pointer: str = ""
    error_code_pointers: tuple[str, ...] = ("/error/code", "/error/type")


DEFAULT_RULES = ResponseRules()


class ProviderResponse(Protocol):
    """What classification reads of an answer: transport.Response or an httpx.Response."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Any: ...  # case-insensitive .get()

    def json(self) -> Any: ...


def retry_after_seconds(response: ProviderResponse) -> float | None:
    raw = response.headers.get("Retry-After", "").strip()
    if not raw:
        return None
    if raw.isdigit():
        return min(float(raw), MAX_RETRY_AFTER_SECONDS)
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, min(when.timestamp() - time.time(), MAX_RETRY_AFTER_SECONDS))


def _error_code(body: Any, status: int, rules: ResponseRules) -> str:
    for pointer in rules.error_code_pointers:
        value = resolve_pointer(body, pointer)
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value):
            # A code is the provider's short token; anything else is not trusted into records.
            text = str(value)
            return text if re.fullmatch(r"[A-Za-z0-9_.-]{1,60}", text) else "unrecognised"
    return str(status)


def classify_response(response: ProviderResponse, rules: ResponseRules = DEFAULT_RULES
                      ) -> SendOutcome:
    status = response.status_code
    body = _json_or_empty(response)
    if 200 <= status < 300:
        reference = resolve_pointer(body, rules.reference_pointer)
        result = resolve_pointer(body, rules.result_pointer)
        return Confirmed(
            result=result if isinstance(result, dict) else {"value": None if result is MISSING
                                                            else result},
            provider_request_id=str(reference if reference not in (MISSING, None, "")
                                    else response.headers.get("Request-Id", "")),
            replayed=response.headers.get("Idempotent-Replayed", "").lower() == "true",
        )
    code = _error_code(body, status, rules)
    if status in rules.in_progress_statuses:
        # The provider is still executing the original request with this key.
        return Unknown(error_class=f"http_{status}.{code}",
                       reason=UnknownReason.PROVIDER_IN_PROGRESS)
    if status == rules.key_mismatch_status and resolve_pointer(
            body, rules.key_mismatch_pointer) == rules.key_mismatch_value:
        # Our key was already used with other params: the original may have executed.
        return Unknown(error_class=f"http_{status}.{code}", reason=UnknownReason.KEY_REUSED)
    if status in rules.rate_limit_statuses:
        # Refused before executing anything; a same-key retry after Retry-After is safe.
        return NotSent(error_class=f"http_{status}.rate_limited",
                       retry_after_seconds=retry_after_seconds(response))
    if 400 <= status < 500 and (rules.rejection_statuses is None
                                or status in rules.rejection_statuses):
        return Rejected(error_class=f"http_{status}.{code}", detail={"code": code})
    reason = UnknownReason.AMBIGUOUS_5XX if status >= 500 else UnknownReason.AMBIGUOUS_RESPONSE
    return Unknown(error_class=f"http_{status}.{code}", reason=reason)


def _json_or_empty(response: ProviderResponse) -> Any:
    try:
        return response.json()
    except ValueError:
        return {}


# --- the connector's settings ------------------------------------------------------------------

@dataclass(frozen=True)
class SendSpec:
    method: str
    url: str
    body: Any
    rules: ResponseRules


@dataclass(frozen=True)
class LookupSpec:
    by_provider_reference: str | None
    by_key: str | None
    by_reference: str | None
    items: str
    id: str
    status: str
    succeeded: frozenset[str]
    pending: frozenset[str]
    # Name in the intent (or `reference`, our operation ID) → where the provider says it.
    fields: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ConnectorContext:
    """What the catalogue tells a connector about the tool it serves (never the registry)."""

    tool: str
    properties: frozenset[str]
    intent_fields: tuple[str, ...]


_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE", "GET"})


def _send_spec(reader: SettingsReader, context: ConnectorContext) -> SendSpec:
    method = reader.string("method", "POST").upper()
    if method not in _METHODS:
        raise ConnectorConfigError(reader.key("method"), f"must be one of {sorted(_METHODS)}")
    url = reader.string("url")
    check_template(reader.key("url"), url, context.properties)
    body = reader.raw("body", {"reference": "{operation_id}", "params": "{params}"})
    _check_body(reader.key("body"), body, context.properties)
    rejection = (reader.int_list("rejection_statuses", ())
                 if reader.has("rejection_statuses") else None)
    if not reader.has("rejection_statuses"):
        reader.raw("rejection_statuses")
    mismatch = reader.table("key_mismatch")
    rules = ResponseRules(
        rejection_statuses=rejection,
        in_progress_statuses=reader.int_list("in_progress_statuses", (409,)),
        rate_limit_statuses=reader.int_list("rate_limit_statuses", (429,)),
        reference_pointer=check_pointer(reader.key("reference_pointer"),
                                        reader.raw("reference_pointer", "/id")),
        result_pointer=check_pointer(reader.key("result_pointer"),
                                     reader.raw("result_pointer", "")),
    )
    if mismatch is not None:
        rules = _with_mismatch(rules, mismatch)
    reader.finish()
    overlap = (rules.rejection_statuses or frozenset()) & (
        rules.in_progress_statuses | rules.rate_limit_statuses)
    if overlap:
        raise ConnectorConfigError(reader.key("rejection_statuses"),
                                   f"{sorted(overlap)} also listed as in progress or rate limit")
    return SendSpec(method=method, url=url, body=body, rules=rules)


def _with_mismatch(rules: ResponseRules, reader: SettingsReader) -> ResponseRules:
    status = reader.integer("status", minimum=400)
    pointer = check_pointer(reader.key("pointer"), reader.raw("pointer", "/error/type"))
    value = reader.string("equals")
    reader.finish()
    return ResponseRules(**{**rules.__dict__, "key_mismatch_status": status,
                            "key_mismatch_pointer": pointer, "key_mismatch_value": value})


def _lookup_spec(reader: SettingsReader, context: ConnectorContext) -> LookupSpec:
    urls = {}
    for name in ("by_provider_reference", "by_key", "by_reference"):
        url = reader.optional_string(name)
        if url is not None:
            check_template(reader.key(name), url, context.properties)
        urls[name] = url
    if not any(urls.values()):
        raise ConnectorConfigError(reader.key("by_key"),
                                   "a lookup needs by_provider_reference, by_key or by_reference")
    fields_raw = reader.string_table("fields")
    for name, pointer in fields_raw.items():
        check_pointer(reader.key(f"fields.{name}"), pointer)
        if name != "reference" and name not in context.intent_fields:
            raise ConnectorConfigError(reader.key(f"fields.{name}"), "is not an intent field")
    missing = [name for name in (*context.intent_fields, "reference") if name not in fields_raw]
    if missing:
        raise ConnectorConfigError(
            reader.key("fields"),
            f"must say where the provider holds {', '.join(missing)} (every intent field and "
            "`reference` is verified before a lookup may prove anything)")
    succeeded = reader.raw("succeeded", ["succeeded"])
    pending = reader.raw("pending", ["pending", "processing", "in_progress"])
    for name, values in (("succeeded", succeeded), ("pending", pending)):
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ConnectorConfigError(reader.key(name), "must be a list of strings")
    spec = LookupSpec(
        by_provider_reference=urls["by_provider_reference"], by_key=urls["by_key"],
        by_reference=urls["by_reference"],
        items=check_pointer(reader.key("items"), reader.raw("items", "/data")),
        id=check_pointer(reader.key("id"), reader.raw("id", "/id")),
        status=check_pointer(reader.key("status"), reader.raw("status", "/status")),
        succeeded=frozenset(succeeded), pending=frozenset(pending),
        fields=tuple(sorted(fields_raw.items())),
    )
    reader.finish()
    return spec


@dataclass(frozen=True)
class HttpSettings:
    base_url: Callable[[], Any]
    headers: tuple[tuple[str, str | Secret], ...] = field(repr=False)
    idempotency_header: str
    send: SendSpec | None
    lookup: LookupSpec | None


def build_http(reader: SettingsReader, context: ConnectorContext, *, name: str
               ) -> HttpJsonConnector:
    base_url = reader.address("base_url")
    headers: list[tuple[str, str | Secret]] = []
    for header, value in reader.string_table("headers").items():
        key = reader.key(f"headers.{header}")
        if value.startswith("env:"):
            headers.append((header, resolve_env(key, value)))
        elif _SECRET_HEADER.fullmatch(header):
            raise ConnectorConfigError(
                key, "a credential header must be a reference to an environment variable "
                     "(env:NAME), never the value itself")
        else:
            headers.append((header, value))
    idempotency_header = reader.string("idempotency_header", "Idempotency-Key")
    send_reader = reader.table("send")
    lookup_reader = reader.table("lookup")
    send = _send_spec(send_reader, context) if send_reader is not None else None
    lookup = _lookup_spec(lookup_reader, context) if lookup_reader is not None else None
    if lookup is not None and lookup.by_key and not idempotency_header:
        raise ConnectorConfigError(reader.key("lookup.by_key"),
                                   "needs an idempotency_header (keys are what it looks up)")
    retention = reader.integer("key_retention_seconds", DAY) if idempotency_header else None
    if not idempotency_header:
        reader.raw("key_retention_seconds")
    capabilities = Capabilities(
        honours_idempotency_keys=bool(idempotency_header) and send is not None,
        key_retention_seconds=retention,
        lookup_by_request_id=bool(lookup and lookup.by_provider_reference),
        lookup_by_key=bool(lookup and lookup.by_key),
        lookup_by_reference=bool(lookup and lookup.by_reference),
        lookup_consistency_seconds=reader.number("lookup_consistency_seconds", 30.0),
        authoritative_absence=reader.boolean("lookup_authoritative", True),
        can_send=send is not None,
    )
    reader.finish()
    if send is None and lookup is None:
        raise ConnectorConfigError(reader.key("send"), "declare [send], [lookup] or both")
    return HttpJsonConnector(
        name=name, capabilities=capabilities,
        settings=HttpSettings(base_url=base_url, headers=tuple(headers),
                              idempotency_header=idempotency_header, send=send, lookup=lookup))


# --- the connector -----------------------------------------------------------------------------

class HttpJsonConnector:
    """Sends one request per attempt with the operation's key; looks up by the provider's
    reference, by key or by our reference, and reads the fields the reconciler verifies.

    Calls go out over ledger.providers.transport (kept-alive http.client connections); through
    httpx instead when an environment proxy applies to the base URL (HTTP_PROXY, HTTPS_PROXY,
    ALL_PROXY, NO_PROXY, which httpx honours) or when a test hands in an httpx transport."""

    def __init__(self, *, name: str, capabilities: Capabilities, settings: HttpSettings,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.name = name
        self.capabilities = capabilities
        self.settings = settings
        self._transport = transport
        # Per process and base URL: None for the lean transport, else the httpx client.
        self._clients: dict[tuple[int, str], httpx.Client | None] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"HttpJsonConnector({self.name!r})"

    def _client(self, base_url: str) -> httpx.Client | None:
        """None: the lean transport. Otherwise one pooled httpx client per process and base
        URL (building one per call costs more than the call; keyed by pid because a forked
        Celery child must not share its parent's sockets)."""
        key = (os.getpid(), base_url)
        try:
            return self._clients[key]
        except KeyError:
            pass
        with self._lock:
            if key not in self._clients:
                self._clients[key] = (
                    httpx.Client(
                        base_url=base_url,
                        transport=self._transport,
                        headers={"User-Agent": transport.USER_AGENT},
                        limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
                    )
                    if self._transport is not None or _proxied(base_url) else None)
            return self._clients[key]

    def _headers(self, key: str | None) -> dict[str, str]:
        headers = {name: value.value if isinstance(value, Secret) else value
                   for name, value in self.settings.headers}
        if key is not None and self.settings.idempotency_header:
            headers[self.settings.idempotency_header] = key
        return headers

    def _call(self, method: str, url: str, *, json_body: Any, headers: dict[str, str],
              timeout: float) -> ProviderResponse:
        """One request; raises one of TRANSPORT_ERRORS."""
        base_url = str(self.settings.base_url())
        connect = min(timeout, 3.0)
        client = self._client(base_url)
        if client is not None:
            return client.request(method, url, json=json_body, headers=headers,
                                  timeout=httpx.Timeout(timeout, connect=connect))
        body = None
        sent_headers = {"User-Agent": transport.USER_AGENT, "Accept": "*/*", **headers}
        if json_body is not None:
            # As httpx's json= encodes it: compact, UTF-8, no NaN.
            body = json.dumps(json_body, ensure_ascii=False, separators=(",", ":"),
                              allow_nan=False).encode()
            sent_headers["Content-Type"] = "application/json"
        return transport.request(method, transport.join(base_url, url), body=body,
                                 headers=sent_headers, timeout=timeout,
                                 connect_timeout=connect)

    def send(self, operation: Operation, *, key: str, timeout: float) -> SendOutcome:
        spec = self.settings.send
        if spec is None:
            # A lookup-only connector: the client executes; the executor never gets here.
            return NotSent(error_class="connector.send_not_configured")
        variables = _variables(operation, key)
        started = time.perf_counter()
        try:
            response = self._call(
                spec.method, render_url(spec.url, variables),
                json_body=render_body(spec.body, variables) if spec.method != "GET" else None,
                headers=self._headers(key), timeout=timeout)
        except TRANSPORT_ERRORS as exc:
            outcome = classify_transport_error(exc)
        else:
            outcome = classify_response(response, spec.rules)
        finally:
            elapsed = time.perf_counter() - started
            metrics.PROVIDER_LATENCY.labels(self.name, "send").observe(elapsed)
        logger.info(
            "provider send",
            extra={"operation_id": operation.operation_id, "provider": self.name,
                   "outcome": type(outcome).__name__},
        )
        return outcome

    def lookup_query(self, operation: Operation) -> dict[str, str]:
        spec = self.settings.lookup
        query: dict[str, str] = {}
        if spec is None:
            return query
        if spec.by_provider_reference and operation.provider_request_id:
            query["provider_reference"] = operation.provider_request_id
        if spec.by_key and self.capabilities.honours_idempotency_keys:
            query["idempotency_key"] = operation.idempotency_key
        elif spec.by_reference:
            query["reference"] = operation.operation_id
        return query

    def lookup(self, operation: Operation, *, timeout: float) -> LookupOutcome:
        spec = self.settings.lookup
        if spec is None:
            return Unavailable(error_class="lookup_not_supported")
        started = time.perf_counter()
        try:
            return self._lookup(spec, operation, timeout)
        except TRANSPORT_ERRORS as exc:
            return Unavailable(error_class=f"transport.{type(exc).__name__}")
        finally:
            metrics.PROVIDER_LATENCY.labels(self.name, "lookup").observe(
                time.perf_counter() - started)

    def _get(self, url: str, timeout: float) -> ProviderResponse:
        return self._call("GET", url, json_body=None, headers=self._headers(None),
                          timeout=timeout)

    def _lookup(self, spec: LookupSpec, operation: Operation,
                timeout: float) -> LookupOutcome:
        variables = _variables(operation, operation.idempotency_key)
        if spec.by_provider_reference and operation.provider_request_id:
            response = self._get(render_url(spec.by_provider_reference, variables), timeout)
            if response.status_code == 200:
                return self._found(spec, [_json_or_empty(response)])
            if response.status_code != 404:
                return Unavailable(error_class=f"http_{response.status_code}")
        if spec.by_key and self.capabilities.honours_idempotency_keys:
            url = spec.by_key
        elif spec.by_reference:
            url = spec.by_reference
        else:
            return Unavailable(error_class="lookup_not_supported")
        response = self._get(render_url(url, variables), timeout)
        if response.status_code == 404:
            return NotFound()
        if response.status_code != 200:
            return Unavailable(error_class=f"http_{response.status_code}")
        items = resolve_pointer(_json_or_empty(response), spec.items)
        if not isinstance(items, list):
            return Unavailable(error_class="lookup.malformed")
        return self._found(spec, [item for item in items if isinstance(item, dict)])

    @staticmethod
    def _found(spec: LookupSpec, items: list[Any]) -> LookupOutcome:
        if not items:
            return NotFound()
        # Oldest first is not guaranteed by every API: more than one is an anomaly anyway.
        first = items[0]
        fields = {name: (None if (v := resolve_pointer(first, pointer)) is MISSING else v)
                  for name, pointer in spec.fields}
        status = resolve_pointer(first, spec.status) if spec.status else "succeeded"
        if not isinstance(status, str):
            status = "" if status is MISSING else "unrecognised"
        elif status in spec.succeeded:
            status = "succeeded"
        elif status in spec.pending:
            status = "pending"
        reference = resolve_pointer(first, spec.id)
        return Found(fields=fields,
                     provider_request_id="" if reference is MISSING else str(reference),
                     status=status, matches=len(items),
                     raw=first if isinstance(first, dict) else {})


def _proxied(base_url: str) -> bool:
    """Whether an environment proxy applies to this base URL (read as httpx reads it, once per
    process and base URL)."""
    proxies = urllib.request.getproxies_environment()
    parts = urlsplit(base_url)
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    bypassed: bool = urllib.request.proxy_bypass_environment(  # type: ignore[attr-defined]
        parts.hostname or "", proxies)
    return not bypassed
