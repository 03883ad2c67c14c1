"""The generic connector's own HTTP transport (ledger.providers.transport), against real sockets:
what can have left decides NotSent versus Unknown, kept-alive connections are reused only while
they are open, TLS is verified, and a proxy from the environment is honoured (through httpx)."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import pytest

from ledger.providers import transport
from ledger.providers.base import Confirmed, NotSent, Unknown, UnknownReason
from ledger.providers.http import classify_transport_error
from ledger.tools import get_tool
from tests.ledger.factories import in_state

BODY = b'{"id": "eff_1", "ok": 1}'
OK = (b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
      b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
OK_CLOSE = OK.replace(b"Content-Length", b"Connection: close\r\nContent-Length")


class Provider:
    """A provider on a real socket whose every connection is handled by `behaviour(conn)`;
    records the connections accepted and the requests read."""

    def __init__(self, behaviour: Callable[[Provider, socket.socket], None],
                 wrap: ssl.SSLContext | None = None) -> None:
        self.behaviour = behaviour
        self.wrap = wrap
        self.connections = 0
        self.requests: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"{'https' if wrap else 'http'}://127.0.0.1:{self.listener.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        self._open: list[socket.socket] = []
        self._stop = threading.Event()
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        self.listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            self._open.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.wrap is not None:
                conn = self.wrap.wrap_socket(conn, server_side=True)
                self._open.append(conn)
            self.behaviour(self, conn)
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()

    def read_request(self, conn: socket.socket) -> bytes | None:
        """One request (headers and a Content-Length body), or None at end of file."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += conn.recv(65536)
        self.requests.append(data)
        return data

    def wait_until_served(self, connections: int, timeout: float = 10.0) -> None:
        """Until `connections` connections were accepted and each one's handler has returned."""
        deadline = time.monotonic() + timeout
        while len(self._threads) < connections or any(t.is_alive() for t in self._threads):
            assert time.monotonic() < deadline, "the provider is still serving"
            time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        for conn in self._open:  # a kept-alive connection's thread waits for a next request
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=5)


@contextmanager
def provider(behaviour: Callable[[Provider, socket.socket], None],
             wrap: ssl.SSLContext | None = None) -> Iterator[Provider]:
    server = Provider(behaviour, wrap)
    try:
        yield server
    finally:
        server.close()


def keep_alive(server: Provider, conn: socket.socket) -> None:
    while server.read_request(conn) is not None:
        conn.sendall(OK)


def post(url: str, timeout: float = 2.0) -> transport.Response:
    return transport.request("POST", f"{url}/v1/effects/refund", body=b'{"a":1}',
                             headers={"Content-Type": "application/json"}, timeout=timeout,
                             connect_timeout=timeout)


def outcome_of(call: Callable[[], object]) -> object:
    try:
        call()
    except transport.TransportError as exc:
        return classify_transport_error(exc)
    raise AssertionError("no transport error")


def test_a_refused_connection_is_not_sent():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    outcome = outcome_of(lambda: post(f"http://127.0.0.1:{port}"))
    assert outcome == NotSent(error_class="transport.ConnectError")


def test_no_answer_after_the_request_left_is_unknown_timeout_after_send():
    def silent(server: Provider, conn: socket.socket) -> None:
        server.read_request(conn)
        conn.recv(1)  # until the client gives up

    with provider(silent) as server:
        outcome = outcome_of(lambda: post(server.url, timeout=0.3))
    assert outcome == Unknown(error_class="transport.ReadTimeout",
                              reason=UnknownReason.TIMEOUT_AFTER_SEND)
    assert len(server.requests) == 1  # it did arrive: exactly why it is not NotSent


def test_a_connection_closed_after_the_request_arrived_is_unknown_connection_reset():
    def hang_up(server: Provider, conn: socket.socket) -> None:
        server.read_request(conn)

    with provider(hang_up) as server:
        outcome = outcome_of(lambda: post(server.url))
    assert outcome == Unknown(error_class="transport.RemoteProtocolError",
                              reason=UnknownReason.CONNECTION_RESET)
    assert len(server.requests) == 1


def test_an_answer_cut_short_is_unknown():
    def truncated(server: Provider, conn: socket.socket) -> None:
        server.read_request(conn)
        conn.sendall(OK[:-5])

    with provider(truncated) as server:
        outcome = outcome_of(lambda: post(server.url))
    assert isinstance(outcome, Unknown) and outcome.error_class == "transport.RemoteProtocolError"


def test_a_chunked_answer_cut_short_is_unknown():
    def truncated(server: Provider, conn: socket.socket) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"18\r\n" + BODY[:10])

    with provider(truncated) as server:
        outcome = outcome_of(lambda: post(server.url))
    assert isinstance(outcome, Unknown) and outcome.error_class == "transport.RemoteProtocolError"


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_a_body_over_the_limit_is_unknown(monkeypatch, framing):
    monkeypatch.setattr(transport, "MAX_BODY_BYTES", 10)

    def chunked(server: Provider, conn: socket.socket) -> None:
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY))

    with provider(keep_alive if framing == "length" else chunked) as server:
        outcome = outcome_of(lambda: post(server.url))
    assert isinstance(outcome, Unknown) and outcome.error_class == "transport.RemoteProtocolError"


