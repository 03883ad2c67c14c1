"""A real Agent Ledger per test session, started as bin/run does (clients/testing/live_instance.py):
the sandbox provider, a fresh SQLite ledger, the web server and a Celery worker with beat."""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "clients" / "testing"))

from agent_ledger_client import AsyncLedgerClient, LedgerClient, RetryEvent  # noqa: E402
from live_instance import LiveInstance  # noqa: E402

_counter = itertools.count(1)


@pytest.fixture(scope="session")
def ledger() -> Iterator[LiveInstance]:
    with LiveInstance(worker=True) as instance:
        yield instance


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def retries() -> list[RetryEvent]:
    return []


@pytest.fixture
def client(ledger: LiveInstance, retries: list[RetryEvent]) -> Iterator[LedgerClient]:
    with LedgerClient(ledger.url, ledger.token, on_retry=retries.append, seed=7) as c:
        yield c


@pytest.fixture
async def aclient(ledger: LiveInstance, retries: list[RetryEvent]) -> Iterator[AsyncLedgerClient]:
    async with AsyncLedgerClient(ledger.url, ledger.token, on_retry=retries.append) as c:
        yield c


@pytest.fixture
def unique() -> str:
    """A distinct business key per test (the instance lives for the whole session)."""
    return f"p{os.getpid()}-t{next(_counter)}"


def refund_params(invoice: str, *, amount: int = 2500, memo: str = "Damaged parcel") -> dict:
    return {"invoice": invoice, "amount": amount, "currency": "EUR", "payee": "cus_123",
            "memo": memo}


class LoseFirstResponse(httpx.BaseTransport):
    """The network edge: the request reaches the real ledger, which does the work, but the
    first answer to `method` never comes back (a read timeout, as after a dropped connection)."""

    def __init__(self, method: str = "POST") -> None:
        self.inner = httpx.HTTPTransport()
        self.method = method
        self.lost = 0
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        response = self.inner.handle_request(request)
        if request.method == self.method and not self.lost:
            response.read()
            self.lost += 1
            raise httpx.ReadTimeout("response lost", request=request)
        return response


class UnavailableFirst(httpx.BaseTransport):
    """A load balancer answering 503 with Retry-After to the first request, then passing on."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if len(self.requests) == 1:
            return httpx.Response(503, headers={"Retry-After": "0"}, text="upstream restarting")
        return self.inner.handle_request(request)


class CountingTransport(httpx.BaseTransport):
    """Records every request and when it started."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.times.append(time.monotonic())
        return self.inner.handle_request(request)


def free_port_url() -> str:
    """An address where nothing listens: every connection is refused."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"
