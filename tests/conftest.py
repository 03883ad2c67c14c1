"""The cast: two agents, two reviewers, a staff member without the review permission, an
outsider — and a real sandbox provider process per session."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection
from rest_framework.test import APIClient

from ledger.auth import agent_create
from ledger.models import AgentCredential
from sandbox.testing import SandboxClient, SandboxServer

ALL_TOOLS = ("refund", "send_email", "create_ticket")
# The sandbox's Stripe slice accepts any sk_test_ key; the catalogue reads it from here.
os.environ.setdefault("STRIPE_API_KEY", "sk_test_sandbox")
DEMO_TOOLS = str(django_settings.BASE_DIR / "config" / "tools.toml")
# The demo catalogue plus refund v2 on the Stripe SDK and send_email v2 over SMTP.
STRIPE_SMTP_TOOLS = str(django_settings.BASE_DIR / "config" / "tools-stripe-smtp.toml")
CATALOGUES = django_settings.BASE_DIR / "tests" / "catalogues"


def adapter_named(provider: str) -> Any:
    """The connector the loaded catalogue declares under this provider name."""
    from ledger.tools import catalogue

    for versions in catalogue().versions.values():
        for tool in versions.values():
            if tool.provider == provider:
                return tool.adapter
    raise LookupError(f"no tool of the loaded catalogue uses provider {provider!r}")


@pytest.fixture(autouse=True)
def _version_records_follow_the_test_database() -> Iterator[None]:
    """Each test's database starts without tool-version records; so does the process memo."""
    from ledger import versions

    versions.forget_recorded()
    yield
    versions.forget_recorded()


@pytest.fixture
def stripe_smtp_tools(settings: Any) -> str:
    """New refunds go through the Stripe SDK (refund v2), new e-mails over SMTP (v2)."""
    settings.LEDGER_TOOLS_FILE = STRIPE_SMTP_TOOLS
    return STRIPE_SMTP_TOOLS


def on_postgres() -> bool:
    return connection.vendor == "postgresql"


requires_postgres = pytest.mark.skipif(
    os.environ.get("DATABASE_URL", "").split(":", 1)[0] not in {"postgres", "postgresql"},
    reason="needs PostgreSQL (real row locks, SKIP LOCKED, concurrent writers)",
)


@pytest.fixture(scope="session", autouse=True)
def _celery_messages_stay_in_this_process() -> Iterator[None]:
    """Tasks enqueued by code under test go to an in-memory broker, never to the embedded
    default's var/broker folder, where a developer's running worker would pick them up. The
    real-worker test points the producer at Redis itself."""
    from config.celery import app

    saved = (app.conf.broker_url, app.conf.broker_transport_options)
    app.conf.broker_url, app.conf.broker_transport_options = "memory://", {}
    yield
    app.conf.broker_url, app.conf.broker_transport_options = saved


@pytest.fixture
def frozen(time_machine: Any) -> Any:
    """The clock stopped at now; tests move it with frozen.shift() or frozen.move_to()."""
    from django.utils import timezone

    time_machine.move_to(timezone.now(), tick=False)
    return time_machine


@pytest.fixture(scope="session")
def sandbox_server() -> Iterator[SandboxServer]:
    with SandboxServer(env={"SANDBOX_TIMEOUT_SLEEP_SECONDS": "2"}, smtp=True) as server:
        yield server


@pytest.fixture
def sandbox(sandbox_server: SandboxServer, settings: Any) -> Iterator[SandboxClient]:
    """The provider, wiped, with the ledger pointed at it and a short request timeout."""
    settings.SANDBOX_URL = sandbox_server.url
    settings.SANDBOX_SMTP_PORT = sandbox_server.smtp_port
    settings.LEDGER_PROVIDER_TIMEOUT_SECONDS = 1.0
    with SandboxClient(sandbox_server.url) as client:
        client.reset()
        yield client


@pytest.fixture
def refused_provider(settings: Any) -> str:
    """A provider address where nothing listens: connections are refused, nothing is sent."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.SANDBOX_URL = f"http://127.0.0.1:{port}"
    return settings.SANDBOX_URL


@pytest.fixture
def make_agent(db: None) -> Callable[..., tuple[AgentCredential, str]]:
    def make(name: str = "agent-1", tools: tuple[str, ...] = ALL_TOOLS) -> tuple[
        AgentCredential, str
    ]:
        return agent_create(name=name, tools=tools)

    return make


@pytest.fixture
def agent_and_token(make_agent: Callable[..., tuple[AgentCredential, str]]) -> tuple[
    AgentCredential, str
]:
    return make_agent("agent-1")


@pytest.fixture
def agent(agent_and_token: tuple[AgentCredential, str]) -> AgentCredential:
    return agent_and_token[0]


@pytest.fixture
def api(agent_and_token: tuple[AgentCredential, str]) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent_and_token[1]}")
    return client


@pytest.fixture
def second_agent_api(make_agent: Callable[..., tuple[AgentCredential, str]]) -> APIClient:
    _, token = make_agent("agent-2")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _staff(django_user_model: Any, username: str, *, review: bool) -> Any:
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user(
        username=username, password="correct horse battery staple", is_staff=True
    )
    if review:
        user.user_permissions.add(Permission.objects.get(codename="review_case"))
    return user


@pytest.fixture
def reviewer(db: None, django_user_model: Any) -> Any:
    return _staff(django_user_model, "reviewer-ann", review=True)


@pytest.fixture
def second_reviewer(db: None, django_user_model: Any) -> Any:
    return _staff(django_user_model, "reviewer-bob", review=True)


@pytest.fixture
def staff_without_review(db: None, django_user_model: Any) -> Any:
    return _staff(django_user_model, "staff-carol", review=False)


@pytest.fixture
def outsider(db: None, django_user_model: Any) -> Any:
    return django_user_model.objects.create_user(username="outsider-dave", password="pw-12345678")


def refund_params(**overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "invoice": "invoice-17",
        "amount": 2500,
        "currency": "EUR",
        "payee": "cus_123",
        "memo": "Refund for the damaged parcel",
    }
    params.update(overrides)
    return params


def submit_body(operation_id: str = "wf-81:invoice-17:refund-1:v1", **overrides: Any) -> dict[
    str, Any
]:
    body: dict[str, Any] = {
        "operation_id": operation_id,
        "tool": "refund",
        "params": refund_params(),
        "run_id": "run-81",
        "tool_call_id": "call_abc",
    }
    body.update(overrides)
    return body


@pytest.fixture(autouse=True)
def _tally_flushed_only_when_asked(settings: Any) -> Iterator[None]:
    """Replays and conflicts are counted in memory and flushed every few seconds at the end of
    a request; in tests that would add a statement to whichever request happened to be due,
    so they flush only when a test calls ledger.tally.flush()."""
    from ledger import tally

    settings.LEDGER_TALLY_FLUSH_SECONDS = 0
    tally.discard()
    yield
    tally.discard()