def test_a_chunked_answer_is_read_whole():
    def chunked(server: Provider, conn: socket.socket) -> None:
        while server.read_request(conn) is not None:
            conn.sendall(b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"5\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n"
                         % (BODY[:5], len(BODY) - 5, BODY[5:]))

    with provider(chunked) as server:
        answers = [post(server.url) for _ in range(2)]
    assert [a.json() for a in answers] == [{"id": "eff_1", "ok": 1}] * 2
    assert server.connections == 1


def test_kept_alive_connections_are_reused():
    with provider(keep_alive) as server:
        answers = [post(server.url) for _ in range(3)]
    assert [a.status_code for a in answers] == [201, 201, 201]
    assert answers[0].json() == {"id": "eff_1", "ok": 1}
    assert server.connections == 1 and len(server.requests) == 3


def test_an_answer_with_connection_close_is_not_reused():
    def closing(server: Provider, conn: socket.socket) -> None:
        server.read_request(conn)
        conn.sendall(OK_CLOSE)

    with provider(closing) as server:
        answers = [post(server.url) for _ in range(2)]
    assert [a.status_code for a in answers] == [201, 201]
    assert server.connections == 2


def test_a_connection_the_provider_closed_while_idle_is_replaced_not_an_unknown_outcome():
    # Keep-alive timeout on the provider's side: it answers one request and then hangs up.
    def one_then_idle_close(server: Provider, conn: socket.socket) -> None:
        server.read_request(conn)
        conn.sendall(OK)

    with provider(one_then_idle_close) as server:
        first = post(server.url)
        server.wait_until_served(1)  # the provider has closed its side
        second = post(server.url)
    assert (first.status_code, second.status_code) == (201, 201)
    assert server.connections == 2 and len(server.requests) == 2


def test_tls_against_a_plain_http_server_is_not_sent():
    def plain(server: Provider, conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    with provider(plain) as server:
        url = server.url.replace("http://", "https://")
        outcome = outcome_of(lambda: post(url))
    assert outcome == NotSent(error_class="transport.ConnectError")


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True)
    return cert, key


def serving_context(cert: Path, key: Path) -> ssl.SSLContext:
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(cert, key)
    return served


def test_an_untrusted_certificate_is_refused_before_anything_is_sent(certificate):
    cert, key = certificate
    served = serving_context(cert, key)
    with provider(keep_alive, wrap=served) as server:
        outcome = outcome_of(lambda: post(server.url))
    assert outcome == NotSent(error_class="transport.ConnectError")
    assert server.requests == []


def test_a_trusted_certificate_carries_the_request(certificate, monkeypatch):
    cert, key = certificate
    served = serving_context(cert, key)
    trusting = ssl.create_default_context(cafile=str(cert))
    monkeypatch.setattr(transport, "_tls_context", lambda: trusting)
    with provider(keep_alive, wrap=served) as server:
        answers = [post(server.url) for _ in range(2)]
    assert [a.status_code for a in answers] == [201, 201]
    assert server.connections == 1


def test_the_connector_sends_through_an_environment_proxy(agent, monkeypatch):
    """HTTP_PROXY applies: the request goes to the proxy (absolute-form target), via httpx."""
    tool = get_tool("refund")
    connector = tool.adapter

    def proxy(server: Provider, conn: socket.socket) -> None:
        while server.read_request(conn) is not None:
            conn.sendall(OK)

    with provider(proxy) as server:
        monkeypatch.setenv("HTTP_PROXY", server.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.setattr(connector, "_clients", {})
        operation = in_state(agent, "in_flight")
        outcome = connector.send(operation, key=operation.idempotency_key, timeout=2.0)
    assert isinstance(outcome, Confirmed) and outcome.provider_request_id == "eff_1"
    request_line = server.requests[0].split(b"\r\n")[0]
    assert request_line.startswith(b"POST http://") and request_line.endswith(
        b"/v1/effects/refund HTTP/1.1")
    assert isinstance(next(iter(connector._clients.values())), httpx.Client)


def test_the_connector_goes_direct_when_no_proxy_applies(agent, sandbox, monkeypatch):
    tool = get_tool("refund")
    connector = tool.adapter
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # would refuse: never used
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setattr(connector, "_clients", {})
    operation = in_state(agent, "in_flight")
    outcome = connector.send(operation, key=operation.idempotency_key, timeout=5.0)
    assert isinstance(outcome, Confirmed)
    assert list(connector._clients.values()) == [None]  # the lean transport


def test_the_tls_context_verifies_hostnames_and_certificates_against_a_trust_store():
    transport._tls_context.cache_clear()
    try:
        context = transport._tls_context()
        assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
        assert context.cert_store_stats()["x509_ca"] > 0
    finally:
        transport._tls_context.cache_clear()


def test_an_environment_trust_store_is_the_one_used(certificate, monkeypatch):
    """SSL_CERT_FILE names the only CA trusted: the test's own certificate is accepted."""
    cert, key = certificate
    served = serving_context(cert, key)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    monkeypatch.setenv("SSL_CERT_DIR", str(cert.parent / "none"))
    transport._tls_context.cache_clear()
    try:
        with provider(keep_alive, wrap=served) as server:
            assert post(server.url).status_code == 201
    finally:
        transport._tls_context.cache_clear()
