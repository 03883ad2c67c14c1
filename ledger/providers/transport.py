"""A lean pooled HTTP/1.1 client for the generic connector's calls to providers.

httpx cost about two thirds of a millisecond of CPU per call more than the standard library's
http.client (URL objects, header models, h11's event machine) — a fifth of the web process's
CPU for a fresh action (bench/README.md). This module keeps what the connector needs and no
more: kept-alive connections per origin and process, connect and read/write timeouts, TLS with
certificate verification, and errors that say whether the request can have left.

Every failure is raised as a TransportError whose class name is the vocabulary the ledger
records (`transport.ConnectError`, `transport.ReadTimeout`, … — httpx's names, so records and
dashboards read the same) and whose `may_have_been_sent` is the only thing the classification
trusts: False only while connecting (no byte of the request written yet), True from the first
byte written on.

A kept-alive connection the provider closed while it sat idle is noticed before it is reused
(the socket is readable: end of file or stray bytes) and replaced, so a provider's keep-alive
timeout does not turn into an ambiguous outcome. Connections through a proxy are not this
module's job: the connector sends those through httpx (HTTP(S)_PROXY / NO_PROXY, as before).
"""

from __future__ import annotations

import http.client
import json
import os
import select
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any
from urllib.parse import urlsplit

# Idle kept-alive connections per origin and process (more are opened when needed).
MAX_IDLE = 16
# The largest response body read; a larger one is a protocol error (its outcome unknown).
MAX_BODY_BYTES = 8 * 1024 * 1024
USER_AGENT = "agent-ledger/1"


class TransportError(Exception):
    may_have_been_sent = True


class ConnectError(TransportError):
    may_have_been_sent = False


class ConnectTimeout(TransportError):
    may_have_been_sent = False


class UnsupportedProtocol(TransportError):
    may_have_been_sent = False


class InvalidRequest(TransportError):
    """Refused by http.client before a byte was written (a URL or header value it will not
    put on the wire)."""

    may_have_been_sent = False


class WriteTimeout(TransportError):
    pass


class WriteError(TransportError):
    pass


class ReadTimeout(TransportError):
    pass


class ReadError(TransportError):
    pass


class RemoteProtocolError(TransportError):
    pass


TIMEOUTS = (ConnectTimeout, WriteTimeout, ReadTimeout)


@dataclass(frozen=True)
class Response:
    """What the connector reads of an answer: httpx.Response's names for the same things."""

    status_code: int
    headers: http.client.HTTPMessage  # .get() is case-insensitive
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int


def split(url: str) -> tuple[Origin, str]:
    """The origin and the request target (path and query) of an absolute URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsupportedProtocol(f"not an http(s) URL: {parts.scheme or '(none)'}://")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = parts.path or "/"
    if parts.query:
        target = f"{target}?{parts.query}"
    return Origin(parts.scheme, parts.hostname, port), target


def join(base_url: str, url: str) -> str:
    """`url` against the connector's base URL as httpx's base_url joins it: an absolute URL as
    it is, anything else appended to the base's path."""
    if urlsplit(url).scheme:
        return url
    return f"{base_url.rstrip('/')}/{url.lstrip('/')}"


@cache
def _tls_context() -> ssl.SSLContext:
    """ssl's client defaults (hostname checked, certificate verified) with the system's trust
    store, which SSL_CERT_FILE / SSL_CERT_DIR override; where the system has none (a slim
    image without ca-certificates), certifi's bundle, as httpx used."""
    context = ssl.create_default_context()
    if not context.cert_store_stats()["x509_ca"]:
        try:
            import certifi
        except ImportError:
            return context
        context.load_verify_locations(cafile=certifi.where())
    return context


class Pool:
    """Kept-alive connections to one origin, for one process (a forked worker builds its own:
    the pool is looked up by pid)."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _checkout(self) -> http.client.HTTPConnection | None:
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn = self._idle.pop()
            if _still_open(conn):
                return conn
            conn.close()

    def _checkin(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def _connect(self, connect_timeout: float) -> http.client.HTTPConnection:
        origin = self.origin
        conn: http.client.HTTPConnection
        if origin.scheme == "https":
            conn = http.client.HTTPSConnection(origin.host, origin.port, timeout=connect_timeout,
                                               context=_tls_context())
        else:
            conn = http.client.HTTPConnection(origin.host, origin.port, timeout=connect_timeout)
        try:
            conn.connect()  # TCP, and the TLS handshake: nothing of the request is written yet
        except TimeoutError as exc:
            conn.close()
            raise ConnectTimeout(str(exc) or "timed out connecting") from exc
        except (OSError, ssl.SSLError, ssl.CertificateError) as exc:
            conn.close()
            raise ConnectError(str(exc) or type(exc).__name__) from exc
        return conn

    def request(self, method: str, target: str, *, body: bytes | None,
                headers: Mapping[str, str], timeout: float, connect_timeout: float
                ) -> Response:
        conn = self._checkout() or self._connect(connect_timeout)
        assert conn.sock is not None
        conn.sock.settimeout(timeout)
        try:
            try:
                conn.request(method, target, body=body, headers=headers)
            except (http.client.InvalidURL, ValueError) as exc:
                raise InvalidRequest(str(exc)) from exc
            except TimeoutError as exc:
                raise WriteTimeout(str(exc) or "timed out writing") from exc
            except OSError as exc:
                raise WriteError(str(exc) or type(exc).__name__) from exc
            try:
                answer = conn.getresponse()
                content = _read_body(answer)
            except TimeoutError as exc:
                raise ReadTimeout(str(exc) or "timed out reading") from exc
            except http.client.HTTPException as exc:  # RemoteDisconnected, BadStatusLine, …
                raise RemoteProtocolError(str(exc) or type(exc).__name__) from exc
            except OSError as exc:
                raise ReadError(str(exc) or type(exc).__name__) from exc
        except BaseException:
            conn.close()
            raise
        if answer.will_close:
            conn.close()
        else:
            self._checkin(conn)
        return Response(status_code=answer.status, headers=answer.headers, content=content)


def _read_body(answer: http.client.HTTPResponse) -> bytes:
    """The whole body, or an error: a body shorter than its Content-Length or a truncated chunk
    raises IncompleteRead (never a short body taken for the answer); larger than
    MAX_BODY_BYTES raises RemoteProtocolError."""
    if answer.length is not None:
        if answer.length > MAX_BODY_BYTES:
            raise RemoteProtocolError(f"response body larger than {MAX_BODY_BYTES} bytes")
        return answer.read()
    parts: list[bytes] = []
    size = 0
    while chunk := answer.read(65536):  # chunked, or until the provider closes
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise RemoteProtocolError(f"response body larger than {MAX_BODY_BYTES} bytes")
        parts.append(chunk)
    return b"".join(parts)


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """An idle connection is usable only if its socket has nothing to read: readable means the
    provider closed it (end of file) or sent something unasked."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


_pools: dict[tuple[int, Origin], Pool] = {}
_pools_lock = threading.Lock()


def pool_for(origin: Origin) -> Pool:
    key = (os.getpid(), origin)
    pool = _pools.get(key)
    if pool is None:
        with _pools_lock:
            pool = _pools.get(key)
            if pool is None:
                pool = _pools[key] = Pool(origin)
    return pool


def request(method: str, url: str, *, body: bytes | None = None,
            headers: Mapping[str, str], timeout: float, connect_timeout: float) -> Response:
    """One request to an absolute http(s) URL over this process's kept-alive connections."""
    origin, target = split(url)
    return pool_for(origin).request(method, target, body=body, headers=headers,
                                    timeout=timeout, connect_timeout=connect_timeout)
