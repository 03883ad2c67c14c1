"""A real sandbox process per test module, wiped before each test. No Django involved."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from sandbox.testing import SandboxClient, SandboxServer

PostEffect = Callable[..., httpx.Response]


@pytest.fixture(scope="module")
def sandbox_server() -> Iterator[SandboxServer]:
    with SandboxServer() as server:
        yield server


@pytest.fixture
def sandbox(sandbox_server: SandboxServer) -> Iterator[SandboxClient]:
    with SandboxClient(sandbox_server.url) as client:
        client.reset()
        # Faults that sleep must not make the suite slow.
        client.configure(timeout_sleep_seconds=0.5)
        yield client


@pytest.fixture
def http(sandbox_server: SandboxServer, sandbox: SandboxClient) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sandbox_server.url, timeout=5.0) as client:
        yield client


@pytest.fixture
def post_effect(http: httpx.Client) -> PostEffect:
    def post(
        reference: str,
        params: dict[str, Any] | None = None,
        *,
        key: str | None = None,
        kind: str = "refund",
        timeout: float | None = None,
    ) -> httpx.Response:
        headers = {} if key is None else {"Idempotency-Key": key}
        body = {"reference": reference, "params": params if params is not None else {"amount": 1}}
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        return http.post(f"/v1/effects/{kind}", json=body, headers=headers, **extra)

    return post
